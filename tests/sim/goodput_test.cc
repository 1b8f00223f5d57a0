// Analytic and property tests of the goodput simulator (docs/sim.md, issue 3 "Tests").
#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"
#include "sim/goodput_sim.h"

namespace dloco::sim {
namespace {

// A small, fast configuration: 20k chips, 3 simulated days, the committed calibration's pause times.
GoodputConfig small(Method method, int64_t learners = 1) {
  GoodputConfig c;
  c.method = method;
  c.learners = learners;
  c.chips = 20'000;
  c.chip_mtbf_s = 365.0 * 86400 / 20;  // 20x worse than 1 year, so a small cluster fails often
  c.restart_s = 67.0;
  c.downscale_s = 7.64;
  c.upscale_s = 15.77;
  c.upscale_batch_s = 48.61;
  c.horizon_s = 3 * 86400;
  return c;
}

const Method kAllMethods[] = {Method::kDp, Method::kElasticDp, Method::kDiloco, Method::kStreaming,
                              Method::kDecoupled};

TEST(Goodput, NoFailuresGivesFullGoodputAndUptime) {
  for (Method m : kAllMethods) {
    GoodputConfig c = small(m, m == Method::kDp || m == Method::kElasticDp ? 1 : 4);
    c.chip_mtbf_s = 1e30;
    const GoodputResult r = simulate_goodput(c);
    EXPECT_NEAR(r.goodput, 1.0, 1e-12) << to_string(m);
    EXPECT_NEAR(r.uptime, 1.0, 1e-12) << to_string(m);
    EXPECT_EQ(r.failures, 0) << to_string(m);
    EXPECT_EQ(r.lost_chip_s, 0.0) << to_string(m);
  }
}

TEST(Goodput, FailuresCostGoodputForEveryMethod) {
  for (Method m : kAllMethods) {
    const GoodputResult r = simulate_goodput(small(m, 4));
    EXPECT_GT(r.failures, 100) << to_string(m);
    EXPECT_LT(r.goodput, 0.99) << to_string(m);
    EXPECT_GT(r.goodput, 0.0) << to_string(m);
  }
}

TEST(Goodput, OneLearnerEqualsElasticDpOnTheSameChips) {
  for (int64_t chips : {20'000, 300'000}) {
    GoodputConfig elastic = small(Method::kElasticDp);
    elastic.chips = chips;
    GoodputConfig one = elastic;
    one.method = Method::kDecoupled;
    one.learners = 1;
    const GoodputResult a = simulate_goodput(elastic), b = simulate_goodput(one);
    EXPECT_GT(a.failures, 0);
    EXPECT_DOUBLE_EQ(a.goodput, b.goodput) << chips;
    EXPECT_DOUBLE_EQ(a.uptime, b.uptime) << chips;
    EXPECT_EQ(a.pauses, b.pauses) << chips;
  }
}

TEST(Goodput, FallsMonotonicallyWithChips) {
  for (auto [method, learners] : {std::pair{Method::kDp, 1}, {Method::kElasticDp, 1}, {Method::kDecoupled, 4},
                                  {Method::kDiloco, 4}, {Method::kStreaming, 4}}) {
    double previous = 1.0;
    for (int64_t chips : {150'000, 300'000, 600'000, 1'200'000, 2'400'000}) {
      GoodputConfig c = small(method, learners);
      c.chip_mtbf_s = 365.0 * 86400;
      c.chips = chips;
      const double g = simulate_goodput(c).goodput;
      EXPECT_LT(g, previous) << to_string(method) << " at " << chips;
      previous = g;
    }
  }
}

TEST(Goodput, RisesWithLearners) {
  double previous = 0.0;
  for (int64_t m : {1, 2, 4, 8, 16}) {
    GoodputConfig c = small(Method::kDecoupled, m);
    c.chip_mtbf_s = 365.0 * 86400;
    c.chips = 1'200'000;
    const double g = simulate_goodput(c).goodput;
    EXPECT_GT(g, previous) << "M = " << m;
    previous = g;
  }
}

TEST(Goodput, SameSeedSameNumbersOtherSeedOtherNumbers) {
  const GoodputConfig c = small(Method::kStreaming, 4);
  const GoodputResult a = simulate_goodput(c), b = simulate_goodput(c);
  EXPECT_EQ(a.goodput, b.goodput);  // bit-identical
  EXPECT_EQ(a.uptime, b.uptime);
  EXPECT_EQ(a.events, b.events);
  GoodputConfig other = c;
  other.seed = 2;
  EXPECT_NE(simulate_goodput(other).goodput, a.goodput);
}

// Elastic DP with instant returns and no upscale cost is a renewal process: up for Exp(1/r), then paused
// T = detect + downscale, losing on average half a step: goodput ≈ (1 − r·step/2) / (1 + r·T).
TEST(Goodput, ElasticDpMatchesTheRenewalFormula) {
  GoodputConfig c = small(Method::kElasticDp);
  c.return_mean_s = 0.0;
  c.return_dist = ReturnDist::kFixed;
  c.upscale_s = 0.0;
  c.upscale_batch_s = 0.0;
  c.horizon_s = 20 * 86400;
  const double r = static_cast<double>(c.chips) / c.chip_mtbf_s;
  const double pause = c.detect_s + c.downscale_s;
  const double expected = (1 - r * c.step_s / 2) / (1 + r * pause);
  EXPECT_NEAR(simulate_goodput(c).goodput, expected, 0.005);
}

// DP without elasticity, checkpoint every step: uptime = 1 / (1 + r·(detect + restart)).
TEST(Goodput, DpMatchesTheRenewalFormula) {
  GoodputConfig c = small(Method::kDp);
  c.horizon_s = 20 * 86400;
  const double r = static_cast<double>(c.chips) / c.chip_mtbf_s;
  const double expected_uptime = 1 / (1 + r * (c.detect_s + c.restart_s));
  const GoodputResult res = simulate_goodput(c);
  EXPECT_NEAR(res.uptime, expected_uptime, 0.005);
  EXPECT_NEAR(res.goodput, expected_uptime * (1 - r * c.checkpoint_interval_s / 2), 0.005);
}

TEST(Goodput, LongerCheckpointIntervalLosesMoreWork) {
  GoodputConfig c = small(Method::kDp);
  const double every_step = simulate_goodput(c).goodput;
  c.checkpoint_interval_s = 600;
  EXPECT_LT(simulate_goodput(c).goodput, every_step - 0.05);
}

TEST(Goodput, QuorumLowersUptimeNotGoodput) {
  GoodputConfig c = small(Method::kDecoupled, 4);
  c.chip_mtbf_s /= 10;
  const GoodputResult k1 = simulate_goodput(c);
  c.quorum = 4;
  const GoodputResult k4 = simulate_goodput(c);
  EXPECT_DOUBLE_EQ(k1.goodput, k4.goodput);
  EXPECT_LT(k4.uptime, k1.uptime - 0.01);
}

TEST(Goodput, SynchronousGroupsNeverBeatDecoupledLearners) {
  const double decoupled = simulate_goodput(small(Method::kDecoupled, 4)).goodput;
  EXPECT_LT(simulate_goodput(small(Method::kDiloco, 4)).goodput, decoupled);
  EXPECT_LT(simulate_goodput(small(Method::kStreaming, 4)).goodput, decoupled);
}

TEST(Goodput, SlowestSliceSetsTheStepOfASynchronousGroup) {
  GoodputConfig c = small(Method::kElasticDp);
  c.chip_mtbf_s = 1e30;
  c.speed_cv = 0.05;
  const double dp = simulate_goodput(c).goodput;
  c.method = Method::kDecoupled;
  c.learners = 16;
  const double decoupled = simulate_goodput(c).goodput;
  EXPECT_LT(dp, 0.95);       // max of 79 lognormal multipliers with σ = 5% is ≥ 1.05 in practice
  EXPECT_GT(decoupled, dp);  // each learner waits only for its own slowest slice
}

TEST(Goodput, LearnerThatLosesItsStateLosesUnmergedWork) {
  GoodputConfig c = small(Method::kDecoupled, 4);
  const GoodputResult safe = simulate_goodput(c);
  c.learner_fatal_fraction = 1.0;
  const GoodputResult fatal = simulate_goodput(c);
  EXPECT_EQ(safe.learner_losses, 0);
  EXPECT_GT(fatal.learner_losses, 100);
  EXPECT_LT(fatal.goodput, safe.goodput);
}

TEST(Goodput, ReplaysATraceOfFailuresExactly) {
  // Two 1-chip learners, 1 s steps, H = P = 2, 100 s. Learner 0 dies at 50 s, is away 10 s and rejoins in 2 s:
  // it loses 12 s of time plus its unmerged work (H/2 = 1 step on average). (200 − 12 − 1) / 200 = 0.935.
  GoodputConfig c;
  c.method = Method::kDecoupled;
  c.chips = 2;
  c.slice_chips = 1;
  c.learners = 2;
  c.quorum = 1;
  c.inner_steps = 2;
  c.fragments = 2;
  c.step_s = 1.0;
  c.detect_s = 0;
  c.rejoin_s = 2.0;
  c.horizon_s = 100;
  c.chip_mtbf_s = 1.0;  // would fail constantly: the trace replaces the Poisson process
  c.trace = {{50.0, 0, 10.0}};
  const GoodputResult r = simulate_goodput(c);
  EXPECT_EQ(r.failures, 1);
  EXPECT_EQ(r.learner_losses, 1);
  EXPECT_NEAR(r.goodput, 187.0 / 200.0, 1e-9);
  EXPECT_NEAR(r.uptime, 1.0, 1e-12);  // K = 1: the other learner keeps the global model moving
  c.quorum = 2;
  EXPECT_NEAR(simulate_goodput(c).uptime, 88.0 / 100.0, 1e-9);
  // A pause (SIGSTOP) keeps the learner's state: only its 10 s away are lost, and it resumes at once.
  c.quorum = 1;
  c.upscale_s = 0;
  c.trace = {{50.0, 0, 10.0, true}};
  const GoodputResult paused = simulate_goodput(c);
  EXPECT_EQ(paused.learner_losses, 0);
  EXPECT_NEAR(paused.goodput, 190.0 / 200.0, 1e-9);
  c.trace = {{50.0, 5, 10.0}};
  EXPECT_THROW(simulate_goodput(c), InputError);  // no chip 5 of N = 2
}

TEST(Goodput, RejectsBadKnobs) {
  GoodputConfig c = small(Method::kDecoupled, 4);
  c.quorum = 5;
  EXPECT_THROW(simulate_goodput(c), InputError);
  c = small(Method::kDecoupled, 1000);  // 79 slices
  EXPECT_THROW(simulate_goodput(c), InputError);
  c = small(Method::kStreaming, 4);
  c.fragments = 5;  // 24 % 5 != 0
  EXPECT_THROW(simulate_goodput(c), InputError);
  EXPECT_THROW(set_knob(c, "no_such_knob", 1.0), InputError);
  EXPECT_THROW(set_knob(c, "learners", 2.5), InputError);
  EXPECT_THROW(parse_method("sgd"), InputError);
}

}  // namespace
}  // namespace dloco::sim
