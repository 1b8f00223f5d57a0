// The norm screen (syncer/screening.h, docs/protocol.md §10) as a table, and the downlink (syncer/downlink.h).
#include "syncer/screening.h"

#include <cmath>
#include <limits>
#include <vector>

#include "syncer/downlink.h"

#include <gtest/gtest.h>

namespace dloco {
namespace {

using A = ScreenAction;

ScreenEntry honest(double norm) { return {10, norm, norm, false}; }

struct Case {
  const char* name;
  std::vector<ScreenEntry> entries;
  std::deque<double> recent;
  double screen, clip;
  bool enabled;
  std::vector<A> want;
  std::vector<double> want_ratio;  // −1: not compared
  double want_largest;
};

TEST(ScreeningTest, VerdictsFollowTheTable) {
  const std::vector<Case> cases = {
      {"three alike: all kept, ratio 1", {honest(1), honest(1), honest(1)}, {}, 4, 0, true,
       {A::kKeep, A::kKeep, A::kKeep}, {1, 1, 1}, 1},
      {"one 5x the others: refused at 4", {honest(1), honest(1), honest(5)}, {}, 4, 0, true,
       {A::kKeep, A::kKeep, A::kRefuse}, {1, 1, 5}, 1},
      // The lower median of {1, 5} is 1: the refused outlier cannot raise the others' reference.
      {"just under the screen: kept", {honest(1), honest(1), honest(3.99)}, {}, 4, 0, true,
       {A::kKeep, A::kKeep, A::kKeep}, {1, 1, 3.99}, 3.99},
      {"one reference only: nothing to compare", {honest(1), honest(50)}, {}, 4, 0, true, {A::kKeep, A::kKeep},
       {-1, -1}, 0},
      {"recent merges complete the reference", {honest(1), honest(50)}, {1.0}, 4, 0, true, {A::kKeep, A::kRefuse},
       {1, 50}, 1},
      {"clip at 2: scaled, not refused", {honest(1), honest(1), honest(3)}, {}, 0, 2, true,
       {A::kKeep, A::kKeep, A::kClip}, {1, 1, 3}, 2},
      // A raw θ is no reference either: the first two have one reference each, too few to compare.
      {"a raw θ is clipped at the screen, never refused", {honest(1), honest(1), {10, 9, 9, true}}, {}, 4, 0, true,
       {A::kKeep, A::kKeep, A::kClip}, {-1, -1, 9}, 0},
      {"no steps: not screened", {honest(1), honest(1), {0, 100, 100, false}}, {1.0}, 4, 0, true,
       {A::kKeep, A::kKeep, A::kKeep}, {1, 1, -1}, 1},
      {"blocking: off", {honest(1), honest(1), honest(50)}, {}, 4, 0, false, {A::kKeep, A::kKeep, A::kKeep},
       {-1, -1, -1}, 0},
      {"both ratios 0: off", {honest(1), honest(1), honest(50)}, {}, 0, 0, true, {A::kKeep, A::kKeep, A::kKeep},
       {-1, -1, -1}, 0},
      // Re-warming joiners (reference −1) are screened but are no reference: as references their small answers would
      // pull the lower median to 0.01 and refuse the warm learners at 100×.
      {"re-warming joiners are no reference", {honest(1), honest(1), {10, 0.01, -1, false}, {10, 0.01, -1, false}},
       {1.0}, 4, 0, true, {A::kKeep, A::kKeep, A::kKeep, A::kKeep}, {1, 1, 0.01, 0.01}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<ScreenEntry> entries = c.entries;
    const ScreenResult r = screen_answers(entries, c.recent, c.screen, c.clip, c.enabled);
    ASSERT_EQ(r.verdicts.size(), c.want.size());
    for (size_t i = 0; i < c.want.size(); ++i) {
      EXPECT_EQ(r.verdicts[i].action, c.want[i]) << "entry " << i;
      EXPECT_NEAR(r.verdicts[i].ratio, c.want_ratio[i], 1e-12) << "entry " << i;
    }
    EXPECT_NEAR(r.largest_ratio, c.want_largest, 1e-12);
  }
}

TEST(ScreeningTest, AClippedAnswerIsComparedAtItsClippedSizeLater) {
  // Entry 0 (3×) is clipped to 2× before entry 1 is screened: entry 1's reference then holds 2, not 3.
  std::vector<ScreenEntry> entries = {honest(3), honest(1), honest(1)};
  const ScreenResult r = screen_answers(entries, {}, 0, 2);
  ASSERT_EQ(r.verdicts[0].action, ScreenAction::kClip);
  EXPECT_NEAR(r.verdicts[0].scale, 2.0 / 3.0, 1e-7);
  EXPECT_NEAR(entries[0].per_step, 2.0, 1e-6);
  EXPECT_NEAR(entries[0].reference, 2.0, 1e-6);
  EXPECT_NEAR(r.verdicts[1].median, 1.0, 1e-12);  // lower median of {2, 1}
}

TEST(DownlinkTest, Fp32SendsThetaWholeAndChangesNothing) {
  std::vector<float> previous = {1, 2, 3}, theta = {1.5f, 2, 2};
  const Downlink d = encode_downlink(previous, theta, wire::Codec::kFp32, nullptr);
  EXPECT_TRUE(d.whole);
  EXPECT_TRUE(d.reason.empty());
  EXPECT_EQ(theta, (std::vector<float>{1.5f, 2, 2}));
}

TEST(DownlinkTest, AnEncodedUpdateMakesThetaThePreviousPlusTheDecodedUpdate) {
  std::vector<float> previous(256), theta(256);
  for (size_t i = 0; i < previous.size(); ++i) {
    previous[i] = std::sin(0.1f * i);
    theta[i] = previous[i] + 0.01f * std::cos(0.37f * i);
  }
  const std::vector<float> exact = theta;
  const Downlink d = encode_downlink(previous, theta, wire::Codec::kQ8, nullptr);
  ASSERT_FALSE(d.whole);
  std::vector<float> rebuilt;
  ASSERT_EQ(wire::apply_update(previous, d.update, rebuilt), "");
  EXPECT_EQ(theta, rebuilt);  // canonical: what every learner rebuilds
  EXPECT_NE(theta, exact);    // and not the unquantised Θ_p
}

TEST(DownlinkTest, ANonFiniteThetaGoesWhole) {
  std::vector<float> previous = {1, 2}, theta = {std::numeric_limits<float>::infinity(), 2};
  const Downlink d = encode_downlink(previous, theta, wire::Codec::kQ8, nullptr);
  EXPECT_TRUE(d.whole);
  EXPECT_TRUE(std::isinf(theta[0]));
}

}  // namespace
}  // namespace dloco
