// The payload codec (transport/codec.h, issue 14 part 1): the block-absmax integer codecs q8 and q4 against their
// per-element bound on random data of many shapes (sizes 0, 1, not a multiple of the block), the exact wire size,
// decode(encode(x)) idempotent, round half to even, NaN/Inf refused on encode, every malformed payload refused on
// decode with the reason, and a fixed-seed regression of the relative L2 error on Gaussian data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "sim/bandwidth.h"
#include "sim/report.h"
#include "transport/codec.h"

namespace dloco::wire {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> decoded(const Payload& p, int64_t expected = -1) {
  std::vector<float> out;
  const std::string why = decode(p, out, expected);
  EXPECT_EQ(why, "");
  return out;
}

double relative_l2(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(x[i]) * x[i];
  }
  return std::sqrt(num / den);
}

TEST(Codec, IntegerCodecsKeepTheBlockBoundAndTheExactSize) {
  for (Codec codec : {Codec::kQ8, Codec::kQ4}) {
    const int qmax = codec == Codec::kQ8 ? 127 : 7;
    for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, int64_t{256}}) {
      const int64_t B = block == 0 ? default_block(codec) : block;
      for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{63}, size_t{64}, size_t{65}, size_t{1000},
                       size_t{4099}}) {
        SCOPED_TRACE(std::string(to_string(codec)) + " block " + std::to_string(B) + " n " + std::to_string(n));
        auto x = gaussian(n, static_cast<uint32_t>(n * 31 + B));
        for (size_t i = 0; i < n; i += 17) x[i] *= 40;  // heavy tails inside some blocks
        const Payload p = encode(x, codec, block);
        EXPECT_EQ(p.codec, std::string(to_string(codec)) + "/" + std::to_string(B));
        const int64_t blocks = (static_cast<int64_t>(n) + B - 1) / B;
        const int64_t values = codec == Codec::kQ8 ? static_cast<int64_t>(n) : (static_cast<int64_t>(n) + 1) / 2;
        EXPECT_EQ(static_cast<int64_t>(p.bytes.size()), 8 + 4 * blocks + values);
        EXPECT_EQ(static_cast<int64_t>(p.bytes.size()), encoded_bytes(codec, static_cast<int64_t>(n), block));
        const auto y = decoded(p, static_cast<int64_t>(n));
        ASSERT_EQ(y.size(), n);
        for (int64_t b = 0; b < blocks; ++b) {
          float absmax = 0;
          for (int64_t i = b * B; i < std::min<int64_t>(static_cast<int64_t>(n), (b + 1) * B); ++i) {
            absmax = std::max(absmax, std::fabs(x[static_cast<size_t>(i)]));
          }
          // the bound, plus fp32 rounding of x / s and q · s (a few ulps of the block's largest value)
          const double bound = absmax / (2.0 * qmax) + 4 * std::numeric_limits<float>::epsilon() * absmax;
          for (int64_t i = b * B; i < std::min<int64_t>(static_cast<int64_t>(n), (b + 1) * B); ++i) {
            EXPECT_LE(std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]), bound) << "value " << i;
          }
        }
        // Idempotent: what was decoded encodes to the same bytes.
        const Payload again = encode(y, codec, block);
        EXPECT_EQ(again.bytes, p.bytes);
      }
    }
  }
}

TEST(Codec, RoundsHalfToEvenAndZeroBlocksStayZero) {
  // absmax 7 with q4: scale 1, so 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2.
  const std::vector<float> x = {7, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 3.5f};
  const auto y = decoded(encode(x, Codec::kQ4, 64));
  EXPECT_EQ(y, (std::vector<float>{7, 0, 2, 2, 0, -2, 4}));
  const auto zeros = decoded(encode(std::vector<float>(300, 0.0f), Codec::kQ8));
  for (float v : zeros) EXPECT_EQ(v, 0.0f);
}

// The codec as the format's plain formula (codec.h): s_b = max|x| / q_max, q = clamp(nearbyint(x / s_b)), nibble 2i
// in the low half of byte i. The codec's vectorised loops must write exactly these bytes.
std::string reference_bytes(const std::vector<float>& x, Codec codec, int64_t block) {
  const int qm = codec == Codec::kQ8 ? 127 : 7;
  const auto n = static_cast<int64_t>(x.size());
  const int64_t nb = (n + block - 1) / block;
  std::string out(static_cast<size_t>(encoded_bytes(codec, n, block)), '\0');
  const auto count = static_cast<uint64_t>(n);
  std::memcpy(out.data(), &count, sizeof(count));
  auto* q = reinterpret_cast<unsigned char*>(out.data() + 8 + 4 * nb);
  for (int64_t b = 0; b < nb; ++b) {
    float absmax = 0;
    for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) absmax = std::max(absmax, std::fabs(x[i]));
    const float scale = absmax / static_cast<float>(qm);
    std::memcpy(out.data() + 8 + 4 * b, &scale, sizeof(scale));
    for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) {
      const int v = scale > 0 ? std::clamp(static_cast<int>(std::nearbyint(x[i] / scale)), -qm, qm) : 0;
      if (codec == Codec::kQ8) {
        q[i] = static_cast<unsigned char>(static_cast<int8_t>(v));
      } else {
        q[i / 2] = static_cast<unsigned char>(q[i / 2] | (i % 2 == 0 ? v & 0xF : (v & 0xF) << 4));
      }
    }
  }
  return out;
}

TEST(Codec, WritesTheBytesOfThePlainFormula) {
  std::mt19937 rng(7);
  std::student_t_distribution<float> heavy(2.0f);  // heavy tails: blocks with one large value and many small ones
  for (int t = 0; t < 120; ++t) {
    std::vector<float> x(static_cast<size_t>((t * 37) % 3001));
    const float magnitude = std::pow(10.0f, static_cast<float>(t % 24 - 12));
    for (auto& v : x) v = heavy(rng) * magnitude;
    if (t % 7 == 0) {
      for (size_t i = 0; i < x.size(); i += 3) x[i] = 0;
    }
    for (Codec codec : {Codec::kQ8, Codec::kQ4}) {
      for (int64_t block : {1, 3, 63, 64, 256}) {
        ASSERT_EQ(encode(x, codec, block).bytes, reference_bytes(x, codec, block))
            << to_string(codec) << "/" << block << ", " << x.size() << " values at magnitude " << magnitude;
      }
    }
  }
}

TEST(Codec, GaussianRelativeErrorRegression) {
  const auto x = gaussian(1 << 16, 12345);
  const double e8 = relative_l2(x, decoded(encode(x, Codec::kQ8)));
  const double e4 = relative_l2(x, decoded(encode(x, Codec::kQ4)));
  std::printf("relative L2 on N(0, 1), 65536 values: q8/256 %.5f, q4/64 %.5f\n", e8, e4);
  EXPECT_LE(e8, 0.008);
  EXPECT_LE(e4, 0.115);
  EXPECT_GT(e4, e8);
}

TEST(Codec, NonFiniteInputsAreRefusedOnEncode) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(100, 1.0f);
    x[42] = bad;
    for (Codec codec : {Codec::kQ8, Codec::kQ4}) {
      try {
        (void)encode(x, codec);
        ADD_FAILURE() << "encoded a non-finite value as " << to_string(codec);
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("value 42"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_THROW((void)encode(std::vector<float>(4, 1.0f), Codec::kQ8, -1), InputError);
  // fp32 carries it: the syncer refuses the non-finite delta and counts it (syncer_sessions.cc).
  std::vector<float> nan(3, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(encode(nan, Codec::kFp32).bytes.size(), 12u);
}

// Every kind of malformed payload is refused with a reason and nothing is decoded from it.
TEST(Codec, MalformedPayloadsAreRefusedWithTheReason) {
  const auto x = gaussian(100, 7);
  const Payload good8 = encode(x, Codec::kQ8, 64), good4 = encode(x, Codec::kQ4, 64);
  auto refused = [](Payload p, const std::string& want, int64_t expected = -1) {
    std::vector<float> out;
    const std::string why = decode(p, out, expected);
    EXPECT_NE(why.find(want), std::string::npos) << "codec '" << p.codec << "': got '" << why << "'";
  };
  Payload p = good8;
  p.codec = "q8/0";
  refused(p, "unknown codec");
  p.codec = "q8/9999999999";
  refused(p, "unknown codec");
  p.codec = "q3/64";
  refused(p, "unknown codec");
  p = good8;
  p.bytes.pop_back();
  refused(p, "bytes where 100 q8/64 values take");
  p = good8;
  p.bytes += "x";
  refused(p, "bytes where");
  refused(good8, "were expected", 99);
  p = good8;
  p.bytes.resize(3);
  refused(p, "shorter than its 8-byte header");
  p = good8;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(p.bytes.data(), &huge, sizeof(huge));
  refused(p, "claiming");
  for (float scale : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -1.0f,
                      std::numeric_limits<float>::max()}) {
    p = good8;
    std::memcpy(p.bytes.data() + 8 + 4, &scale, sizeof(scale));  // block 1's scale
    refused(p, "block 1 of a q8/64 payload has scale");
  }
  p = good8;
  p.bytes[8 + 4 * 2 + 5] = static_cast<char>(0x80);  // int8 -128
  refused(p, "value 5 of a q8/64 payload is -128");
  p = good4;
  p.bytes[8 + 4 * 2 + 3] = static_cast<char>(0x08);  // nibble -8 at value 6
  refused(p, "value 6 of a q4/64 payload is -8");
  Payload odd = encode(gaussian(5, 1), Codec::kQ4, 64);
  odd.bytes.back() = static_cast<char>(odd.bytes.back() | 0x10);
  refused(odd, "unused half");
  // The old codecs keep their checks.
  p = encode(x, Codec::kBf16);
  p.bytes.pop_back();
  refused(p, "not a whole number of bf16 values");
}

}  // namespace
}  // namespace dloco::wire

namespace dloco::wire {
namespace {

// error_bound bounds ‖x − x̂‖ for every codec (the norm screen's allowance for an error-feedback residual, §10), is
// tight for the integer codecs (within 4× on Gaussian values) and claims nothing for a large declared scale over zeros.
TEST(Codec, TheErrorBoundHoldsAndCannotBeInflatedByADeclaredScale) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0, 1);
  for (const Codec codec : {Codec::kFp32, Codec::kBf16, Codec::kQ8, Codec::kQ4}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(1 + trial * 37);
      const float scale = std::pow(10.0f, static_cast<float>(trial % 7 - 3));
      for (auto& v : x) v = scale * normal(rng);
      const Payload p = encode(x, codec);
      std::vector<float> decoded;
      ASSERT_EQ(decode(p, decoded), "");
      double err = 0;
      for (size_t i = 0; i < x.size(); ++i) err += (double(x[i]) - decoded[i]) * (double(x[i]) - decoded[i]);
      err = std::sqrt(err);
      const double bound = error_bound(p, decoded);
      EXPECT_LE(err, bound + 1e-30) << to_string(codec) << " trial " << trial;
      if ((codec == Codec::kQ8 || codec == Codec::kQ4) && x.size() >= 64) EXPECT_LE(bound, 4 * err) << to_string(codec);
    }
  }
  // q4/64 over 128 zeros with a declared scale of 1e30: decodes to zeros, claims no error.
  Payload zeros = encode(std::vector<float>(128, 0.0f), Codec::kQ4);
  const float big = 1e30f;
  for (int b = 0; b < 2; ++b) std::memcpy(zeros.bytes.data() + 8 + 4 * b, &big, sizeof(big));
  std::vector<float> decoded;
  ASSERT_EQ(decode(zeros, decoded), "");
  EXPECT_EQ(error_bound(zeros, decoded), 0.0);
}

// Found by fuzz/codec.cc: decoding an empty fp32 or bf16 payload passed a null pointer to memcpy (UB, reported by
// UBSan in the sanitized suite).
TEST(Codec, EmptyPayloadsDecodeToNoValues) {
  for (const char* codec : {"fp32", "bf16"}) {
    std::vector<float> out{1.0f};
    EXPECT_EQ(decode({codec, ""}, out), "") << codec;
    EXPECT_TRUE(out.empty()) << codec;
    EXPECT_NE(decode({codec, ""}, out, 3), "") << codec;
  }
}

// A constant signal sent 1,000 rounds: without error feedback the sum of what was sent drifts from the sum of the
// inputs by the codec's bias every round (linearly); with it the gap stays the last residual, within one block's
// bound, at every round. A reset starts from e = 0.
TEST(ErrorFeedback, TheSentSumTracksTheInputSumWithinOneRounding) {
  for (Codec codec : {Codec::kQ4, Codec::kQ8, Codec::kBf16}) {
    SCOPED_TRACE(to_string(codec));
    const auto x = [] {
      std::vector<float> v(100);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.3f + 0.01f * static_cast<float>(i % 7);  // absmax 0.36
      v[0] = 1.0f;                                                                            // sets the scale
      return v;
    }();
    ErrorFeedback feedback;
    std::vector<double> with(x.size(), 0), without(x.size(), 0);
    double worst_with = 0, final_without = 0;
    for (int round = 1; round <= 1000; ++round) {
      std::vector<float> v = x;
      const auto sent = [&] {
        std::vector<float> out;
        EXPECT_EQ(decode(feedback.encode(v, codec), out), "");
        return out;
      }();
      std::vector<float> plain;
      EXPECT_EQ(decode(encode(x, codec), plain), "");
      double gap_with = 0, gap_without = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        with[i] += sent[i];
        without[i] += plain[i];
        gap_with = std::max(gap_with, std::fabs(with[i] - double(x[i]) * round));
        gap_without = std::max(gap_without, std::fabs(without[i] - double(x[i]) * round));
      }
      worst_with = std::max(worst_with, gap_with);
      final_without = gap_without;
    }
    const int qmax = codec == Codec::kQ8 ? 127 : 7;
    const double bound = codec == Codec::kBf16 ? 1.0 / 256 : 1.0 / (2.0 * qmax);  // one rounding at absmax ≈ 1
    std::printf("%s: largest |Σ sent − Σ x| over 1000 rounds %.3g with error feedback, %.3g without at the end\n",
                to_string(codec), worst_with, final_without);
    EXPECT_LE(worst_with, bound * 1.01 + 1e-3) << "the residual grew";
    EXPECT_GT(final_without, 100 * bound) << "without feedback the bias should accumulate";
  }
  ErrorFeedback feedback;
  std::vector<float> v(10, 0.3f);
  v[0] = 1.0f;
  (void)feedback.encode(v, Codec::kQ4);
  EXPECT_FALSE(feedback.residual().empty());
  feedback.reset();
  EXPECT_TRUE(feedback.residual().empty());
}

}  // namespace
}  // namespace dloco::wire

namespace dloco::wire {
namespace {

// The bandwidth simulator (sim/bandwidth.h, `dloco sim bandwidth`) prices int8 and int4 at the codec's own size:
// bits_per_value = 8 · encoded_bytes / n for a fragment-sized n (the 8-byte header is below 1e-6 of it).
// The compressed downlink's one formula: Θ' = Θ + Û in fp32, the same on the syncer and on every learner.
TEST(Codec, ApplyUpdateIsBaseplusTheDecodedUpdateAndRefusesWhatCannotBeApplied) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> base(300), update(300);
  for (auto& x : base) x = g(rng);
  for (auto& x : update) x = 1e-3f * g(rng);
  const wire::Payload u = wire::encode(update, wire::Codec::kQ4);
  std::vector<float> decoded, out;
  ASSERT_EQ(wire::decode(u, decoded), "");
  ASSERT_EQ(wire::apply_update(base, u, out), "");
  ASSERT_EQ(out.size(), base.size());
  for (size_t i = 0; i < base.size(); ++i) ASSERT_EQ(out[i], base[i] + decoded[i]) << i;  // bitwise
  EXPECT_NE(wire::apply_update(std::span<const float>(base).first(299), u, out).find("expected"), std::string::npos);
  std::vector<float> huge(300, 3e38f);
  const wire::Payload big = wire::encode(huge, wire::Codec::kFp32);
  EXPECT_NE(wire::apply_update(huge, big, out).find("not finite"), std::string::npos);  // 3e38 + 3e38 overflows
  wire::Payload cut = u;
  cut.bytes.pop_back();
  EXPECT_NE(wire::apply_update(base, cut, out), "");
}

TEST(Codec, TheBandwidthModelUsesTheCodecsSizes) {
  const int64_t n = int64_t{64} * 1000 * 1000 * 10;  // the 64-bit header costs 8·8 / n = 1e-7 bits a value
  EXPECT_NEAR(dloco::sim::bits_per_value(dloco::sim::Precision::kInt4, 64),
              8.0 * static_cast<double>(encoded_bytes(Codec::kQ4, n, 64)) / static_cast<double>(n), 1e-6);
  EXPECT_NEAR(dloco::sim::bits_per_value(dloco::sim::Precision::kInt8, 256),
              8.0 * static_cast<double>(encoded_bytes(Codec::kQ8, n, 256)) / static_cast<double>(n), 1e-6);
  EXPECT_NEAR(8.0 * static_cast<double>(encoded_bytes(Codec::kQ4, n, 64)) / static_cast<double>(n), 4.5, 1e-6);
}

// `dloco sim bandwidth` prints the int4 point from the real codec's size: q4 with blocks of 64 is 4.5 bits a value
// (4 + 32 / 64, plus an 8-byte header), so one reference fragment (5e9 / 24 values) hidden behind τ = 2 one-second
// steps needs 0.469 Gbit/s, not the 0.430 of blocks of 256.
TEST(Codec, TheSimulatorsReferencePointsUseTheCodecsRealSize) {
  const int64_t n = 5'000'000'000 / 24;
  const std::string out = dloco::sim::format_reference_points({{"q4", n, encoded_bytes(Codec::kQ4, n)}});
  EXPECT_NE(out.find("dloco q4 (its codec: 4.5000 bits a value):   0.469 Gbit/s"), std::string::npos) << out;
}

}  // namespace
}  // namespace dloco::wire
