// The syncer's clock and rounds (docs/protocol.md §4, §5): the global step, due rounds, quorum and grace, pulls,
// answer windows, the end. The merge of a closed round is syncer_merge.cc; learners and answers, syncer_state.cc.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "syncer/syncer_event.h"
#include "syncer/syncer_state.h"

namespace dloco {

using syncer_detail::event;

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
  // to start is neither live nor finished, and ending without it would drop its whole share; and while a stream
  // whose holder left is offered to a learner that spent its own (hold_end).
  if (phase_.is(SyncerPhase::kTraining) && live > 0 && live == live_finished &&
      (config_.train.shared_budget || every_stream_started()) && !awaiting_reattach(now_s) && !end_held_) {
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
    double grace_s = 0;  // the grace window the decision used (0: none was needed, or the flush)
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
                                                          {"participants", d.participants}, {"grace_s", d.grace_s},
                                                          {"reason", d.reason}}));
      }
      if (d.action != MergeAction::kPullNow) return;
      if (round.decision_state.quorum_since_s >= 0) grace_wait_s_ += now_s - round.decision_state.quorum_since_s;
      participants = d.participants;
      reason = d.reason;
      grace_s = d.grace_s;
    }
    // 3) pull from the set.
    round.phase.to(RoundPhase::kPulling);
    round.pull_sent_s = now_s;
    round.requested = participants;
    actions.pulls.push_back({p, round.step, participants});
    actions.events.push_back(event("pull", {{"fragment", p}, {"round", round.step}, {"learners", participants},
                                            {"grace_s", grace_s}, {"reason", reason}}));
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

}  // namespace dloco
