// The sparse codec of outer gradients (issue 33; SparseLoCo / Covenant-72B's scheme): chunked top-k with 2-bit
// values. A vector of n values is cut into chunks of C values (the last may be shorter); of a chunk of L values
// only the k = ⌈L/D⌉ largest in magnitude travel (D = 64 by default: 1.56% density; diloco.topk_density), each as
// its index in the chunk and two bits — its sign and which of two magnitude levels it is nearest to. The levels
// split the kept magnitudes' range [t, m] in two: lo = t + (m − t)/4, hi = m − (m − t)/4 (the middle of each half).
//
// Wire ("topk/<C>" for D = 64, "topk/<C>/<D>" otherwise; C in [64, 65536], D in [2, 1024]; little-endian):
//   n (uint64) | per chunk: t, m (fp32, 0 ≤ t ≤ m) | per chunk its k indices (uint16, strictly increasing, < L) |
//   the K = Σ k 2-bit codes, four a byte, code j in bits 2(j mod 4) and 2(j mod 4) + 1 of byte ⌊j/4⌋ (bit 0: hi
//   level, bit 1: negative); the unused bits of the last byte are 0.
//   8 + 8⌈n/C⌉ + 2K + ⌈K/4⌉ bytes: at C = 4096 and n a multiple of it, 152 bytes per 4096 values at D = 64 (0.30 bits a
//   value, 108× fewer bytes than fp32), 584 at D = 16 (28×), 1160 at D = 8 (14×).
// Decoded: x̂ = ±lo or ±hi at the kept indices, 0 elsewhere. Every dropped |x| ≤ t (top-k), every kept value is off by
// at most (m − t)/4, so ‖x − x̂‖² ≤ Σ_chunks (L − k)·t² + k·((m − t)/4)². Most of ‖x‖ is dropped each time: the codec is
// meant to run with error feedback (wire::ErrorFeedback), which carries what was dropped into the next vector.
// Deliberately not here: the dispatch by codec name (transport/codec.h), error feedback.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/protocol.h"

namespace dloco::wire::sparse {

inline constexpr int64_t kDefaultChunk = 4096;
inline constexpr int64_t kMinChunk = 64, kMaxChunk = 1 << 16;
inline constexpr int64_t kDensity = 64;  // D by default: one value kept in 64
inline constexpr int64_t kMinDensity = 2, kMaxDensity = 1024;

/// Values kept of a chunk of `len` values: ⌈len / D⌉.
inline int64_t kept_of(int64_t len, int64_t density = kDensity) { return (len + density - 1) / density; }
/// Bytes encode() writes for n values in chunks of `chunk`, one in `density` kept.
int64_t encoded_bytes(int64_t n, int64_t chunk, int64_t density = kDensity);
/// The wire name: "topk/<chunk>" for the default density, "topk/<chunk>/<density>" otherwise.
std::string wire_name(int64_t chunk, int64_t density);
/// "topk/4096" -> {4096, 64}, "topk/4096/16" -> {4096, 16}; false when `name` is not a sparse codec with a chunk in
/// [kMinChunk, kMaxChunk] and a density in [kMinDensity, kMaxDensity] (written without leading zeros; the default
/// density only as "topk/<C>": one spelling per layout).
bool parse(const std::string& name, int64_t* chunk, int64_t* density);
/// Encodes `values` (finite; the caller checks) in chunks of `chunk`, one in `density` kept. Ties in magnitude keep
/// the lower index.
Payload encode(std::span<const float> values, int64_t chunk, int64_t density = kDensity);
/// Decodes into `out` (n values); "" on success, else what was wrong: a size other than the layout's, a count over
/// 2^31 − 1 or other than `expected_numel` (≥ 0), a range that is not finite or not 0 ≤ t ≤ m, an index out of its
/// chunk or not increasing, unused code bits that are not 0.
std::string decode(const Payload& payload, int64_t chunk, int64_t density, std::vector<float>& out,
                   int64_t expected_numel);
/// √(Σ_chunks (L − k)·t² + k·((m − t)/4)²) from the payload's declared ranges (decode() took it).
double error_bound(const Payload& payload, int64_t chunk, int64_t density);

}  // namespace dloco::wire::sparse
