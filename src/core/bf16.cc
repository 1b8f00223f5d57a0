// fp32 <-> bf16 with round-to-nearest-even; fp16 -> fp32 for reading F16 files.
#include "core/bf16.h"

#include <bit>
#include <string>

#include "core/check.h"

namespace dloco {

uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN: keep sign and top payload, force quiet
  }
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit, then truncate. Overflow carries into
  // the exponent and gives ±inf, which is the correctly rounded result.
  const uint32_t lsb = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + lsb) >> 16);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

void float_to_bf16(std::span<const float> in, std::span<uint16_t> out) {
  if (in.size() != out.size()) {
    throw InputError("float_to_bf16: input has " + std::to_string(in.size()) + " values, output " +
                     std::to_string(out.size()));
  }
  for (size_t i = 0; i < in.size(); ++i) out[i] = float_to_bf16(in[i]);
}

void bf16_to_float(std::span<const uint16_t> in, std::span<float> out) {
  if (in.size() != out.size()) {
    throw InputError("bf16_to_float: input has " + std::to_string(in.size()) + " values, output " +
                     std::to_string(out.size()));
  }
  for (size_t i = 0; i < in.size(); ++i) out[i] = bf16_to_float(in[i]);
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf / NaN
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);  // ±0
    // Subnormal: normalise the mantissa.
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while ((mantissa & 0x400u) == 0);
    return std::bit_cast<float>(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(sign | (exponent + 127 - 15) << 23 | mantissa << 13);
}

}  // namespace dloco
