// FNV-1a 64-bit hashing for layout, config and tokenizer fingerprints exchanged in handshakes, and for naming a
// fragment's contents (end-of-run copy checks, the base of a compressed-downlink update).
// Not cryptographic: it detects mismatches between honest peers, the shared secret guards the rest.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

namespace dloco {

/// FNV-1a 64 of `bytes`, continuing from `seed` (the FNV offset basis by default).
inline uint64_t fnv1a64(std::string_view bytes, uint64_t seed = 14695981039346656037ull) {
  uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

/// FNV-1a 64 of the bytes of `values` (the compressed downlink names its base's, docs/protocol.md §9).
inline uint64_t fnv1a64_floats(std::span<const float> values) {
  return fnv1a64(std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
}

/// FNV-1a 64 of the bytes of `values`, as 16 hex digits: end-of-run checks that every learner's copy of a
/// fragment equals the syncer's Θ_p (chaos runs).
inline std::string fnv1a64_hex(std::span<const float> values) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx",
                static_cast<unsigned long long>(fnv1a64(std::string_view(
                    reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)))));
  return buf;
}

}  // namespace dloco
