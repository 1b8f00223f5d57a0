// The one jittered exponential backoff used for every retry (every retry goes through this one helper):
// reconnecting to the syncer, re-fetching a snapshot, re-sending a fragment.
//
// Delay k (k = 0, 1, ...) is base_k·(1 + u), base_k = min(max, initial·multiplier^k), u uniform in
// [−jitter, +jitter], clamped to [0, max]. The random stream is a seeded std::mt19937_64, so a seed gives the same
// delays on every platform (the uniform draw is built from raw bits, not std::uniform_real_distribution).
//
// The seed is part of the config. Its default differs per process and per Backoff (process_backoff_seed()), so
// learners that lose the syncer at the same moment spread their retries instead of hitting a restarted syncer
// in lock-step; a caller that wants reproducible delays passes backoff_seed_for(learner id).
#pragma once

#include <chrono>
#include <cstdint>
#include <random>

namespace dloco {

/// A seed that differs between processes and between calls within one process: the pid, the wall clock (ns) and a
/// process-wide call counter mixed through SplitMix64. The default of BackoffConfig::seed.
uint64_t process_backoff_seed();

/// The mixing behind process_backoff_seed(), pure for tests: inputs that differ in any bit give unrelated seeds.
uint64_t mix_backoff_seed(uint64_t pid, uint64_t time_ns, uint64_t counter);

/// A reproducible seed for one role instance, e.g. a learner's id: different ids give unrelated delay sequences,
/// the same id the same sequence in every run. `salt` separates the backoffs of one id (join vs session) or runs.
uint64_t backoff_seed_for(uint64_t id, uint64_t salt = 0);

struct BackoffConfig {
  std::chrono::microseconds initial{std::chrono::milliseconds(100)};  // first base delay, > 0
  std::chrono::microseconds max{std::chrono::seconds(5)};             // cap of every delay, ≥ initial
  double multiplier = 2.0;                                           // growth per attempt, ≥ 1
  double jitter = 0.2;                                               // fraction, 0 ≤ jitter < 1
  uint64_t seed = process_backoff_seed();  // jitter's random stream: per process by default, or backoff_seed_for(id)
};

class Backoff {
 public:
  /// Throws InputError if the config breaks the bounds stated on its fields.
  explicit Backoff(const BackoffConfig& config = {});

  /// The delay to wait before the next attempt; advances the attempt counter. Within
  /// [base_k·(1 − jitter), min(max, base_k·(1 + jitter))].
  std::chrono::microseconds next_delay();

  /// Back to the initial delay (after a success). The random stream is not rewound.
  void reset() { attempt_ = 0; }

  /// Delays handed out since construction or the last reset().
  int attempts() const { return attempt_; }

 private:
  BackoffConfig config_;
  std::mt19937_64 rng_;
  int attempt_ = 0;
};

}  // namespace dloco
