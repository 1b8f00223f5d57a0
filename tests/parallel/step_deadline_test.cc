// The adaptive deadline of a learner group's steps (parallel/step_deadline.h): the cap until warm-up, then a
// multiple of the slowest of the recent steps, floored and capped; a slow step raises it at once and ages out of
// the window; bad parameters are refused.
#include "parallel/step_deadline.h"

#include <gtest/gtest.h>

#include <limits>

#include "core/check.h"

namespace dloco {
namespace {

TEST(StepDeadline, TheCapUntilWarmUpThenAMultipleOfTheSlowestRecentStepFlooredAndCapped) {
  StepDeadline d(60, 5, 20, 4, 3);
  EXPECT_EQ(d.seconds(), 60) << "no step measured yet";
  d.record(0.05);
  d.record(0.05);
  EXPECT_EQ(d.seconds(), 60) << "2 of 3 warm-up steps";
  d.record(0.05);
  EXPECT_EQ(d.seconds(), 5) << "20 × 0.05 s = 1 s, floored at 5 s";
  d.record(0.5);
  EXPECT_DOUBLE_EQ(d.seconds(), 10) << "a slow step raises it at once: 20 × 0.5 s";
  d.record(10);
  EXPECT_EQ(d.seconds(), 60) << "capped";
  for (int i = 0; i < 4; ++i) d.record(0.4);
  EXPECT_DOUBLE_EQ(d.seconds(), 8) << "the slow steps aged out of the window of 4";
  d.record(-1);
  d.record(std::numeric_limits<double>::quiet_NaN());
  EXPECT_DOUBLE_EQ(d.seconds(), 8) << "a negative or NaN time is not a step";
  EXPECT_EQ(d.cap(), 60);
}

TEST(StepDeadline, RefusesParametersThatCannotWork) {
  EXPECT_THROW(StepDeadline(60, 0), InputError);
  EXPECT_THROW(StepDeadline(4, 5), InputError) << "floor above the cap";
  EXPECT_THROW(StepDeadline(60, 5, 0.5), InputError);
  EXPECT_THROW(StepDeadline(60, 5, 20, 0), InputError);
  EXPECT_THROW(StepDeadline(60, 5, 20, 4, 0), InputError);
  EXPECT_NO_THROW(StepDeadline(5, 5));
}

}  // namespace
}  // namespace dloco
