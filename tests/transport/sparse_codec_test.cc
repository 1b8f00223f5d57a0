// The sparse codec (transport/sparse_codec.h, issue 33): chunked top-k with 2-bit values. Properties on random data
// of many sizes (0, 1, not a multiple of the chunk) and densities: exactly ⌈L/D⌉ values kept per chunk, the largest in
// magnitude, each within (m − t)/4 of its value with its sign, every dropped one ≤ t, the error bound holds, the wire
// size is the layout's; malformed payloads are refused with the reason; with error feedback the sum of what was sent
// tracks the sum of the inputs (the residual stays bounded while it would grow with every round without it).
#include "transport/sparse_codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/check.h"
#include "transport/codec.h"

namespace dloco::wire {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double l2(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

TEST(SparseCodec, KeepsTheLargestOfEachChunkWithinTheirLevelsAndTheBoundHolds) {
  for (const int64_t density : {64, 16, 8, 2}) {
  for (const int64_t chunk : {64, 256, 4096}) {
    for (const size_t n : {0u, 1u, 63u, 64u, 65u, 4095u, 4096u, 10000u}) {
      const auto x = gaussian(n, static_cast<uint32_t>(n * 7 + chunk + density));
      const Payload p = encode(x, Codec::kTopK, chunk, density);
      EXPECT_EQ(p.codec, "topk/" + std::to_string(chunk) + (density == 64 ? "" : "/" + std::to_string(density)));
      ASSERT_EQ(static_cast<int64_t>(p.bytes.size()),
                encoded_bytes(Codec::kTopK, static_cast<int64_t>(n), chunk, density));
      std::vector<float> y;
      ASSERT_EQ(decode(p, y, static_cast<int64_t>(n)), "") << n;
      ASSERT_EQ(y.size(), n);
      for (size_t lo = 0; lo < n; lo += static_cast<size_t>(chunk)) {
        const size_t hi = std::min(n, lo + static_cast<size_t>(chunk));
        const auto k = static_cast<size_t>(sparse::kept_of(static_cast<int64_t>(hi - lo), density));
        std::vector<float> kept_abs, dropped_abs;
        float t = INFINITY, m = 0;
        for (size_t i = lo; i < hi; ++i) {
          (y[i] != 0 ? kept_abs : dropped_abs).push_back(std::fabs(x[i]));
          if (y[i] != 0) {
            t = std::min(t, std::fabs(x[i]));
            m = std::max(m, std::fabs(x[i]));
            EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << i;
          }
        }
        ASSERT_EQ(kept_abs.size(), k) << "chunk at " << lo << " of " << n;
        for (float d : dropped_abs) EXPECT_LE(d, t) << "a dropped value is larger than a kept one";
        for (size_t i = lo; i < hi; ++i) {
          if (y[i] != 0) EXPECT_LE(std::fabs(std::fabs(y[i]) - std::fabs(x[i])), (m - t) / 4 * (1 + 1e-5) + 1e-12);
        }
      }
      EXPECT_LE(l2(x, y), error_bound(p, y) * (1 + 1e-6) + 1e-12) << n;
    }
  }
  }
}

TEST(SparseCodec, WritesTheDocumentedLayout) {
  // One chunk of 4 values keeps ⌈4/64⌉ = 1: index 1 (−2), t = m = 2, code 3 (hi level, negative). The same bytes pin
  // the Python learner's codec (tests/python/units_test.py).
  const Payload p = encode(std::vector<float>{0.5f, -2.0f, 0.1f, 1.0f}, Codec::kTopK, 64);
  EXPECT_EQ(p.codec, "topk/64");
  std::string want(8 + 8 + 2 + 1, '\0');
  const uint64_t n = 4;
  const float two = 2.0f;
  const uint16_t index = 1;
  std::memcpy(want.data(), &n, 8);
  std::memcpy(want.data() + 8, &two, 4);
  std::memcpy(want.data() + 12, &two, 4);
  std::memcpy(want.data() + 16, &index, 2);
  want[18] = 0x03;
  EXPECT_EQ(p.bytes, want);
  std::vector<float> y;
  ASSERT_EQ(decode(p, y, 4), "");
  EXPECT_EQ(y, (std::vector<float>{0.0f, -2.0f, 0.0f, 0.0f}));
  // One in 2 kept: indices 1 (−2) and 3 (1), t = 1, m = 2, codes 3 (hi, negative) and 0 (lo, positive): 1.25, −1.75.
  const Payload half = encode(std::vector<float>{0.5f, -2.0f, 0.1f, 1.0f}, Codec::kTopK, 64, 2);
  EXPECT_EQ(half.codec, "topk/64/2");
  std::string want2(8 + 8 + 4 + 1, '\0');
  const float one = 1.0f;
  const uint16_t three = 3;
  std::memcpy(want2.data(), &n, 8);
  std::memcpy(want2.data() + 8, &one, 4);
  std::memcpy(want2.data() + 12, &two, 4);
  std::memcpy(want2.data() + 16, &index, 2);
  std::memcpy(want2.data() + 18, &three, 2);
  want2[20] = 0x03;
  EXPECT_EQ(half.bytes, want2);
  ASSERT_EQ(decode(half, y, 4), "");
  EXPECT_EQ(y, (std::vector<float>{0.0f, -1.75f, 0.0f, 1.25f}));
}

TEST(SparseCodec, TheDefaultChunkSendsAbout108TimesFewerBytesThanFp32) {
  const int64_t n = 4096 * 28;
  EXPECT_EQ(encoded_bytes(Codec::kTopK, n, 0), 8 + 28 * (8 + 2 * 64 + 16));
  EXPECT_GT(4.0 * n / static_cast<double>(encoded_bytes(Codec::kTopK, n, 0)), 107.0);
}

TEST(SparseCodec, ADensityOf16Sends28TimesFewerBytesThanFp32And8Sends14) {
  const int64_t n = 4096 * 28;
  EXPECT_EQ(encoded_bytes(Codec::kTopK, n, 0, 16), 8 + 28 * (8 + 2 * 256 + 64));
  EXPECT_EQ(encoded_bytes(Codec::kTopK, n, 0, 8), 8 + 28 * (8 + 2 * 512 + 128));
  EXPECT_GT(4.0 * n / static_cast<double>(encoded_bytes(Codec::kTopK, n, 0, 16)), 28.0);
  EXPECT_GT(4.0 * n / static_cast<double>(encoded_bytes(Codec::kTopK, n, 0, 8)), 14.0);
}

TEST(SparseCodec, NonFiniteValuesAndBadChunksAreRefusedOnEncode) {
  std::vector<float> x(100, 1.0f);
  x[42] = NAN;
  EXPECT_THROW(encode(x, Codec::kTopK), InputError);
  EXPECT_THROW(encode(std::vector<float>(10, 1.0f), Codec::kTopK, 32), InputError);
  EXPECT_THROW(encode(std::vector<float>(10, 1.0f), Codec::kTopK, 1 << 17), InputError);
  EXPECT_THROW(encode(std::vector<float>(10, 1.0f), Codec::kTopK, 64, 1), InputError);
  EXPECT_THROW(encode(std::vector<float>(10, 1.0f), Codec::kTopK, 64, 2048), InputError);
}

TEST(SparseCodec, MalformedPayloadsAreRefusedWithTheReason) {
  const Payload good = encode(gaussian(300, 3), Codec::kTopK, 128);  // chunks of 128, 128, 44: k = 2, 2, 1
  std::vector<float> out;
  ASSERT_EQ(decode(good, out, 300), "");
  auto refused = [&](Payload p, const std::string& what) {
    const std::string why = decode(p, out, 300);
    EXPECT_NE(why.find(what), std::string::npos) << "expected '" << what << "', got '" << why << "'";
  };
  const size_t ranges = 8, indices = 8 + 3 * 8, codes = indices + 2 * 5;
  Payload p = good;
  p.bytes.pop_back();
  refused(p, "bytes where");
  p = good;
  refused({"topk/32", good.bytes}, "unknown codec");
  refused({"topk/0128", good.bytes}, "unknown codec");
  // a density outside [2, 1024], written with a leading zero, or one part too many; another density, another size
  // (64 spelled out: the default has one spelling)
  for (const char* name :
       {"topk/128/1", "topk/128/2048", "topk/128/064", "topk/128/", "topk/128/16/2", "topk/128/x", "topk/128/64"}) {
    refused({name, good.bytes}, "unknown codec");
  }
  refused({"topk/128/16", good.bytes}, "bytes where");
  p = good;
  const float negative = -1.0f;
  std::memcpy(p.bytes.data() + ranges, &negative, 4);
  refused(p, "range");
  p = good;
  const float big = 1.0f, small = 0.5f;  // t > m
  std::memcpy(p.bytes.data() + ranges, &big, 4);
  std::memcpy(p.bytes.data() + ranges + 4, &small, 4);
  refused(p, "range");
  p = good;
  const uint16_t outside = 200;
  std::memcpy(p.bytes.data() + indices, &outside, 2);
  refused(p, "outside the chunk");
  p = good;
  std::memcpy(p.bytes.data() + indices + 2, p.bytes.data() + indices, 2);  // the same index twice
  refused(p, "not after the one before");
  p = good;
  p.bytes[codes + 1] = static_cast<char>(p.bytes[codes + 1] | 0x80);  // K = 5 codes: bits past the fifth
  refused(p, "unused bits");
  EXPECT_NE(decode(good, out, 299), "");
}

TEST(SparseCodec, WithErrorFeedbackTheSentSumTracksTheInputs) {
  // The same vector each round: without error feedback the same few values go every time and the gap to the input
  // sum grows by ~‖x‖ a round; with it, what was dropped is sent later, the gap is the residual and stays bounded.
  const auto x = gaussian(8192, 11);
  const int rounds = 200;
  for (const int64_t density : {64, 16}) {
    ErrorFeedback feedback;
    std::vector<double> sent(x.size(), 0.0), plain(x.size(), 0.0);
    for (int r = 0; r < rounds; ++r) {
      std::vector<float> v = x, y;
      const Payload p = feedback.encode(v, Codec::kTopK, 0, &y, 1.0, density);
      ASSERT_EQ(p.codec, density == 64 ? "topk/4096" : "topk/4096/16");
      for (size_t i = 0; i < x.size(); ++i) sent[i] += y[i];
      std::vector<float> z;
      ASSERT_EQ(decode(encode(x, Codec::kTopK, 0, density), z), "");
      for (size_t i = 0; i < x.size(); ++i) plain[i] += z[i];
    }
    double norm = 0, gap = 0, gap_plain = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      norm += static_cast<double>(x[i]) * x[i];
      gap += std::pow(rounds * static_cast<double>(x[i]) - sent[i], 2);
      gap_plain += std::pow(rounds * static_cast<double>(x[i]) - plain[i], 2);
    }
    norm = std::sqrt(norm);
    EXPECT_GT(std::sqrt(gap_plain), 0.5 * rounds * norm) << "without error feedback most of every round is lost";
    EXPECT_LT(std::sqrt(gap), 0.2 * rounds * norm) << "with it the gap is the residual, not a sum over rounds";
    EXPECT_NEAR(std::sqrt(gap), l2(feedback.residual(), std::vector<float>(x.size(), 0.0f)), 1e-3 * rounds * norm);
  }
}

TEST(SparseCodec, ADecayedResidualCarriesLessThanAFullOne) {
  const auto x = gaussian(4096, 5);
  ErrorFeedback full, decayed;
  for (int r = 0; r < 30; ++r) {
    std::vector<float> a = x, b = x;
    full.encode(a, Codec::kTopK);
    decayed.encode(b, Codec::kTopK, 0, nullptr, 0.5);
  }
  const std::vector<float> zero(x.size(), 0.0f);
  EXPECT_LT(l2(decayed.residual(), zero), l2(full.residual(), zero));
}

}  // namespace
}  // namespace dloco::wire
