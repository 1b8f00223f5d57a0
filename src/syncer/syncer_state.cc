// Syncer state transitions; see syncer_state.h. Steps in comments follow docs/protocol.md §4.
#include "syncer/syncer_event.h"
#include "syncer/syncer_state.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/check.h"
#include "core/hash.h"
#include "core/json_read.h"
#include "core/lr_schedule.h"

namespace dloco {

using syncer_detail::event;

const char* to_string(RoundPhase phase) {
  static constexpr const char* kNames[] = {"due", "pulling", "closed"};  // in the enum's order
  return static_cast<size_t>(phase) < std::size(kNames) ? kNames[static_cast<size_t>(phase)] : "?";  // -1 wraps
}

const char* to_string(RefusalKind kind) {
  switch (kind) {
    case RefusalKind::kMalformed: return "malformed";
    case RefusalKind::kCounters: return "counters";
    case RefusalKind::kStale: return "stale";
    case RefusalKind::kNorm: return "norm";
  }
  return "?";
}

const char* to_string(SyncerPhase phase) {
  static constexpr const char* kNames[] = {"training", "flushing", "finished"};  // in the enum's order
  return static_cast<size_t>(phase) < std::size(kNames) ? kNames[static_cast<size_t>(phase)] : "?";  // -1 wraps
}

SyncerState::SyncerState(const Config& config, FragmentLayout layout, std::vector<std::vector<float>> theta,
                         std::function<bool(const std::string&)> is_embedding)
    : config_(config),
      quorum_{static_cast<int>(config.diloco.quorum), config.diloco.grace_window, config.diloco.gamma,
              static_cast<double>(config.diloco.overlap), LeaseConfig{}},
      schedule_(make_schedule(config)),
      layout_(std::move(layout)),
      is_embedding_(std::move(is_embedding)) {
  config_.validate();
  if (theta.size() != layout_.fragments.size()) {
    throw InputError("syncer: " + std::to_string(theta.size()) + " fragment buffers for a layout of " +
                     std::to_string(layout_.fragments.size()) + " fragments");
  }
  fragments_.resize(theta.size());
  for (size_t p = 0; p < theta.size(); ++p) {
    if (static_cast<int64_t>(theta[p].size()) != layout_.fragments[p].numel) {
      throw InputError("syncer: fragment " + std::to_string(p) + " buffer has " + std::to_string(theta[p].size()) +
                       " values, the layout says " + std::to_string(layout_.fragments[p].numel));
    }
    fragments_[p].momentum.assign(theta[p].size(), 0.0f);
    fragments_[p].anchors.emplace_back(0, theta[p]);
    fragments_[p].theta = std::move(theta[p]);
  }
  flushed_.assign(fragments_.size(), false);
}

std::vector<int64_t> SyncerState::versions() const {
  std::vector<int64_t> v;
  for (const auto& f : fragments_) v.push_back(f.version);
  return v;
}

bool SyncerState::every_stream_started() const {
  const int64_t S = config_.data.streams > 0 ? config_.data.streams : config_.diloco.learners;
  for (int64_t stream = 0; stream < S; ++stream) {
    const auto it = stream_tokens_.find(stream);
    if (it == stream_tokens_.end() || it->second <= 0) return false;
  }
  return true;
}

int64_t SyncerState::tokens_trained() const {
  int64_t total = 0;
  for (const auto& [stream, tokens] : stream_tokens_) total += tokens;
  return total;
}

void SyncerState::restore_stream_tokens(int64_t stream, int64_t tokens) {
  auto& t = stream_tokens_[stream];
  t = std::max(t, tokens);
}

bool SyncerState::is_live(int learner, double now_s) const {
  auto it = learners_.find(learner);
  return it != learners_.end() && dloco::is_live(it->second.state, now_s, quorum_.lease);
}

void SyncerState::on_join(int learner, double now_s, bool fresh) {
  if (restored_ && first_join_after_restore_s_ < 0) first_join_after_restore_s_ = now_s;
  auto& rec = learners_[learner];
  rec.rewarm_until = fresh && global_step_ > 0 && config_.train.warmup_steps > 0
                         ? global_step_ + config_.train.warmup_steps
                         : -1;
  rec.state.id = learner;
  rec.state.joined = true;
  rec.state.last_seen_s = now_s;
  rec.state.step = global_step_;  // it adopts the global step
  rec.last.finished = false;
  if (auto carried = restored_carried_.find(learner); carried != restored_carried_.end()) {
    if (!fresh) rec.carried_error = carried->second;  // the same process, its residual with it
    restored_carried_.erase(carried);
  }
}

nlohmann::json SyncerState::carried_errors_json() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [id, rec] : learners_) {
    for (const auto& [p, e] : rec.carried_error) out[std::to_string(id)][std::to_string(p)] = e;
  }
  for (const auto& [id, carried] : restored_carried_) {  // not re-joined yet: kept for the next incarnation too
    if (learners_.count(id)) continue;
    for (const auto& [p, e] : carried) out[std::to_string(id)][std::to_string(p)] = e;
  }
  return out;
}

void SyncerState::restore_carried_errors(const nlohmann::json& carried) {
  const std::string what = "state.json: carried_error";
  if (!carried.is_object()) throw InputError(what + ": expected an object");
  const int fragments = static_cast<int>(layout_.fragments.size());
  std::map<int, std::map<int, double>> out;
  for (const auto& [id_text, per_fragment] : carried.items()) {
    const int64_t id = json_integer(nlohmann::json::parse(id_text, nullptr, false), what + ": learner id");
    if (id < 0 || id >= 65536) throw InputError(what + ": learner id " + id_text + " is out of range");
    if (!per_fragment.is_object()) throw InputError(what + "." + id_text + ": expected an object");
    for (const auto& [p_text, error] : per_fragment.items()) {
      const int64_t p = json_integer(nlohmann::json::parse(p_text, nullptr, false), what + "." + id_text);
      if (p < 0 || p >= fragments) throw InputError(what + "." + id_text + ": fragment " + p_text + " out of range");
      const double e = json_number(error, what + "." + id_text + "." + p_text);
      if (e < 0) throw InputError(what + "." + id_text + "." + p_text + ": negative");
      out[static_cast<int>(id)][static_cast<int>(p)] = e;
    }
  }
  restored_carried_ = std::move(out);
}

void SyncerState::on_report(int learner, const LearnerReport& report, double now_s) {
  auto it = learners_.find(learner);
  if (it == learners_.end()) return;
  LearnerRecord& rec = it->second;
  count_lost_work(rec, report);
  rec.state.step = report.step;
  rec.state.last_seen_s = now_s;
  rec.state.step_time_s = report.step_time_s;
  // A session's empty hello (no counters: a re-opened session before its first step) keeps what the learner last
  // reported of its work — counters, loss, speed —, so the page shows no zeros and a reset is seen against them;
  // its step, stream and finished flag are as the caller set them (SyncerService::on_metadata).
  const LearnerReport before = rec.last;
  rec.last = report;
  if (report.steps.empty() && report.tokens.empty()) {
    rec.last.steps = before.steps;
    rec.last.tokens = before.tokens;
    rec.last.loss = before.loss;
    rec.last.tokens_per_s = before.tokens_per_s;
  }
  // Learners that do not name their stream (stream -1: hand-driven tests) train the stream of their id; a report
  // whose stream lease the learner does not hold (stream < -1) counts no tokens.
  if (report.stream >= -1) restore_stream_tokens(report.stream >= 0 ? report.stream : learner, report.tokens_trained);
}

void SyncerState::on_leave(int learner) {
  auto it = learners_.find(learner);
  if (it != learners_.end()) it->second.state.joined = false;
}

AnswerOutcome SyncerState::on_answer(int learner, PullAnswerData answer, double now_s, std::string* reason) {
  (void)now_s;
  const int fragment = answer.fragment;
  const int64_t round_step = answer.round_step;
  auto refuse_as = [&](RefusalKind kind, const std::string& why) {
    refuse(learner, fragment, round_step, kind);
    if (reason) *reason = why;
    return AnswerOutcome::kRefused;
  };
  auto drop = [&](const std::string& why) {
    ++answers_dropped_;
    if (reason) *reason = why;
    return AnswerOutcome::kDroppedLate;
  };
  const int P = static_cast<int>(fragments_.size());
  const std::string fp = "fragment " + std::to_string(fragment);
  if (fragment < 0 || fragment >= P) {
    return refuse_as(RefusalKind::kMalformed, fp + " does not exist (P = " + std::to_string(P) + ")");
  }
  const auto& frag = fragments_[fragment];
  if (answer.delta.size() != frag.theta.size()) {
    return refuse_as(RefusalKind::kMalformed, fp + " answer has " + std::to_string(answer.delta.size()) +
                                                  " values, expected " + std::to_string(frag.theta.size()));
  }
  if (!std::all_of(answer.delta.begin(), answer.delta.end(), [](float x) { return std::isfinite(x); })) {
    return refuse_as(RefusalKind::kMalformed, fp + " answer holds non-finite values");
  }
  // Counters (§10): what the learner can have trained since its last merge of p.
  if (answer.steps < 0 || answer.tokens < 0 || answer.captured_step < 0) {
    return refuse_as(RefusalKind::kCounters, "negative step or token counters");
  }
  if (answer.captured_step > max_learner_step()) {
    return refuse_as(RefusalKind::kCounters, "captured at step " + std::to_string(answer.captured_step) +
                                                 ", beyond any step of this run");
  }
  const int64_t tps = config_.train.tokens_per_step(config_.model);
  if (answer.steps > max_learner_step() || answer.tokens > answer.steps * tps) {
    return refuse_as(RefusalKind::kCounters, "claims " + std::to_string(answer.tokens) + " tokens in " +
                                                 std::to_string(answer.steps) + " steps: at most " +
                                                 std::to_string(tps) + " tokens a step (B·T·grad_accum)");
  }
  const int64_t slack = config_.diloco.overlap + 1;
  if (auto rec = learners_.find(learner); rec != learners_.end()) {
    if (answer.captured_step > rec->second.state.step + slack) {
      return refuse_as(RefusalKind::kCounters, "captured at step " + std::to_string(answer.captured_step) +
                                                   ", ahead of its reported step " +
                                                   std::to_string(rec->second.state.step));
    }
  }
  // Its steps since p was last applied are at most its step count (which only ever moves up by steps trained, or to
  // the global step at a join). Nothing tighter holds: a merge can be lost on the way, and the count goes on.
  if (answer.steps > answer.captured_step + slack) {
    return refuse_as(RefusalKind::kCounters, "claims " + std::to_string(answer.steps) + " steps on " + fp +
                                                 " since its last merge, more than its step count at the capture (" +
                                                 std::to_string(answer.captured_step) + ")");
  }
  auto it = open_.find(fragment);
  if (it == open_.end() || !it->second.phase.is(RoundPhase::kPulling) || it->second.step != round_step) {
    return drop("late answer for " + fp + " round " + std::to_string(round_step) + ": that round is closed");
  }
  Round& round = it->second;
  if (std::find(round.requested.begin(), round.requested.end(), learner) == round.requested.end() ||
      round.answers.count(learner)) {
    return drop("learner " + std::to_string(learner) + " was not asked, or already answered, in this round");
  }
  if (answer.base_version >= 0) {  // a delta: its base must still be known (stale anchors, docs/protocol.md §4)
    const bool known = std::any_of(frag.anchors.begin(), frag.anchors.end(),
                                   [&](const auto& a) { return a.first == answer.base_version; });
    if (!known) {
      return refuse_as(RefusalKind::kStale, "stale anchor: delta against version " +
                                                std::to_string(answer.base_version) + " of " + fp +
                                                ", the syncer keeps versions " +
                                                std::to_string(frag.anchors.front().first) + ".." +
                                                std::to_string(frag.anchors.back().first));
    }
  }
  // A well-formed answer after a refused one (in the same round) is taken: the refusal only ended the wait.
  round.refused.erase(std::remove(round.refused.begin(), round.refused.end(), learner), round.refused.end());
  round.answers.emplace(learner, std::move(answer));
  return AnswerOutcome::kAccepted;
}

void SyncerState::refuse_undecodable(int learner, int fragment, int64_t round_step) {
  refuse(learner, fragment, round_step, RefusalKind::kMalformed);
}

void SyncerState::refuse(int learner, int fragment, int64_t round_step, RefusalKind kind, bool solicited) {
  ++answers_refused_;
  ++refused_by_kind_[kind];
  auto it = open_.find(fragment);
  if (!solicited && it != open_.end() && it->second.phase.is(RoundPhase::kPulling) && it->second.step == round_step) {
    Round& round = it->second;
    if (std::find(round.requested.begin(), round.requested.end(), learner) != round.requested.end() &&
        !round.answers.count(learner) &&
        std::find(round.refused.begin(), round.refused.end(), learner) == round.refused.end()) {
      round.refused.push_back(learner);  // the round waits for it no longer
      solicited = true;
    }
  }
  // A learner whose answers to pulls of p were refused refetch_after times in a row may hold parameters of p that
  // went bad (a bit flip, a diverged optimizer): it is told to take Θ_p whole (§10). Only answers to a pull it was
  // sent count, at most one per round, so unsolicited junk cannot make the syncer send Θ_p at every tick. The
  // count restarts, so a learner that stays bad is told again every refetch_after refusals, not at every one.
  auto rec = learners_.find(learner);
  if (rec == learners_.end()) return;
  rec->second.carried_error.erase(fragment);  // its residual may be anything now: no allowance for the next one
  if (!solicited || config_.diloco.refetch_after <= 0) return;
  int& in_a_row = rec->second.refused_in_a_row[fragment];
  if (++in_a_row < config_.diloco.refetch_after) return;
  in_a_row = 0;
  const SyncerActions::Refetch due{learner, fragment};
  if (std::find(refetch_due_.begin(), refetch_due_.end(), due) == refetch_due_.end()) refetch_due_.push_back(due);
}

std::map<std::string, int64_t> SyncerState::answers_refused_by_kind() const {
  std::map<std::string, int64_t> out;
  for (RefusalKind k : {RefusalKind::kMalformed, RefusalKind::kCounters, RefusalKind::kStale, RefusalKind::kNorm}) {
    const auto it = refused_by_kind_.find(k);
    out[to_string(k)] = it == refused_by_kind_.end() ? 0 : it->second;
  }
  return out;
}

int64_t SyncerState::max_learner_step() const {
  const int64_t tps = config_.train.tokens_per_step(config_.model);
  return 3 * ((config_.train.total_tokens + tps - 1) / tps) + config_.diloco.inner_steps + config_.diloco.overlap;
}

std::string SyncerState::screen_report(const LearnerReport& r) const {
  const int64_t tps = config_.train.tokens_per_step(config_.model);
  if (r.step < 0 || r.step > max_learner_step()) {
    return "step " + std::to_string(r.step) + " is outside [0, " + std::to_string(max_learner_step()) +
           "] (3 × the run's steps of train.total_tokens, + H + τ)";
  }
  if (r.tokens_trained < 0 || r.tokens_trained > 2 * config_.train.total_tokens) {
    return "tokens_trained " + std::to_string(r.tokens_trained) + " is outside [0, 2 × train.total_tokens]";
  }
  if (!r.steps.empty() && r.steps.size() != fragments_.size()) return "per-fragment step counters of the wrong size";
  if (!r.tokens.empty() && r.tokens.size() != r.steps.size()) return "per-fragment token counters of the wrong size";
  for (size_t p = 0; p < r.tokens.size(); ++p) {
    if (r.steps[p] < 0 || r.tokens[p] < 0 || r.steps[p] > max_learner_step() || r.tokens[p] > r.steps[p] * tps) {
      return "fragment " + std::to_string(p) + ": " + std::to_string(r.tokens[p]) + " tokens in " +
             std::to_string(r.steps[p]) + " steps is impossible (at most " + std::to_string(tps) + " a step)";
    }
  }
  if (!std::isfinite(r.step_time_s) || r.step_time_s < 0 || r.step_time_s > 3600) {
    return "step_time_s " + std::to_string(r.step_time_s) + " is outside [0, 3600] s";
  }
  if (!std::isfinite(r.tokens_per_s) || r.tokens_per_s < 0) return "tokens_per_s is negative or not finite";
  return "";
}

std::vector<LearnerState> SyncerState::learner_states() const {
  std::vector<LearnerState> out;
  for (const auto& [id, rec] : learners_) out.push_back(rec.state);
  return out;
}

double SyncerState::slowest_step_s(double now_s) const {
  double slowest = 0;
  for (const auto& [id, rec] : learners_) {
    if (is_live(id, now_s)) slowest = std::max(slowest, rec.state.step_time_s);
  }
  return slowest;
}

void SyncerState::restore_fragment(int p, std::vector<float> theta, std::vector<float> momentum, int64_t version) {
  DLOCO_CHECK(p >= 0 && p < static_cast<int>(fragments_.size()));
  if (theta.size() != fragments_[p].theta.size() || momentum.size() != theta.size()) {
    throw InputError("persisted fragment " + std::to_string(p) + " has the wrong size for this layout");
  }
  auto& f = fragments_[p];
  f.theta = std::move(theta);
  f.momentum = std::move(momentum);
  f.version = version;
  f.anchors.clear();
  f.anchors.emplace_back(version, f.theta);
  restored_ = true;
}

void SyncerState::restore_clock(int64_t global_step) {
  global_step_ = std::max(global_step_, global_step);
  restored_ = true;
}

void SyncerState::restore_finished() {
  if (phase_.is(SyncerPhase::kTraining)) phase_.to(SyncerPhase::kFlushing);
  if (phase_.is(SyncerPhase::kFlushing)) phase_.to(SyncerPhase::kFinished);
  pending_.clear();
  open_.clear();
  std::fill(flushed_.begin(), flushed_.end(), true);
}

bool SyncerState::awaiting_reattach(double now_s) const {
  // The window opens when the first learner is back (on --resume the learners start after the syncer, and their
  // start-up must not use it up) and lasts one lease.
  if (!restored_ || first_join_after_restore_s_ < 0 ||
      now_s >= first_join_after_restore_s_ + quorum_.lease.min_lease_s) {
    return false;
  }
  for (const auto& [s, tokens] : stream_tokens_) {
    if (tokens <= 0) continue;
    const int64_t stream = s;  // a plain variable: clang 14 cannot capture a structured binding
    const bool held = std::any_of(learners_.begin(), learners_.end(), [&](const auto& entry) {
      const auto& [id, rec] = entry;
      const int64_t trains = rec.last.stream >= 0 ? rec.last.stream : rec.last.stream == -1 ? id : -2;
      return trains == stream && is_live(id, now_s);
    });
    if (!held) return true;
  }
  return false;
}

}  // namespace dloco
