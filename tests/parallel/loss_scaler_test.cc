// The dynamic loss scaler's logic (parallel/loss_scaler.h) as a table: skip and halve on a non-finite gradient,
// double after growth_interval clean steps, the clean window restarts on a skip, and the bounds hold.
#include <gtest/gtest.h>

#include "core/check.h"
#include "parallel/loss_scaler.h"

namespace dloco {
namespace {

struct Row {
  bool non_finite;   // input: the backward found inf/NaN
  bool step;         // expected decision
  double scale;      // expected S afterwards
  int clean;         // expected clean steps afterwards
};

TEST(LossScaler, Table) {
  LossScalerOptions o;
  o.initial_scale = 8;
  o.growth_interval = 3;
  o.min_scale = 2;
  o.max_scale = 32;
  LossScaler scaler(o);
  const std::vector<Row> rows = {
      {false, true, 8, 1},   {false, true, 8, 2},  {false, true, 16, 0},  // window of 3 clean steps: ×2
      {false, true, 16, 1},  {true, false, 8, 0},                          // skip: ×0.5, window restarts
      {false, true, 8, 1},   {false, true, 8, 2},  {false, true, 16, 0},  // a full window again from the skip
      {false, true, 16, 1},  {false, true, 16, 2}, {false, true, 32, 0},  // up to max_scale
      {false, true, 32, 1},  {false, true, 32, 2}, {false, true, 32, 0},  // capped at max_scale
      {true, false, 16, 0},  {true, false, 8, 0},  {true, false, 4, 0},
      {true, false, 2, 0},   {true, false, 2, 0},                          // floored at min_scale
      {false, true, 2, 1},
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto d = scaler.update(rows[i].non_finite);
    EXPECT_EQ(d.step, rows[i].step) << "row " << i << " " << d.reason;
    EXPECT_DOUBLE_EQ(d.scale, rows[i].scale) << "row " << i << " " << d.reason;
    EXPECT_DOUBLE_EQ(scaler.scale(), rows[i].scale) << "row " << i;
    EXPECT_EQ(scaler.clean_steps(), rows[i].clean) << "row " << i;
    EXPECT_FALSE(d.reason.empty());
  }
}

TEST(LossScaler, DefaultsAndBadOptions) {
  LossScaler scaler;
  EXPECT_DOUBLE_EQ(scaler.scale(), 65536.0);
  for (int i = 0; i < 1999; ++i) ASSERT_TRUE(scaler.update(false).step);
  EXPECT_DOUBLE_EQ(scaler.scale(), 65536.0);
  EXPECT_DOUBLE_EQ(scaler.update(false).scale, 131072.0);  // the 2000th clean step
  auto bad = [](auto edit) {
    LossScalerOptions o;
    edit(o);
    EXPECT_THROW(LossScaler{o}, InputError);
  };
  bad([](LossScalerOptions& o) { o.growth_factor = 1.0; });
  bad([](LossScalerOptions& o) { o.backoff_factor = 1.0; });
  bad([](LossScalerOptions& o) { o.backoff_factor = 0.0; });
  bad([](LossScalerOptions& o) { o.growth_interval = 0; });
  bad([](LossScalerOptions& o) { o.min_scale = 0; });
  bad([](LossScalerOptions& o) { o.min_scale = 4; o.max_scale = 2; o.initial_scale = 3; });
  bad([](LossScalerOptions& o) { o.initial_scale = 1e9; });
}

}  // namespace
}  // namespace dloco
