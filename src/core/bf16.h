// fp32 <-> bfloat16 conversion (outer gradients on the wire, docs/protocol.md §9; BF16 safetensors).
// bf16 keeps fp32's sign and 8 exponent bits and the top 7 mantissa bits: relative error ≤ 2^-8 after
// round-to-nearest-even. NaN stays NaN (quiet), ±inf stays ±inf, values above the largest bf16 round to ±inf.
// Stored as uint16_t bit patterns, so no compiler bf16 support is needed.
#pragma once

#include <cstdint>
#include <span>

namespace dloco {

/// One value, round to nearest, ties to even. NaN → a quiet NaN with the same sign.
uint16_t float_to_bf16(float x);

/// One value, exact (bf16 is a subset of fp32).
float bf16_to_float(uint16_t bits);

/// Elementwise over spans of equal size n (InputError otherwise). n == 0 is allowed.
void float_to_bf16(std::span<const float> in, std::span<uint16_t> out);
void bf16_to_float(std::span<const uint16_t> in, std::span<float> out);

/// IEEE half (fp16) to fp32, exact, including subnormals, inf and NaN (for reading F16 safetensors).
float f16_to_float(uint16_t bits);

}  // namespace dloco
