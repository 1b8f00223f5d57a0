// Emulated heterogeneous hardware (run.slowdown; docs/guide-baselines.md "Heterogeneous learners"): a learner or worker
// that sleeps after each step so that the step takes `factor` × (1 + ε) times its own steady compute (SteadyCompute
// below), ε drawn per step from N(0, sd²) (the per-step variance of "Decoupled DiLoCo" §10's mixed-hardware runs,
// ../shared/spec). The sleep cannot make a step faster than its compute: a step's multiplier is at least 1, so a
// symmetric variance needs a factor well above 1 (e.g. every learner "i:3~0.1", the slow kind "i:3.54~0.1").
// Deliberately not here: the sleeping itself (learner/run_learner.cc, baselines/run_worker.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

#include "core/config.h"

namespace dloco {

/// One learner's entry of run.slowdown ("ID:FACTOR" or "ID:FACTOR~SD", comma-separated; ID "*" = every learner not
/// listed by its id, joiners with ids ≥ M included).
struct SlowdownSpec {
  double factor = 1.0;  // mean step time over the step's own compute, ≥ 1
  double sd = 0.0;      // standard deviation of the per-step relative variation ε, in [0, 1)
};

/// The entry of learner (or worker) `id` of M = `learners`; {1, 0} when it is not listed. Throws InputError naming
/// the entry when one is malformed (not ID:FACTOR[~SD], trailing characters), a factor is < 1 or not finite, an sd
/// is outside [0, 1), or an id is outside [0, M) (a joiner is reached through "*").
SlowdownSpec slowdown_spec(const RunSettings& run, int id, int64_t learners);

/// The compute time a slowdown stretches: the median of the previous `window` steps' compute, and never more than
/// this step's own. An emulated chip F times slower takes F times a steady step; stretching a spike of the emulating
/// machine instead (a cold first step, another process's burst on shared cores) made a joiner's first step take 3.7 s
/// at F = 12 where the others' took 0.9 s, so it trailed the global step for good, and stalls of > 5 s put learners
/// out of their lease (issue 32's scavenging runs). The first step of an incarnation has no steady time: 0, no sleep.
class SteadyCompute {
 public:
  explicit SteadyCompute(size_t window = 9) : window_(std::max<size_t>(1, window)) {}
  /// This step's compute, s (≥ 0); returns the time the slowdown multiplies, s.
  double base(double step_s) {
    double out = 0;
    if (!recent_.empty()) {
      sorted_.assign(recent_.begin(), recent_.end());  // its capacity stays: no allocation per step
      const auto middle = sorted_.begin() + static_cast<std::ptrdiff_t>(sorted_.size() / 2);
      std::nth_element(sorted_.begin(), middle, sorted_.end());
      out = std::min(step_s, *middle);
    }
    recent_.push_back(step_s);
    if (recent_.size() > window_) recent_.pop_front();
    return out;
  }

 private:
  size_t window_;
  std::deque<double> recent_;
  std::vector<double> sorted_;
};

/// The per-step multipliers of one learner: factor × (1 + ε), at least 1, from a generator seeded by (seed, id) so
/// a run is reproducible.
class StepSlowdown {
 public:
  StepSlowdown(SlowdownSpec spec, uint64_t seed, int id)
      : spec_(spec), rng_(seed * 1000003u + static_cast<uint64_t>(id) + 17u) {}
  /// The multiplier of the next step (1 = no sleep).
  double next() {
    if (spec_.sd <= 0) return spec_.factor;
    const double m = spec_.factor * (1.0 + noise_(rng_) * spec_.sd);
    return m < 1.0 ? 1.0 : m;
  }
  /// The sleep after a step whose compute took `compute_s` seconds: (max(next(), at_least) − 1) × the steady compute
  /// (SteadyCompute), 0 when that factor is ≤ 1. `at_least`: a slow_learner fault's factor. Call it every step: the
  /// steady compute follows every step's.
  double sleep_after(double compute_s, double at_least = 1.0) {
    const double steady_s = steady_.base(compute_s);
    const double factor = std::max(next(), at_least);
    return factor > 1.0 ? (factor - 1.0) * steady_s : 0.0;
  }

 private:
  SlowdownSpec spec_;
  SteadyCompute steady_;
  std::mt19937_64 rng_;
  std::normal_distribution<double> noise_{0.0, 1.0};
};


}  // namespace dloco
