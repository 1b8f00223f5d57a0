// The one codec of tensor payloads on the wire (docs/protocol.md "Payloads"; issue 14). Every transport carries
// payloads encoded, so the syncer and the learners refuse the same malformed ones whichever transport runs.
//   fp32        raw little-endian floats, 4 bytes a value
//   bf16        the upper 16 bits of each float rounded to nearest even (core/bf16.h), 2 bytes a value
//   q8/<B>      block-absmax symmetric int8: n (uint64 LE), then ⌈n/B⌉ fp32 scales s_b = max|x| over block b / 127,
//               then n int8 values q = round-half-even(x / s_b) in [−127, 127]; x̂ = q · s_b. B = 256 by default:
//               8 + 4⌈n/B⌉ + n bytes (8.125 bits a value at B = 256)
//   q4/<B>      the same with 4-bit values in [−7, 7] (two's complement nibbles, value 2i in the low nibble of byte
//               i), s_b = max|x| / 7; B = 64 by default: 8 + 4⌈n/B⌉ + ⌈n/2⌉ bytes (4.5 bits a value at B = 64)
//   topk/<C>[/<D>]  sparse: of each chunk of C values (4096 by default) the 1/D largest in magnitude (D = 64 by
//               default), as indices and 2-bit codes (0.30 bits a value at D = 64): transport/sparse_codec.h
// Per element |x − x̂| ≤ max|x over its block| / (2 · q_max) (q_max 127 or 7), up to fp32 rounding of x / s_b.
// The wire names the codec with its block ("q4/64"), so a receiver needs no config to decode.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/protocol.h"

namespace dloco::wire {

enum class Codec { kFp32, kBf16, kQ8, kQ4, kTopK };

/// Default values per block of the integer codecs: 256 for q8, 64 for q4, the chunk of topk: 4096 (0 for fp32 and
/// bf16).
int64_t default_block(Codec codec);
/// "fp32" | "bf16" | "q8" | "q4" | "topk" (the config's name; the wire adds "/<block>").
const char* to_string(Codec codec);
/// Inverse of to_string; throws InputError naming the valid codecs.
Codec parse_codec(std::string_view name);
/// Bytes encode() writes for n values: n·4, n·2, 8 + 4⌈n/B⌉ + n, 8 + 4⌈n/B⌉ + ⌈n/2⌉, or topk's
/// (sparse::encoded_bytes; `density` D: one value in D kept, 0 = 64).
int64_t encoded_bytes(Codec codec, int64_t n, int64_t block = 0, int64_t density = 0);

/// Encodes `values` (n floats) with `codec` (`block` values per scale for q8/q4, per chunk for topk; 0 = the
/// default; topk keeps one value in `density`, 0 = 64). Throws InputError for q8/q4/topk when a value is NaN or
/// infinite (it would poison its block's scale or its chunk's range; fp32 and bf16 carry it, for the receiver to
/// refuse and count), or for a block outside [1, 65536] (a chunk outside [64, 65536], a density outside [2, 1024]).
Payload encode(std::span<const float> values, Codec codec, int64_t block = 0, int64_t density = 0);
/// Decodes a payload into `out`. Returns "" on success, else what was wrong: an unknown codec or block, a size that
/// is not exactly the codec's for its values, `expected_numel` ≥ 0 not matched, a negative or non-finite scale, an
/// integer outside [−q_max, q_max], a value that decodes to non-finite; `out` is then unspecified. Finiteness of
/// fp32 and bf16 values is the caller's check (the syncer refuses non-finite deltas and counts them).
std::string decode(const Payload& payload, std::vector<float>& out, int64_t expected_numel = -1);

/// An upper bound on ‖x − x̂‖₂ for the values x a payload was encoded from, x̂ = `decoded` (what decode() gave for
/// it): q8/q4 √(Σ_b n_b · (s_b / 2)²) with s_b = max|x̂| over block b / q_max (rounding to nearest moves a value by at
/// most half its block's step; the step is taken from the decoded values, so a declared scale over zeros claims
/// nothing), bf16 2⁻⁷ · ‖x̂‖ (8 significant bits, round to nearest), topk from its declared ranges
/// (sparse::error_bound: mostly what it dropped), fp32 0. With error feedback it
/// bounds the residual a sender carries into its next payload (the syncer's norm screen, docs/protocol.md §10).
/// Only for a payload decode() took.
double error_bound(const Payload& payload, std::span<const float> decoded);

/// Θ_p at the next version from Θ_p at the base and an encoded outer update U (the compressed downlink, issue 14
/// part 3): out[i] = base[i] + Û[i] in fp32, the one formula the syncer and every learner use, so every copy equals
/// the syncer's Θ_p bit for bit. Returns "" on success, else what was wrong (decode()'s reasons, a size other than
/// the base's, a sum that is not finite); `out` is then unspecified.
std::string apply_update(std::span<const float> base, const Payload& update, std::vector<float>& out);

/// Error feedback for one stream of vectors of one size (issue 14 part 2; a learner keeps one per fragment): what
/// the codec dropped from the last vector sent is added to the next, so the sum of what was sent tracks the sum of
/// the inputs to within one rounding (|Σ x − Σ x̂| = |e| ≤ one block's bound) instead of drifting by the codec's bias
/// every round. Not thread-safe.
class ErrorFeedback {
 public:
  /// Sends x = `values` + β·e as `codec` (`values` becomes x, in place) and keeps e ← x − decode(sent); `decoded`
  /// (if given) receives decode(sent). β = `decay` in (0, 1] (SparseLoCo's 0.95 forgets old error; 1 keeps the sums
  /// exact). A size other than the last one's starts from e = 0. Throws InputError as encode() does (e is then
  /// cleared).
  Payload encode(std::vector<float>& values, Codec codec, int64_t block = 0, std::vector<float>* decoded = nullptr,
                 double decay = 1.0, int64_t density = 0);
  /// e = 0 (the next vector is relative to another base: a re-anchor, a restart).
  void reset() { residual_.clear(); }
  /// e, empty before the first vector.
  const std::vector<float>& residual() const { return residual_; }

 private:
  std::vector<float> residual_;
};

}  // namespace dloco::wire

namespace dloco::wire {

/// The fp32 values of a fragment. Throws InputError if its payload is not whole fp32 values.
std::vector<float> fragment_values(const Fragment& fragment);

}  // namespace dloco::wire
