// The syncer's decisions as pure functions of (now, state, config), each returning the decision and a
// human-readable reason (torchft style), so they can be table-tested by setting state by hand and logged as
// structured events. Spec decoupled-diloco.md §4 (global clock, liveness lease, quorum) and §5 (grace window).
//
// Times are seconds (double) on one monotonic clock chosen by the caller; steps are global step counts.
// Deliberately not here: clocks, sleeping, networking. The syncer owns the state and calls these.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dloco {

/// What the syncer knows of one learner, from its last metadata message.
struct LearnerState {
  int id = 0;                // learner slot id
  int64_t step = 0;          // its local step t_m, last reported
  double last_seen_s = 0.0;  // when its last metadata arrived (s, syncer's clock)
  double step_time_s = 0.0;  // its recent step time ξ_step (s, e.g. an EMA it reports); 0 = unknown
  bool joined = false;       // bootstrapped and attached; a learner not joined is never live
};

/// Liveness lease (docs/protocol.md §4): a learner is absent after no metadata for max(step_multiple·ξ_step, min_lease_s).
struct LeaseConfig {
  double step_multiple = 3.0;  // lease in units of the learner's step time
  double min_lease_s = 5.0;    // floor of the lease, s
};

/// Lease of this learner in seconds: max(step_multiple·step_time_s, min_lease_s).
double lease_s(const LearnerState& learner, const LeaseConfig& lease);

/// True while the learner is joined and now_s − last_seen_s < lease_s (absent once a full lease passed silent).
bool is_live(const LearnerState& learner, double now_s, const LeaseConfig& lease);

/// Result of advancing the global clock.
struct ClockDecision {
  int64_t global_step = 0;  // the new t (never below the previous one)
  bool advanced = false;    // global_step > previous
  int live = 0;             // live learners counted
  std::string reason;       // e.g. "t 40 -> 48: 2nd largest step of 3 live learners is 48"
};

/// Global clock (docs/protocol.md §4, ours): t = max(previous, K-th largest step among live learners). With fewer than K live
/// learners t stays. Throws InputError if K < 1 or previous < 0.
ClockDecision advance_global_clock(int64_t previous, std::span<const LearnerState> learners, double now_s, int K,
                                   const LeaseConfig& lease);

/// The due steps u of fragment p (u mod H == S_p, docs/protocol.md §4) with from_exclusive < u ≤ to_inclusive, ascending.
/// Empty if to_inclusive ≤ from_exclusive. Throws InputError on an invalid schedule or p out of range.
std::vector<int64_t> due_steps_crossed(int p, int64_t from_exclusive, int64_t to_inclusive, int H, int P);

/// One (due step, fragment) round to process.
struct DueRound {
  int64_t step = 0;  // u
  int fragment = 0;  // p
  bool operator==(const DueRound&) const = default;
};

/// Every round crossed when the clock moves from from_exclusive to to_inclusive, in the order the syncer must
/// process them: ascending u. H is a multiple of P, so the offsets S_p are distinct and at most one fragment is
/// due per step. Same errors as due_steps_crossed.
std::vector<DueRound> due_rounds_crossed(int64_t from_exclusive, int64_t to_inclusive, int H, int P);

/// Exponential moving average, value ← decay·value + (1 − decay)·x. The first sample sets the value directly
/// (no bias toward 0). Spec §5 uses decay 0.9 (ours).
class Ema {
 public:
  /// Throws InputError unless 0 ≤ decay < 1.
  explicit Ema(double decay = 0.9);
  void update(double x);
  /// The current average; 0 before the first sample.
  double value() const { return value_; }
  bool has_value() const { return has_value_; }

 private:
  double decay_;
  double value_ = 0.0;
  bool has_value_ = false;
};

/// Adaptive grace window (docs/protocol.md §5): ξ_grace = max(0, γ·(τ·ξ_step − (ξ_quorum + ξ_sync))), seconds.
/// tau_steps = τ, slowest_step_s = ξ_step of the slowest live learner, quorum_s = ξ_quorum (schedule → quorum),
/// sync_s = ξ_sync (pull + merge + broadcast), gamma = γ. Throws InputError on negative inputs or γ ∉ [0, 1].
double grace_window_s(double tau_steps, double slowest_step_s, double quorum_s, double sync_s, double gamma);

/// Quorum and grace configuration (docs/protocol.md §2, §4, §5).
struct QuorumConfig {
  int K = 1;               // minimum quorum
  bool grace = true;       // adaptive grace window on/off
  double gamma = 0.5;      // γ, safety margin of the grace window (ours)
  double tau_steps = 2.0;  // τ, overlap in steps
  LeaseConfig lease;       // liveness lease
};

/// Moving averages the syncer tracks (Ema::value()), seconds.
struct Timings {
  double quorum_s = 0.0;  // ξ_quorum: time from a round becoming due to its quorum
  double sync_s = 0.0;    // ξ_sync: pull + merge + broadcast
};

/// One pending round of fragment p at due step u.
struct RoundState {
  int fragment = 0;             // p
  int64_t due_step = 0;         // u
  double due_since_s = 0.0;     // when the global clock crossed u (s)
  double quorum_since_s = -1.0; // when the quorum was first reached (s); < 0 = not yet (the syncer records it)
};

enum class MergeAction {
  kWaitQuorum,  // fewer than K live learners reached u
  kWaitGrace,   // quorum reached, some live learners lag, grace left: wait until grace_deadline_s
  kPullNow,     // send PullRequest(p, u) to `participants`
};

/// Name of the action for logs: "wait_quorum", "wait_grace", "pull_now".
const char* to_string(MergeAction action);

struct MergeDecision {
  MergeAction action = MergeAction::kWaitQuorum;
  std::vector<int> participants;  // ids of live learners whose step ≥ u, ascending
  int live = 0;                   // live learners
  double grace_s = 0.0;           // grace window length used (s); 0 when grace is off
  double grace_deadline_s = 0.0;  // end of the grace window (s), meaningful for kWaitGrace
  std::string reason;             // e.g. "quorum 1/1 reached; grace 0.40 s left for 2 more live learners"
};

/// Merge now or wait (docs/protocol.md §4 steps 1–3, §5):
///  1. participants = live learners whose reported step ≥ u. Fewer than K → kWaitQuorum.
///  2. Every live learner is a participant → kPullNow (nobody left to wait for).
///  3. Grace off → kPullNow. Otherwise ξ_grace = grace_window_s(τ, slowest live step time, ξ_quorum, ξ_sync, γ),
///     counted from quorum_since_s (or from now_s if not yet recorded); before its end → kWaitGrace, else kPullNow.
/// Throws InputError if K < 1 or the grace parameters are invalid.
MergeDecision decide_merge(const RoundState& round, std::span<const LearnerState> learners, double now_s,
                           const QuorumConfig& config, const Timings& timings);

}  // namespace dloco
