// The one codec of tensor payloads on the wire (docs/protocol.md "Payloads"): fp32 as raw little-endian floats,
// bf16 as the upper 16 bits of each float rounded to nearest even (core/bf16.h). Every transport carries payloads
// encoded, so the syncer and the learners refuse the same malformed ones whichever transport runs.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transport/protocol.h"

namespace dloco::wire {

enum class Codec { kFp32, kBf16 };

/// "fp32" | "bf16".
const char* to_string(Codec codec);
/// Inverse of to_string; throws InputError naming the valid codecs.
Codec parse_codec(std::string_view name);

/// Encodes `values` (n floats) as n·4 (fp32) or n·2 (bf16) bytes.
Payload encode(std::span<const float> values, Codec codec);
/// Decodes a payload into `out`. Returns "" on success, else what was wrong (unknown codec, a size that is not a
/// whole number of values, `expected_numel` ≥ 0 not matched); `out` is then unspecified. Finiteness is the
/// caller's check (the syncer refuses non-finite deltas and counts them).
std::string decode(const Payload& payload, std::vector<float>& out, int64_t expected_numel = -1);

}  // namespace dloco::wire

namespace dloco::wire {

/// The fp32 values of a fragment. Throws InputError if its payload is not whole fp32 values.
std::vector<float> fragment_values(const Fragment& fragment);

}  // namespace dloco::wire
