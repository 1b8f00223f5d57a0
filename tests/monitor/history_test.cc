// MetricHistory (monitor/history.h): samples at one clock, series absent where they were not reported, and a run of
// any length held in bounded memory with its whole span.
#include "monitor/history.h"

#include <gtest/gtest.h>

namespace dloco {
namespace {

TEST(MetricHistory, AlignsSeriesAtOneClockWithNullWhereAbsent) {
  MetricHistory h(8, 1.0);
  EXPECT_TRUE(h.add(0, {{"bytes", 10}}));
  EXPECT_TRUE(h.add(1, {{"bytes", 20}, {"learner/1/loss", 5.0}}));
  EXPECT_TRUE(h.add(1.5, {{"bytes", 25}}));
  EXPECT_EQ(h.to_json()["series"]["bytes"].back(), 25.0) << "the newest values are always there";
  EXPECT_FALSE(h.add(0.5, {{"bytes", 25}})) << "earlier than the newest sample";
  EXPECT_TRUE(h.add(2, {{"bytes", 30}})) << "replaces 1.5, which was closer than the spacing to 1";
  EXPECT_TRUE(h.add(2.2, {{"bytes", 31}})) << "opens the next interval";
  const auto j = h.to_json();
  EXPECT_EQ(j["t"], nlohmann::json({0.0, 1.0, 2.0, 2.2}));
  EXPECT_EQ(j["series"]["bytes"], nlohmann::json({10.0, 20.0, 30.0, 31.0}));
  EXPECT_EQ(j["series"]["learner/1/loss"], nlohmann::json({nullptr, 5.0, nullptr, nullptr}));
}

TEST(MetricHistory, NonFiniteValuesAreNull) {
  MetricHistory h(8, 0.0);
  h.add(0, {{"loss", std::numeric_limits<double>::quiet_NaN()}});
  EXPECT_EQ(h.to_json()["series"]["loss"], nlohmann::json({nullptr}));
}

TEST(MetricHistory, ALongRunKeepsItsWholeSpanWithinCapacity) {
  MetricHistory h(16, 1.0);
  for (int t = 0; t <= 10000; ++t) h.add(t, {{"step", static_cast<double>(t)}});
  EXPECT_LE(h.size(), 16u);
  EXPECT_GE(h.size(), 8u);
  const auto j = h.to_json();
  EXPECT_EQ(j["t"].front(), 0.0) << "the start of the run is kept";
  EXPECT_EQ(j["t"].back(), 10000.0) << "the newest sample is there";
  EXPECT_GE(h.spacing_s(), 10000.0 / 16) << "the spacing grew with the run";
  const auto& t = j["t"];
  for (size_t i = 1; i < t.size(); ++i) EXPECT_LT(t[i - 1].get<double>(), t[i].get<double>());
  EXPECT_EQ(j["series"]["step"], t) << "each value stayed with its time";
}

}  // namespace
}  // namespace dloco
