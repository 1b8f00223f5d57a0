// Syncer state transitions; see syncer_state.h. Steps in comments follow docs/protocol.md §4.
#include "syncer/syncer_state.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/check.h"
#include "core/hash.h"

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

const char* to_string(SyncerPhase phase) {
  static constexpr const char* kNames[] = {"training", "flushing", "finished"};  // in the enum's order
  return static_cast<size_t>(phase) < std::size(kNames) ? kNames[static_cast<size_t>(phase)] : "?";  // -1 wraps
}

SyncerState::SyncerState(const Config& config, FragmentLayout layout, std::vector<std::vector<float>> theta,
                         std::function<bool(const std::string&)> is_embedding)
    : config_(config),
      quorum_{static_cast<int>(config.diloco.quorum), config.diloco.grace_window, config.diloco.gamma,
              static_cast<double>(config.diloco.overlap), LeaseConfig{}},
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

void SyncerState::on_join(int learner, double now_s) {
  if (restored_ && first_join_after_restore_s_ < 0) first_join_after_restore_s_ = now_s;
  auto& rec = learners_[learner];
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
  auto refuse = [&](const std::string& why) {
    ++answers_refused_;
    if (reason) *reason = why;
    return AnswerOutcome::kRefused;
  };
  auto drop = [&](const std::string& why) {
    ++answers_dropped_;
    if (reason) *reason = why;
    return AnswerOutcome::kDroppedLate;
  };
  const int P = static_cast<int>(fragments_.size());
  if (answer.fragment < 0 || answer.fragment >= P) {
    return refuse("fragment " + std::to_string(answer.fragment) + " does not exist (P = " + std::to_string(P) + ")");
  }
  const auto& frag = fragments_[answer.fragment];
  if (answer.delta.size() != frag.theta.size()) {
    return refuse("fragment " + std::to_string(answer.fragment) + " answer has " + std::to_string(answer.delta.size()) +
                  " values, expected " + std::to_string(frag.theta.size()));
  }
  if (!std::all_of(answer.delta.begin(), answer.delta.end(), [](float x) { return std::isfinite(x); })) {
    return refuse("fragment " + std::to_string(answer.fragment) + " answer holds non-finite values");
  }
  if (answer.steps < 0 || answer.tokens < 0) return refuse("negative step or token counters");
  auto it = open_.find(answer.fragment);
  if (it == open_.end() || !it->second.phase.is(RoundPhase::kPulling) || it->second.step != answer.round_step) {
    return drop("late answer for fragment " + std::to_string(answer.fragment) + " round " +
                std::to_string(answer.round_step) + ": that round is closed");
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
      return refuse("stale anchor: delta against version " + std::to_string(answer.base_version) +
                    " of fragment " + std::to_string(answer.fragment) + ", the syncer keeps versions " +
                    std::to_string(frag.anchors.front().first) + ".." + std::to_string(frag.anchors.back().first));
    }
  }
  (void)now_s;
  round.answers.emplace(learner, std::move(answer));
  return AnswerOutcome::kAccepted;
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
    if (!round.answers.count(id) && is_live(id, now_s)) waiting = true;
  }
  const double window_s =
      std::max(2.0, (static_cast<double>(config_.diloco.overlap) + 2.0) * slowest_step_s(now_s));
  if (waiting && now_s - round.pull_sent_s < window_s) return;
  if (waiting) {
    std::vector<int> missing;
    for (int id : round.requested) {
      if (!round.answers.count(id)) missing.push_back(id);
    }
    actions.events.push_back(event("answer_window_closed",
                                   {{"fragment", p}, {"round", round.step}, {"missing", missing},
                                    {"reason", "no answer within " + std::to_string(window_s) + " s"}}));
  }
  merge_round(p, round, now_s, actions);
  if (round.step == -1) flushed_[p] = true;
  round.phase.to(RoundPhase::kClosed);
}

void SyncerState::merge_round(int p, Round& round, double now_s, SyncerActions& actions) {
  FragmentState& frag = fragments_[p];
  const size_t n = frag.theta.size();
  std::vector<int> ids;
  std::vector<std::vector<float>> grads;
  std::vector<double> weights;
  int64_t round_tokens = 0;  // the tokens the merged answers carry
  for (auto& [id, a] : round.answers) {
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
    ids.push_back(id);
    grads.push_back(std::move(g));
    weights.push_back(w);
    round_tokens += a.tokens;
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
  std::vector<float> previous;
  if (down != wire::Codec::kFp32) previous = frag.theta;
  nesterov_outer_step(frag.theta, frag.momentum, delta, static_cast<float>(config_.diloco.outer_lr),
                      static_cast<float>(config_.diloco.outer_momentum));
  MergedFragmentData merged{p, frag.version + 1, round.step, ids, {}, -1, 0, {}};
  if (down != wire::Codec::kFp32) {
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
  frag.version += 1;
  frag.anchors.emplace_back(frag.version, frag.theta);
  while (static_cast<int64_t>(frag.anchors.size()) > config_.diloco.anchor_versions) frag.anchors.pop_front();
  ++merges_;
  tokens_merged_ += round_tokens;
  last_quorum_ = static_cast<int64_t>(ids.size());
  sync_ema_.update(now_s - round.pull_sent_s);
  const auto normalised = normalise_weights(weights);
  actions.events.push_back(event("merged", {{"fragment", p}, {"round", round.step}, {"version", frag.version},
                                            {"participants", ids}, {"weights", normalised},
                                            {"outer_grad_norm", l2_norm(delta)}}));
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
  for (const auto& [stream, tokens] : stream_tokens_) {
    if (tokens <= 0) continue;
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
