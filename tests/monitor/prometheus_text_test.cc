// PrometheusText (monitor/prometheus_text.h) renders through prometheus-cpp's serializer: one # HELP and # TYPE per
// metric in the order first added, labels quoted and escaped, non-finite values spelled as the format wants, and
// names that the format refuses caught as bugs.
#include "monitor/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/check.h"

namespace dloco {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(PrometheusText, GroupsSamplesUnderOneHelpAndTypeInTheOrderFirstAdded) {
  PrometheusText m;
  m.gauge("dloco_learner_loss", "The learner's loss.", 4.5, {{"learner", "0"}});
  m.counter("dloco_merges_total", "Merges.", 12);
  m.gauge("dloco_learner_loss", "The learner's loss.", 4.25, {{"learner", "1"}});
  const std::string text = m.str();
  EXPECT_EQ(count(text, "# TYPE dloco_learner_loss gauge\n"), 1u) << text;
  EXPECT_EQ(count(text, "# HELP dloco_learner_loss The learner's loss.\n"), 1u) << text;
  EXPECT_EQ(count(text, "# TYPE dloco_merges_total counter\n"), 1u) << text;
  EXPECT_NE(text.find("dloco_learner_loss{learner=\"0\"} 4.5\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dloco_learner_loss{learner=\"1\"} 4.25\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dloco_merges_total 12\n"), std::string::npos) << text;
  EXPECT_LT(text.find("dloco_learner_loss"), text.find("dloco_merges_total")) << text;
}

TEST(PrometheusText, EscapesLabelValuesAndSpellsNonFiniteValues) {
  PrometheusText m;
  m.gauge("dloco_x", "x", NAN, {{"reason", "a \"quoted\" back\\slash\nnewline"}});
  m.gauge("dloco_y", "y", INFINITY);
  m.gauge("dloco_z", "z", -INFINITY);
  const std::string text = m.str();
  EXPECT_NE(text.find("dloco_x{reason=\"a \\\"quoted\\\" back\\\\slash\\nnewline\"} Nan\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("dloco_y +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dloco_z -Inf\n"), std::string::npos) << text;
}

TEST(PrometheusText, RefusesNamesTheFormatCannotCarry) {
  PrometheusText m;
  EXPECT_THROW(m.counter("dloco_merges", "not _total", 1), InvariantError);
  EXPECT_THROW(m.gauge("9starts_with_a_digit", "bad", 1), InvariantError);
  EXPECT_THROW(m.gauge("dloco_ok", "bad label", 1, {{"__reserved", "x"}}), InvariantError);
  m.gauge("dloco_kind", "a gauge", 1);
  EXPECT_THROW(m.counter("dloco_kind", "now a counter?", 1), InvariantError);
}

}  // namespace
}  // namespace dloco
