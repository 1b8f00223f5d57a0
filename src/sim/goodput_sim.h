// The goodput simulator (docs/sim.md, "Goodput"): a seeded, deterministic discrete-event
// simulation of one training run under chip failures, for DP, elastic DP, DiLoCo, Streaming DiLoCo and
// Decoupled DiLoCo. The model is written out in docs/sim.md; in short:
//   1. chips fail as a Poisson process (rate N / chip MTBF); a failure takes its slice away for a random
//      return time;
//   2. every method runs on one or more synchronous *groups* of slices (DP: one group of all N chips;
//      DiLoCo, Streaming and Decoupled: M groups of N/M chips). A group's progress is fluid between events:
//      it steps at 1 / (step_s · slowest active slice's multiplier) steps per second while running;
//   3. DP restarts after any failure and loses the work since its last checkpoint; every other group pauses
//      for detection + downscale (losing the step in flight), runs on fewer slices, and pauses again to
//      upscale when slices return (returns that arrive within upscale_batch_s share one pause);
//   4. DiLoCo and Streaming groups may not run more than a few steps ahead of the slowest group (the sync
//      barrier); Decoupled learners never wait for each other; the global model advances while at least K
//      learners step;
//   5. goodput = chip-seconds of kept training / chip-seconds allocated; uptime = fraction of wall time in
//      which the global model advances.
// Deliberately not here: bandwidth (bandwidth.h), calibration (calibration.h), any I/O.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "sim/goodput_config.h"

namespace dloco::sim {

/// What one simulated run measured. Chip-seconds are nominal: one chip training for one second at the
/// nominal step time.
struct GoodputResult {
  double goodput = 0.0;          // kept chip-seconds / allocated chip-seconds, fraction in [0, 1]
  double uptime = 0.0;           // fraction of wall time in which the global model advances
  double allocated_chip_s = 0.0; // N · horizon
  double kept_chip_s = 0.0;      // training whose result is kept
  double lost_chip_s = 0.0;      // training done and then discarded (step in flight, since checkpoint, unmerged)
  double mean_slices_away = 0.0; // time-average number of slices away for repair
  int64_t failures = 0;          // chip failures that hit a slice in use or waiting to rejoin
  int64_t pauses = 0;            // pauses started (downscale, upscale, restart, rejoin)
  int64_t learner_losses = 0;    // decoupled: times a learner lost its state (and its unmerged progress)
  int64_t events = 0;            // events processed (for the benchmark's events/s)
};

/// Runs the simulation described by `config` (validated first: InputError on a bad knob). Deterministic: the
/// same config, seed included, gives bit-identical results. Cost: O(events · log events), events ≈ 4 × failures
/// (+ M per event for DiLoCo and Streaming).
GoodputResult simulate_goodput(const GoodputConfig& config);

/// The result as JSON: {"method", "learners", "quorum", "chips", "goodput", "uptime", ...}.
nlohmann::json to_json(const GoodputResult& result, const GoodputConfig& config);

}  // namespace dloco::sim
