// The simulator tie-in of chaos runs (docs/sim.md, "Tie to the real system"): the learner faults
// a chaos run actually received are replayed, at the same times, through the goodput simulator's Decoupled DiLoCo
// model with the run's own M, K, H, P, τ and measured step and rejoin times, so the real goodput and the simulated
// one can be set side by side:
//   kill_learner   a failure of that learner's only slice, away for the plan's restart delay, then a rejoin
//                  (rejoin_s = the measured mean from restart to bootstrap); its unmerged work is lost
//   pause_learner  a failure that keeps the learner's state, away for the pause
//   slow_learner   replayed as a pause of duration·(1 − 1/factor) at its start: the same slot-seconds lost (the
//                  simulator's step-time multipliers are fixed per slice)
// Not replayed: syncer kills (the simulator has no syncer: learners keep training and their work is merged
// later, as in the real system).
#pragma once

#include <nlohmann/json.hpp>

#include "chaos/chaos_report.h"
#include "sim/goodput_config.h"

namespace dloco {

/// Run shape of the replay: from the chaos run's resolved config.
struct ReplayShape {
  int learners = 1;        // M
  int quorum = 1;          // K
  int64_t inner_steps = 1; // H
  int fragments = 1;       // P
  int64_t overlap = 0;     // τ
};

/// The simulator config replaying `analysis`'s learner kills: N = M chips in slices of one chip, step_s = the
/// measured nominal step, rejoin_s = the measured mean time from a restart to the learner's bootstrap (0 if no
/// learner was killed), detection 0 (the launcher restarts after the plan's delay, counted as time away),
/// horizon = the analysis window. Throws InputError if the analysis has no window or step time.
sim::GoodputConfig replay_config(const ChaosAnalysis& analysis, const ReplayShape& shape);

}  // namespace dloco
