// The bandwidth model against hand-computed values and the spec's reference points.
#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "sim/bandwidth.h"

namespace dloco::sim {
namespace {

TEST(Bandwidth, BitsPerValue) {
  EXPECT_EQ(bits_per_value(Precision::kBf16, 256), 16.0);
  EXPECT_EQ(bits_per_value(Precision::kInt4, 256), 4.125);  // 4 bits + one fp32 scale per 256 values
  EXPECT_EQ(bits_per_value(Precision::kInt8, 64), 8.5);
  EXPECT_EQ(bits_per_value(Precision::kFp4, 256), 4.0);
}

TEST(Bandwidth, HiddenFragmentFormulaByHand) {
  // 5e9 values · 16 bit / 24 fragments / (2 steps · 1 s) = 1.6667e9 bit/s.
  EXPECT_NEAR(hidden_fragment_bandwidth(5e9, Precision::kBf16, 256, 24, 2, 1.0), 5e9 * 16 / 24 / 2 / 1e9, 1e-12);
  EXPECT_NEAR(hidden_fragment_bandwidth(5e9, Precision::kInt4, 256, 24, 2, 1.0), 0.4296875, 1e-9);
}

TEST(Bandwidth, SpecReferencePointsWithinTenPercent) {
  EXPECT_NEAR(hidden_fragment_bandwidth(5e9, Precision::kBf16, 256, 24, 2, 1.0), 1.7, 0.17);
  EXPECT_NEAR(hidden_fragment_bandwidth(5e9, Precision::kInt4, 256, 24, 2, 1.0), 0.43, 0.043);
  BandwidthModel dp;
  dp.params = 5e9;
  dp.step_s = 1.0;
  EXPECT_NEAR(required_bandwidth(SyncMethod::kDp, dp, 0.9), 104.0, 10.4);
}

TEST(Bandwidth, DilocoByHand) {
  // 1e9 bf16 values at 16 Gbit/s: 1 s of transfer every 100 steps of 0.1 s; the backward (2/3 · 0.1 s) hides
  // part of it: CU = 10 / (10 + 1 − 0.0667).
  BandwidthModel m;
  EXPECT_NEAR(compute_utilization(SyncMethod::kDiloco, m, 16.0), 10.0 / (10.0 + 1.0 - 0.2 / 3), 1e-12);
}

TEST(Bandwidth, StreamingByHand) {
  // P = 8: a fragment of 2e9 bits every 12.5 steps. At 1 Gbit/s it takes 2 s; τ = 1 step plus the backward
  // hide 0.1667 s, so each sync blocks 1.8333 s: CU = 1.25 / (1.25 + 1.8333). With τ = 0 only the backward hides.
  BandwidthModel m;
  EXPECT_NEAR(compute_utilization(SyncMethod::kStreaming, m, 1.0), 1.25 / (1.25 + 2.0 - 0.1 - 0.2 / 3), 1e-12);
  m.overlap_steps = 0;
  EXPECT_NEAR(compute_utilization(SyncMethod::kStreaming, m, 1.0), 1.25 / (1.25 + 2.0 - 0.2 / 3), 1e-12);
}

TEST(Bandwidth, DpIsComputeBoundOnAFastLinkAndLinkBoundOnASlowOne) {
  BandwidthModel m;
  EXPECT_GT(compute_utilization(SyncMethod::kDp, m, 1e6), 0.999);
  // 16 Gbit of gradients per step at 1.6 Gbit/s: the link needs 10 s per 0.1 s step; CU ≈ 0.1 / 10.
  EXPECT_NEAR(compute_utilization(SyncMethod::kDp, m, 1.6), 0.1 / 10.0, 0.0005);
}

TEST(Bandwidth, UtilisationRisesWithBandwidthAndSolverInvertsIt) {
  for (SyncMethod method : {SyncMethod::kDp, SyncMethod::kDiloco, SyncMethod::kStreaming}) {
    BandwidthModel m;
    double previous = 0.0;
    for (double w = 0.1; w < 1e4; w *= 3) {
      const double cu = compute_utilization(method, m, w);
      EXPECT_GE(cu, previous) << to_string(method) << " at " << w;
      previous = cu;
    }
    const double need = required_bandwidth(method, m, 0.9);
    EXPECT_GE(compute_utilization(method, m, need), 0.9);
    EXPECT_LT(compute_utilization(method, m, need * 0.999), 0.9);
  }
}

TEST(Bandwidth, LowerPrecisionAndOverlapNeedLessBandwidth) {
  BandwidthModel m;
  m.overlap_steps = 0;
  const double blocking = required_bandwidth(SyncMethod::kStreaming, m, 0.95);
  m.overlap_steps = 1;
  const double overlap = required_bandwidth(SyncMethod::kStreaming, m, 0.95);
  m.outer_precision = Precision::kFp4;
  const double fp4 = required_bandwidth(SyncMethod::kStreaming, m, 0.95);
  EXPECT_LT(overlap, blocking);
  EXPECT_NEAR(fp4, overlap / 4, overlap * 1e-3);  // 4 bits instead of 16, everything else equal
}

TEST(Bandwidth, PaperGridFloor) {
  EXPECT_NEAR(paper_grid_floor(100.0), 86.85, 0.01);
  EXPECT_NEAR(paper_grid_floor(86.86), 86.85, 0.01);
  EXPECT_NEAR(paper_grid_floor(1.5), 1.39, 0.01);
}

TEST(Bandwidth, Table4DpRowOfTheOneBillionModelLandsOnThePapersGrid) {
  const BandwidthReference& dp = table4_references().front();
  ASSERT_EQ(dp.method_label, "DP");
  for (size_t i = 0; i < dp.paper_gbps.size(); ++i) {
    const double ours = required_bandwidth(dp.method, dp.model, reference_cu_targets()[i]);
    EXPECT_NEAR(paper_grid_floor(ours), dp.paper_gbps[i], 0.1) << "CU " << reference_cu_targets()[i];
  }
}

TEST(Bandwidth, RejectsBadInput) {
  BandwidthModel m;
  EXPECT_THROW(compute_utilization(SyncMethod::kDp, m, 0.0), InputError);
  EXPECT_THROW(required_bandwidth(SyncMethod::kDp, m, 1.0), InputError);
  m.workers = 1;
  EXPECT_THROW(compute_utilization(SyncMethod::kDp, m, 1.0), InputError);
  EXPECT_THROW(parse_precision("int3"), InputError);
}

}  // namespace
}  // namespace dloco::sim
