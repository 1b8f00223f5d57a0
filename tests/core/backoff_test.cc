// The jittered exponential backoff: bounds, growth, cap, reset, determinism for a seed, distinct seeds per
// process and per learner id.
#include "core/backoff.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"

namespace dloco {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(Backoff, DelaysStayWithinTheJitterBoundsAndTheCap) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    BackoffConfig config{milliseconds(100), milliseconds(3000), 2.0, 0.25, seed};
    Backoff backoff(config);
    for (int k = 0; k < 12; ++k) {
      const double base = std::min(3000.0, 100.0 * std::pow(2.0, k)) * 1000.0;  // us
      const double d = static_cast<double>(backoff.next_delay().count());
      EXPECT_GE(d, std::floor(base * 0.75) - 1) << "attempt " << k;
      EXPECT_LE(d, std::min(3e6, base * 1.25)) << "attempt " << k;
    }
    EXPECT_EQ(backoff.attempts(), 12);
  }
}

TEST(Backoff, NoJitterIsExactlyExponentialUntilTheCap) {
  Backoff backoff(BackoffConfig{milliseconds(10), milliseconds(100), 3.0, 0.0, 1});
  EXPECT_EQ(backoff.next_delay(), milliseconds(10));
  EXPECT_EQ(backoff.next_delay(), milliseconds(30));
  EXPECT_EQ(backoff.next_delay(), milliseconds(90));
  EXPECT_EQ(backoff.next_delay(), milliseconds(100));
  EXPECT_EQ(backoff.next_delay(), milliseconds(100));
  backoff.reset();
  EXPECT_EQ(backoff.attempts(), 0);
  EXPECT_EQ(backoff.next_delay(), milliseconds(10));
}

std::vector<microseconds> delays(const BackoffConfig& config, int n) {
  Backoff backoff(config);
  std::vector<microseconds> out;
  for (int k = 0; k < n; ++k) out.push_back(backoff.next_delay());
  return out;
}

// Property over a table of configs x seed pairs: every delay stays within its bounds, a seed replays its sequence
// exactly, and another seed gives another sequence. Below the cap two seeds differ at (nearly) every attempt; at
// the cap upward jitter is clamped to max, so two sequences may both sit at max there.
TEST(Backoff, SeedsGiveDistinctReproducibleSequencesWithinBounds) {
  const std::vector<BackoffConfig> configs = {
      {milliseconds(100), milliseconds(3000), 2.0, 0.25, 0},  // grows to the cap
      {milliseconds(200), milliseconds(2000), 2.0, 0.2, 0},   // the learner link's
      {milliseconds(50), milliseconds(50), 1.0, 0.5, 0},      // constant base: only the jitter moves
      {milliseconds(5), milliseconds(60000), 1.5, 0.05, 0},   // narrow jitter, never capped in 16 attempts
      {milliseconds(2), milliseconds(100), 10.0, 0.9, 0},     // fast growth, wide jitter
  };
  const std::vector<std::pair<uint64_t, uint64_t>> seeds = {
      {0, 1}, {42, 43}, {1, uint64_t{1} << 63}, {backoff_seed_for(0), backoff_seed_for(1)},
      {process_backoff_seed(), process_backoff_seed()}};
  constexpr int kAttempts = 16;
  for (size_t c = 0; c < configs.size(); ++c) {
    for (const auto& [seed_a, seed_b] : seeds) {
      SCOPED_TRACE("config " + std::to_string(c) + ", seeds " + std::to_string(seed_a) + " / " +
                   std::to_string(seed_b));
      BackoffConfig a = configs[c], b = configs[c];
      a.seed = seed_a;
      b.seed = seed_b;
      const auto xs = delays(a, kAttempts), ys = delays(b, kAttempts);
      EXPECT_EQ(xs, delays(a, kAttempts));  // the same seed reproduces the sequence
      EXPECT_EQ(ys, delays(b, kAttempts));
      EXPECT_NE(xs, ys);
      const double max_us = static_cast<double>(a.max.count()), j = a.jitter;
      int uncapped = 0, differ = 0;
      for (int k = 0; k < kAttempts; ++k) {
        const double base = std::min(max_us, static_cast<double>(a.initial.count()) * std::pow(a.multiplier, k));
        for (const microseconds d : {xs[k], ys[k]}) {
          EXPECT_GE(static_cast<double>(d.count()), std::floor(base * (1 - j)) - 1) << "attempt " << k;
          EXPECT_LE(static_cast<double>(d.count()), std::min(max_us, base * (1 + j))) << "attempt " << k;
        }
        if (base * (1 + j) <= max_us) {
          ++uncapped;
          differ += xs[k] != ys[k];
        }
      }
      if (uncapped > 0) EXPECT_GE(2 * differ, uncapped) << differ << " of " << uncapped << " uncapped attempts differ";
    }
  }
}

// The lock-step bug: learners that lose the syncer together must not retry together. With seeds from their ids
// (or the per-process default) their first retries all differ (first 4 delays compared: one delay alone has
// 80,000 values, where 16 learners would collide by chance about once in 700 runs).
TEST(Backoff, LearnersSeededByIdOrByDefaultDoNotRetryInLockStep) {
  const BackoffConfig link{milliseconds(200), milliseconds(2000), 2.0, 0.2, 0};
  std::set<std::vector<microseconds>> by_id, by_default;
  constexpr int kLearners = 16;
  for (int id = 0; id < kLearners; ++id) {
    BackoffConfig seeded = link;
    seeded.seed = backoff_seed_for(id);
    by_id.insert(delays(seeded, 4));
    BackoffConfig defaulted;  // seed = process_backoff_seed()
    defaulted.initial = link.initial;
    defaulted.max = link.max;
    by_default.insert(delays(defaulted, 4));
  }
  EXPECT_EQ(by_id.size(), size_t{kLearners});
  EXPECT_EQ(by_default.size(), size_t{kLearners});
  EXPECT_NE(BackoffConfig{}.seed, BackoffConfig{}.seed);  // the default differs per Backoff, not only per process
}

// Table of seed inputs: any difference in pid, time or counter gives another seed; ids and salts give distinct
// reproducible seeds.
TEST(Backoff, SeedMixingSeparatesProcessesTimesAndIds) {
  const uint64_t t = 1'700'000'000'000'000'000ULL;
  const std::vector<std::array<uint64_t, 3>> inputs = {
      {100, t, 0}, {101, t, 0}, {100, t + 1, 0}, {100, t, 1}, {101, t ^ 1, 0}, {100 ^ 3, t ^ 3, 0}, {0, 0, 0}};
  std::set<uint64_t> mixed;
  for (const auto& [pid, ns, counter] : inputs) mixed.insert(mix_backoff_seed(pid, ns, counter));
  EXPECT_EQ(mixed.size(), inputs.size());
  EXPECT_EQ(mix_backoff_seed(100, t, 0), mix_backoff_seed(100, t, 0));

  std::set<uint64_t> ids;
  for (uint64_t id = 0; id < 1000; ++id) {
    ids.insert(backoff_seed_for(id));
    ids.insert(backoff_seed_for(id, 1));
  }
  EXPECT_EQ(ids.size(), 2000u);
  EXPECT_EQ(backoff_seed_for(7, 3), backoff_seed_for(7, 3));
}

TEST(Backoff, JitterSpreadsDelays) {
  Backoff backoff(BackoffConfig{milliseconds(1000), milliseconds(1000), 1.0, 0.5, 9});
  microseconds lo = microseconds::max(), hi = microseconds::zero();
  for (int k = 0; k < 200; ++k) {
    const microseconds d = backoff.next_delay();
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_LT(lo, milliseconds(650));   // the lower half of [500, 1000] ms is reached
  EXPECT_LE(hi, milliseconds(1000));  // the cap holds even with upward jitter
  EXPECT_GT(hi, milliseconds(950));
}

TEST(Backoff, RefusesBadConfig) {
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(0), milliseconds(10), 2.0, 0.1, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(20), milliseconds(10), 2.0, 0.1, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(1), milliseconds(10), 0.5, 0.1, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(1), milliseconds(10), 2.0, 1.0, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(1), milliseconds(10), 2.0, -0.1, 0}), InputError);
}

}  // namespace
}  // namespace dloco
