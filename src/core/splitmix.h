// SplitMix64's output function (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014): a
// bijective mix of a 64-bit word. Used to derive seeds and keys from small integers (core/backoff.cc: a retry's jitter
// seed; data/stream.cc: a shuffled stream's permutation key).
#pragma once

#include <cstdint>

namespace dloco {

/// The mixed word: x + φ·2^64, then two xor-shift-multiply rounds and a final xor-shift. Bijective on uint64_t.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace dloco
