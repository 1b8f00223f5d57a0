// Syncer state transitions; see syncer_state.h. Steps in comments follow docs/protocol.md §4.
#include "syncer/syncer_state.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/check.h"
#include "core/hash.h"
#include "core/schedule.h"

namespace dloco {

namespace {

nlohmann::json event(const char* name, nlohmann::json fields) {
  fields["event"] = name;
  return fields;
}

}  // namespace

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
}

void SyncerState::on_report(int learner, const LearnerReport& report, double now_s) {
  auto it = learners_.find(learner);
  if (it == learners_.end()) return;
  it->second.state.step = report.step;
  it->second.state.last_seen_s = now_s;
  it->second.state.step_time_s = report.step_time_s;
  it->second.last = report;
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

SyncerActions SyncerState::tick(double now_s) {
  SyncerActions actions;
  if (phase_.is(SyncerPhase::kFinished)) return actions;
  const QuorumConfig& qcfg = quorum_;

  // 0) liveness transitions are logged once, with the reason.
  for (auto& [id, rec] : learners_) {
    const bool live = is_live(id, now_s);
    if (live != rec.was_live) {
      actions.events.push_back(event(live ? "learner_live" : "learner_absent",
                                     {{"learner", id},
                                      {"reason", live ? "metadata arriving" :
                                                        "no metadata for " +
                                                            std::to_string(now_s - rec.state.last_seen_s) +
                                                            " s (lease " + std::to_string(lease_s(rec.state, qcfg.lease)) +
                                                            " s)"}}));
      rec.was_live = live;
    }
  }

  // 1) the global clock: t = max(t, K-th largest live step); every due step crossed is queued in order.
  const auto states = learner_states();
  if (phase_.is(SyncerPhase::kTraining)) {
    const ClockDecision clock = advance_global_clock(global_step_, states, now_s, qcfg.K, qcfg.lease);
    if (clock.advanced) {
      for (const auto& r : due_rounds_crossed(global_step_, clock.global_step, static_cast<int>(config_.diloco.inner_steps),
                                              static_cast<int>(fragments_.size()))) {
        pending_.push_back(r);
      }
      global_step_ = clock.global_step;
      actions.clock_moved = true;
    }
  }

  // 2) the end: every live learner spent its budget -> flush every fragment once more (docs/protocol.md §4).
  int live = 0, live_finished = 0;
  for (const auto& [id, rec] : learners_) {
    if (is_live(id, now_s)) {
      ++live;
      live_finished += rec.last.finished ? 1 : 0;
    }
  }
  // With fixed shares (no train.shared_budget) the end also waits until every stream has trained: a learner slow
  // to start is neither live nor finished, and ending without it would drop its whole share.
  if (phase_.is(SyncerPhase::kTraining) && live > 0 && live == live_finished &&
      (config_.train.shared_budget || every_stream_started()) && !awaiting_reattach(now_s)) {
    phase_.to(SyncerPhase::kFlushing);
    pending_.clear();
    for (auto it = open_.begin(); it != open_.end();) {
      it = it->second.phase.is(RoundPhase::kPulling) ? std::next(it) : open_.erase(it);
    }
    actions.events.push_back(event("final_flush", {{"reason", "all " + std::to_string(live) +
                                                                  " live learners spent their token budget"}}));
  }

  open_rounds(now_s, actions);
  for (auto it = open_.begin(); it != open_.end();) {
    advance_round(it->first, it->second, now_s, actions);
    it = it->second.phase.is(RoundPhase::kClosed) ? open_.erase(it) : std::next(it);
  }
  if (phase_.is(SyncerPhase::kFlushing) && open_.empty() &&
      std::all_of(flushed_.begin(), flushed_.end(), [](bool f) { return f; })) {
    phase_.to(SyncerPhase::kFinished);
    actions.finished_now = true;
    actions.events.push_back(event("finished", {{"global_step", global_step_}, {"merges", merges_}}));
  }
  // Last, so that refusals made by this tick's merges (norm screening) are told at once.
  for (const auto& due : refetch_due_) {
    actions.refetch.push_back(due);
    ++refetches_;
    if (auto rec = learners_.find(due.learner); rec != learners_.end()) rec->second.carried_error.erase(due.fragment);
    actions.events.push_back(event("refetch_told", {{"learner", due.learner}, {"fragment", due.fragment},
                                                    {"refused_in_a_row", config_.diloco.refetch_after},
                                                    {"reason", "its answers to pulls of this fragment were refused " +
                                                                   std::to_string(config_.diloco.refetch_after) +
                                                                   " times in a row (diloco.refetch_after): Θ_p goes "
                                                                   "to it whole, to replace its parameters"}}));
  }
  refetch_due_.clear();
  return actions;
}

void SyncerState::open_rounds(double now_s, SyncerActions& actions) {
  if (phase_.is(SyncerPhase::kFlushing)) {
    for (int p = 0; p < static_cast<int>(fragments_.size()); ++p) {
      if (!flushed_[p] && !open_.count(p)) {
        Round r;
        r.step = -1;  // the final flush round
        r.decision_state = RoundState{p, -1, now_s, now_s};
        open_.emplace(p, std::move(r));
      }
    }
    return;
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (open_.count(it->fragment)) {
      ++it;
      continue;
    }
    Round r;
    r.step = it->step;
    r.decision_state = RoundState{it->fragment, it->step, now_s, -1.0};
    actions.events.push_back(event("round_due", {{"fragment", it->fragment}, {"round", it->step}}));
    open_.emplace(it->fragment, std::move(r));
    it = pending_.erase(it);
  }
}

void SyncerState::advance_round(int p, Round& round, double now_s, SyncerActions& actions) {
  const QuorumConfig& qcfg = quorum_;
  if (round.phase.is(RoundPhase::kDue)) {
    std::vector<int> participants;
    std::string reason;
    if (round.step == -1) {  // final flush: every live learner
      for (const auto& [id, rec] : learners_) {
        if (is_live(id, now_s)) participants.push_back(id);
      }
      reason = "final flush of fragment " + std::to_string(p);
      if (participants.empty()) {
        flushed_[p] = true;
        round.phase.to(RoundPhase::kClosed);
        return;
      }
    } else {
      const auto states = learner_states();
      Timings timings{quorum_ema_.value(), sync_ema_.value()};
      // 1) quorum, 2) grace window: a pure decision with its reason.
      const MergeDecision d = decide_merge(round.decision_state, states, now_s, qcfg, timings);
      if (static_cast<int>(d.participants.size()) >= qcfg.K && round.decision_state.quorum_since_s < 0) {
        round.decision_state.quorum_since_s = now_s;
        quorum_ema_.update(now_s - round.decision_state.due_since_s);
        actions.events.push_back(event("quorum_reached", {{"fragment", p}, {"round", round.step},
                                                          {"participants", d.participants}, {"reason", d.reason}}));
      }
      if (d.action != MergeAction::kPullNow) return;
      if (round.decision_state.quorum_since_s >= 0) grace_wait_s_ += now_s - round.decision_state.quorum_since_s;
      participants = d.participants;
      reason = d.reason;
    }
    // 3) pull from the set.
    round.phase.to(RoundPhase::kPulling);
    round.pull_sent_s = now_s;
    round.requested = participants;
    actions.pulls.push_back({p, round.step, participants});
    actions.events.push_back(event("pull", {{"fragment", p}, {"round", round.step}, {"learners", participants},
                                            {"reason", reason}}));
    return;
  }
  // Answers: wait for every requested learner that is still live, until the answer window closes.
  bool waiting = false;
  for (int id : round.requested) {
    const bool refused = std::find(round.refused.begin(), round.refused.end(), id) != round.refused.end();
    if (!round.answers.count(id) && !refused && is_live(id, now_s)) waiting = true;
  }
  const double window_s =
      std::max(2.0, (static_cast<double>(config_.diloco.overlap) + 2.0) * slowest_step_s(now_s));
  if (waiting && now_s - round.pull_sent_s < window_s) return;
  if (waiting) {
    std::vector<int> missing;
    for (int id : round.requested) {
      if (!round.answers.count(id) && std::find(round.refused.begin(), round.refused.end(), id) == round.refused.end()) {
        missing.push_back(id);
      }
    }
    actions.events.push_back(event("answer_window_closed",
                                   {{"fragment", p}, {"round", round.step}, {"missing", missing},
                                    {"reason", "no answer within " + std::to_string(window_s) + " s"}}));
  }
  merge_round(p, round, now_s, actions);
  if (round.step == -1) flushed_[p] = true;
  round.phase.to(RoundPhase::kClosed);
}

namespace {

// The lower median (the smaller middle value of an even count): one large outlier among two values cannot raise it.
double lower_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[(v.size() - 1) / 2];
}

bool all_finite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}

}  // namespace

void SyncerState::merge_round(int p, Round& round, double now_s, SyncerActions& actions) {
  FragmentState& frag = fragments_[p];
  const size_t n = frag.theta.size();
  std::vector<int> ids;
  std::vector<std::vector<float>> grads;
  std::vector<double> weights, per_step;
  std::vector<double> reference;  // per step, without the error-feedback allowance: what others are compared with
  std::vector<double> codec_error;
  std::vector<bool> raw;  // a raw θ (re-anchor): its Δ also carries merges it missed
  std::vector<int64_t> tokens, steps;
  for (auto& [id, a] : round.answers) {
    // The size screened (5b) is the learner's own Δ against its base: an honest answer against the version before
    // (its merge came after s + τ, with the next pull) rebased onto Θ_p also carries the syncer's last outer step,
    // and was refused at ratios of 10–916 (found by the Python learner's test). A raw θ has no own Δ: its rebased one.
    const double sent_norm = a.base_version >= 0 ? l2_norm(a.delta) : -1;
    double own_norm = sent_norm;
    // A learner re-warming its lr after joining (core/schedule.h) answers well below the others per unit of the
    // run's lr; in the reference it would lower the median the others are screened against.
    bool rewarming = false;
    // With error feedback a payload carries x = Δ + e_prev, what the codec dropped from this learner's last answer of
    // p: ‖Δ‖ ≥ ‖x̂‖ − ‖e_prev‖ − ‖e_now‖. A short answer after a long one (a learner that trained alone while the
    // quorum waited) carried the long one's residual and was refused at 13–25× (found by the Python learner's test,
    // C++ learner, q4 + error feedback). The allowance is e_prev's bound only, and only from an answer this syncer
    // merged (it passed the screen itself): an attacker can then gain at most 1/(1 − c) over the screen, c = e / ‖x̂‖
    // ≤ √B / (2·q_max) for the run's codec (2.3× for q4/64, 1.07× for q8/256; other codecs and blocks are refused).
    if (auto rec = learners_.find(id); rec != learners_.end()) {
      rewarming = a.captured_step - a.steps < rec->second.rewarm_until;
      if (own_norm >= 0 && config_.diloco.error_feedback) {
        const auto carried = rec->second.carried_error.find(p);
        if (carried != rec->second.carried_error.end()) own_norm = std::max(0.0, own_norm - carried->second);
      }
    }
    // 4) outer gradient anchored at the current Θ_p: Δ = Θ_p − θ_m with θ_m = Θ_p^base − delta (or raw θ_m).
    std::vector<float> g(n);
    if (a.base_version == frag.version) {
      g = std::move(a.delta);
    } else {
      const std::vector<float>* base = nullptr;
      for (const auto& anchor : frag.anchors) {
        if (anchor.first == a.base_version) base = &anchor.second;
      }
      std::vector<float> local(n);
      for (size_t i = 0; i < n; ++i) local[i] = base ? (*base)[i] - a.delta[i] : a.delta[i];  // raw when base < 0
      outer_gradient(frag.theta, local, g);
    }
    // 5) weights: tokens² / steps ("quantity × quality"), or uniform over learners that trained.
    const double w = config_.diloco.weights == WeightRule::kTokens ? token_weight(a.tokens, a.steps) : (a.steps > 0 ? 1.0 : 0.0);
    // Its size per unit of inner learning rate: ‖Δ‖ / Σ lr(t) over its steps (AdamW moves each value by about lr(t)
    // a step whatever the gradient's scale, so warmup and decay do not move the comparison: §10).
    double lr_sum = 0;
    for (int64_t t = std::max<int64_t>(0, a.captured_step - a.steps); t < a.captured_step; ++t) lr_sum += schedule_.global_at(t);
    lr_sum = std::max(lr_sum, schedule_.global_at(std::max<int64_t>(0, a.captured_step)));
    const double rebased = own_norm >= 0 ? 0 : l2_norm(g);
    const double norm = lr_sum > 0 ? (own_norm >= 0 ? own_norm : rebased) / lr_sum : -1;  // −1: not comparable
                                                                                        // (lr 0: min_lr_ratio 0)
    const double unreduced = lr_sum > 0 ? (sent_norm >= 0 ? sent_norm : rebased) / lr_sum : -1;
    per_step.push_back(std::isfinite(norm) ? norm : -1);
    reference.push_back(std::isfinite(unreduced) && !rewarming ? unreduced : -1);
    codec_error.push_back(a.codec_error);
    raw.push_back(a.base_version < 0);
    ids.push_back(id);
    grads.push_back(std::move(g));
    weights.push_back(w);
    tokens.push_back(a.tokens);
    steps.push_back(a.steps);
  }
  // 5b) screening (§10): an answer whose ‖Δ‖ per step is screen_ratio × the lower median of the round's other
  // answers and the fragment's recent merged answers is refused (clip_ratio: scaled down to it); with fewer than two
  // reference values there is nothing to compare with. Answers that trained no step carry no weight and no norm.
  const double screen = config_.diloco.screen_ratio, clip = config_.diloco.clip_ratio;
  std::vector<bool> keep(ids.size(), true);
  double largest_ratio = 0;  // of the answers kept: how close an honest round comes to the screen (the merged event)
  // diloco.blocking: a learner waits for the merge of the round it answered, so screening there is off.
  if ((screen > 0 || clip > 0) && !config_.diloco.blocking) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (steps[i] <= 0 || per_step[i] < 0) continue;
      std::vector<double> ref(frag.recent_norms.begin(), frag.recent_norms.end());
      for (size_t j = 0; j < ids.size(); ++j) {
        if (j != i && steps[j] > 0 && reference[j] >= 0 && !raw[j]) ref.push_back(reference[j]);
      }
      if (ref.size() < 2) continue;
      const double median = lower_median(ref);
      if (!(median > 0)) continue;
      const double ratio = per_step[i] / median;
      if (!(screen > 0 && ratio >= screen)) largest_ratio = std::max(largest_ratio, std::min(ratio, clip > 0 ? clip : ratio));
      // A raw θ after the syncer came back with an older history honestly carries the merges it lost besides its
      // own steps: it is scaled down to screen_ratio × the median, never refused.
      const double clip_at = raw[i] && screen > 0 && ratio >= screen ? screen : clip;
      if (screen > 0 && ratio >= screen && !raw[i]) {
        keep[i] = false;
        refuse(ids[i], p, round.step, RefusalKind::kNorm, /*solicited=*/true);
        actions.events.push_back(event("answer_refused",
                                       {{"learner", ids[i]}, {"fragment", p}, {"round", round.step},
                                        {"kind", to_string(RefusalKind::kNorm)}, {"ratio", ratio},
                                        {"reason", "outer gradient per step " + std::to_string(per_step[i]) + " is " +
                                                       std::to_string(ratio) + "× the median " +
                                                       std::to_string(median) + " (diloco.screen_ratio " +
                                                       std::to_string(screen) + ")"}}));
      } else if (clip_at > 0 && ratio > clip_at) {
        const float scale = static_cast<float>(clip_at / ratio);
        for (float& v : grads[i]) v *= scale;
        per_step[i] *= scale;
        reference[i] *= scale;
        ++answers_clipped_;
        actions.events.push_back(event("answer_clipped", {{"learner", ids[i]}, {"fragment", p}, {"round", round.step},
                                                          {"ratio", ratio}, {"to", clip_at}}));
      }
    }
  }
  int64_t round_tokens = 0;  // the tokens the merged answers carry
  {
    size_t k = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!keep[i]) continue;
      if (k != i) {  // (a vector moved onto itself would be left empty)
        ids[k] = ids[i], grads[k] = std::move(grads[i]), weights[k] = weights[i], per_step[k] = per_step[i];
        steps[k] = steps[i], raw[k] = raw[i], reference[k] = reference[i], codec_error[k] = codec_error[i];
      }
      round_tokens += tokens[i];
      ++k;
    }
    ids.resize(k), grads.resize(k), weights.resize(k), per_step.resize(k), steps.resize(k), raw.resize(k);
    reference.resize(k), codec_error.resize(k);
  }
  if (ids.empty() || !merge_has_weight(weights)) {
    actions.events.push_back(event("round_skipped", {{"fragment", p}, {"round", round.step},
                                                     {"reason", ids.empty() ? "no answers" :
                                                                              "no answering learner trained on it"}}));
    return;
  }
  // 6) merge: RDA (plain weighted mean for the embedding), 7) Nesterov outer step.
  std::vector<std::span<const float>> views(grads.begin(), grads.end());
  std::vector<float> delta(n);
  merge_fragment(layout_, p, views, weights,
                 config_.diloco.merge, is_embedding_, delta);
  const wire::Codec down = wire::parse_codec(to_string(config_.diloco.wire_down));
  const std::vector<float> previous = frag.theta, previous_momentum = frag.momentum;
  const wire::ErrorFeedback previous_feedback = frag.down_feedback;
  nesterov_outer_step(frag.theta, frag.momentum, delta, static_cast<float>(config_.diloco.outer_lr),
                      static_cast<float>(config_.diloco.outer_momentum));
  MergedFragmentData merged{p, frag.version + 1, round.step, ids, {}, -1, 0, {}};
  if (down != wire::Codec::kFp32 && all_finite(frag.theta)) {
    // 7b) the compressed downlink (docs/protocol.md §9): the canonical Θ_p is what every learner rebuilds from the
    // encoded update, Θ_p^prev + Û; with error feedback what the codec dropped goes into the next update of p.
    std::vector<float> update(n);
    for (size_t i = 0; i < n; ++i) update[i] = frag.theta[i] - previous[i];
    try {
      merged.update = config_.diloco.error_feedback ? frag.down_feedback.encode(update, down) : wire::encode(update, down);
      std::vector<float> rebuilt;
      const std::string bad = wire::apply_update(previous, merged.update, rebuilt);
      if (!bad.empty()) throw InputError(bad);
      frag.theta = std::move(rebuilt);
      merged.base_version = frag.version;
      merged.base_hash = fnv1a64_floats(previous);
    } catch (const InputError& e) {  // a non-finite update: the integer codecs cannot carry it, Θ_p goes whole
      frag.down_feedback.reset();
      merged.update = {};
      actions.events.push_back(event("downlink_whole", {{"fragment", p}, {"round", round.step}, {"reason", e.what()}}));
    }
  }
  // 7c) a merge whose Θ_p or v_p is not finite (an overflow: finite answers can still sum past FLT_MAX) is dropped
  // before anything is persisted or broadcast; Θ_p and v_p stay as they were (§10).
  if (!all_finite(frag.theta) || !all_finite(frag.momentum)) {
    frag.theta = previous;
    frag.momentum = previous_momentum;
    frag.down_feedback = previous_feedback;
    ++merges_dropped_;
    actions.events.push_back(event("merge_dropped", {{"fragment", p}, {"round", round.step}, {"participants", ids},
                                                     {"reason", "the outer step made Θ_p or its momentum non-finite "
                                                                "(outer gradient norm " +
                                                                    std::to_string(l2_norm(delta)) + ")"}}));
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (steps[i] > 0 && reference[i] >= 0 && !raw[i]) frag.recent_norms.push_back(reference[i]);
  }
  const size_t keep_norms = static_cast<size_t>(std::max<int64_t>(8, 2 * config_.diloco.learners));
  while (frag.recent_norms.size() > keep_norms) frag.recent_norms.pop_front();
  frag.version += 1;
  frag.anchors.emplace_back(frag.version, frag.theta);
  while (static_cast<int64_t>(frag.anchors.size()) > config_.diloco.anchor_versions) frag.anchors.pop_front();
  ++merges_;
  for (size_t i = 0; i < ids.size(); ++i) {  // a merged answer ends a run of refusals of p and sets its allowance
    auto rec = learners_.find(ids[i]);
    if (rec == learners_.end()) continue;
    rec->second.refused_in_a_row.erase(p);
    if (raw[i]) {
      rec->second.carried_error.erase(p);  // a re-anchoring learner starts its error feedback again
    } else {
      rec->second.carried_error[p] = codec_error[i];
    }
  }
  tokens_merged_ += round_tokens;
  last_quorum_ = static_cast<int64_t>(ids.size());
  sync_ema_.update(now_s - round.pull_sent_s);
  const auto normalised = normalise_weights(weights);
  actions.events.push_back(event("merged", {{"fragment", p}, {"round", round.step}, {"version", frag.version},
                                            {"participants", ids}, {"weights", normalised},
                                            {"outer_grad_norm", l2_norm(delta)}, {"largest_ratio", largest_ratio}}));
  merged.theta = frag.theta;
  actions.merged.push_back(std::move(merged));
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
