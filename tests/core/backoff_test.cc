// The jittered exponential backoff: bounds, growth, cap, reset, determinism for a seed.
#include "core/backoff.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"

namespace dloco {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(Backoff, DelaysStayWithinTheJitterBoundsAndTheCap) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    BackoffConfig config{milliseconds(100), milliseconds(3000), 2.0, 0.25, seed};
    Backoff backoff(config);
    for (int k = 0; k < 12; ++k) {
      const double base = std::min(3000.0, 100.0 * std::pow(2.0, k)) * 1000.0;  // us
      const double d = static_cast<double>(backoff.next_delay().count());
      EXPECT_GE(d, std::floor(base * 0.75) - 1) << "attempt " << k;
      EXPECT_LE(d, std::min(3e6, base * 1.25)) << "attempt " << k;
    }
    EXPECT_EQ(backoff.attempts(), 12);
  }
}

TEST(Backoff, NoJitterIsExactlyExponentialUntilTheCap) {
  Backoff backoff(BackoffConfig{milliseconds(10), milliseconds(100), 3.0, 0.0, 1});
  EXPECT_EQ(backoff.next_delay(), milliseconds(10));
  EXPECT_EQ(backoff.next_delay(), milliseconds(30));
  EXPECT_EQ(backoff.next_delay(), milliseconds(90));
  EXPECT_EQ(backoff.next_delay(), milliseconds(100));
  EXPECT_EQ(backoff.next_delay(), milliseconds(100));
  backoff.reset();
  EXPECT_EQ(backoff.attempts(), 0);
  EXPECT_EQ(backoff.next_delay(), milliseconds(10));
}

TEST(Backoff, SameSeedSameDelaysOtherSeedOtherDelays) {
  const BackoffConfig config{milliseconds(50), milliseconds(10000), 2.0, 0.5, 42};
  Backoff a(config), b(config);
  BackoffConfig other = config;
  other.seed = 43;
  Backoff c(other);
  int differ = 0;
  for (int k = 0; k < 10; ++k) {
    const microseconds x = a.next_delay();
    EXPECT_EQ(x, b.next_delay());
    differ += x != c.next_delay();
  }
  EXPECT_GT(differ, 5);
}

TEST(Backoff, JitterSpreadsDelays) {
  Backoff backoff(BackoffConfig{milliseconds(1000), milliseconds(1000), 1.0, 0.5, 9});
  microseconds lo = microseconds::max(), hi = microseconds::zero();
  for (int k = 0; k < 200; ++k) {
    const microseconds d = backoff.next_delay();
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  EXPECT_LT(lo, milliseconds(650));   // the lower half of [500, 1000] ms is reached
  EXPECT_LE(hi, milliseconds(1000));  // the cap holds even with upward jitter
  EXPECT_GT(hi, milliseconds(950));
}

TEST(Backoff, RefusesBadConfig) {
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(0), milliseconds(10), 2.0, 0.1, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(20), milliseconds(10), 2.0, 0.1, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(1), milliseconds(10), 0.5, 0.1, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(1), milliseconds(10), 2.0, 1.0, 0}), InputError);
  EXPECT_THROW(Backoff(BackoffConfig{milliseconds(1), milliseconds(10), 2.0, -0.1, 0}), InputError);
}

}  // namespace
}  // namespace dloco
