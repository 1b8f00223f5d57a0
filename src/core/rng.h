// A small seeded random number generator for the simulators and fault plans: xoshiro256** seeded through SplitMix64, with the
// few distributions the goodput model needs written out here (not std::*_distribution), so the same seed gives
// the same numbers on every compiler and standard library.
// Deliberately not here: anything cryptographic, or streams shared between threads.
#pragma once

#include <cmath>
#include <cstdint>

namespace dloco {

/// xoshiro256** (Blackman & Vigna). One instance per independent stream; not thread-safe.
class Rng {
 public:
  /// Seeds the four state words from `seed` and `stream` with SplitMix64; different streams of one seed are
  /// independent for all practical purposes.
  explicit Rng(uint64_t seed, uint64_t stream = 0) {
    uint64_t x = seed ^ (0x9E3779B97F4A7C15ULL * (stream + 1));
    for (uint64_t& word : s_) word = splitmix64(x);
  }

  /// Next 64 random bits.
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// Uniform integer in [0, n), n > 0 (multiply-shift; bias < n / 2^64, irrelevant here).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<__uint128_t>(next()) * n) >> 64); }

  /// Exponential with the given mean (same unit as the mean).
  double exponential(double mean) { return -mean * std::log1p(-uniform()); }

  /// Standard normal (Box–Muller, one value per call; the second is discarded to keep the state simple).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace dloco
