// fp32 <-> bf16 round trip (docs/protocol.md §9).
#include "core/bf16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "core/check.h"

namespace dloco {
namespace {

TEST(Bf16, ExactValuesSurvive) {
  for (float x : {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 1.0f / 128, 65536.0f, 1.5f}) {
    EXPECT_EQ(bf16_to_float(float_to_bf16(x)), x) << x;
  }
  EXPECT_TRUE(std::signbit(bf16_to_float(float_to_bf16(-0.0f))));
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
}

TEST(Bf16, RoundTripRelativeErrorWithinHalfAnUlp) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-100, 100);
  for (int i = 0; i < 100000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng));
    if (x == 0.0f) continue;
    const float y = bf16_to_float(float_to_bf16(x));
    // 8 significant bits: |y − x| ≤ 2^-9·2^e(x) ≤ 2^-8·|x|.
    EXPECT_LE(std::fabs(y - x), std::ldexp(std::fabs(x), -8)) << x;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to 1 + 2^-6.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))),
            1.0f + std::ldexp(1.0f, -7));
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bf16_to_float(float_to_bf16(inf)), inf);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits must not become inf.
  const float low_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_nan))));
  EXPECT_TRUE(std::signbit(bf16_to_float(float_to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
  // The largest float rounds up to inf (bf16 max is 0x7f7f).
  EXPECT_EQ(bf16_to_float(float_to_bf16(std::numeric_limits<float>::max())), inf);
  // Subnormals keep their top bits.
  const float tiny = std::numeric_limits<float>::denorm_min() * 65536.0f;
  EXPECT_EQ(bf16_to_float(float_to_bf16(tiny)), tiny);
}

TEST(Bf16, Spans) {
  const std::vector<float> in{1.0f, -3.25f, 1e-3f};
  std::vector<uint16_t> bits(3);
  std::vector<float> out(3);
  float_to_bf16(in, bits);
  bf16_to_float(bits, out);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[i], in[i], std::fabs(in[i]) / 256);
  std::vector<float> empty;
  std::vector<uint16_t> empty_bits;
  EXPECT_NO_THROW(float_to_bf16(empty, empty_bits));
  std::vector<uint16_t> short_bits(2);
  EXPECT_THROW(float_to_bf16(in, short_bits), InputError);
  EXPECT_THROW(bf16_to_float(short_bits, out), InputError);
}

TEST(F16, DecodesNormalsSubnormalsAndSpecials) {
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0xc000), -2.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(f16_to_float(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(f16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_float(0x7e00)));
  EXPECT_TRUE(std::signbit(f16_to_float(0x8000)));
}

}  // namespace
}  // namespace dloco
