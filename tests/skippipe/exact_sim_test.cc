// The SkipPipe simulators against hand cases (issue 13, "Tests"): the exact model on one stage, two micro-batches
// colliding on one node, memory full -> deferral, and a deadlock refused; the reference-compatible model on the
// same collision and deferral, where its busy windows and postponements show. Each timeline is worked out by hand
// in the comments; F/H/B are forward, head + loss and backward, [a, b] the time a node runs an operation.
#include <gtest/gtest.h>

#include <string>

#include "core/check.h"
#include "skippipe/schedule.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"
#include "support/skippipe_setting.h"

namespace dloco::skippipe {
namespace {

// Nodes in one region, every hop 0.1 s latency + 200 B / 1000 B/s + 0.05 s overhead = 0.35 s; head w/4,
// backward 1.5 w.
Setting small_setting(const std::vector<double>& forward_s, int64_t memory) {
  return testing_support::one_region_setting(forward_s, 1000.0, 200, memory);
}

Schedule small_schedule(const Setting& s, const nlohmann::json& placement, const nlohmann::json& micro_batches) {
  const nlohmann::json j = {{"format", "dloco-skippipe-schedule"}, {"version", 1},
                            {"source", "hand case"},              {"method", "hand"},
                            {"placement", placement},             {"micro_batches", micro_batches}};
  return parse_schedule(j, "hand", s);
}

constexpr double kTol = 1e-12;

TEST(SkipPipeExact, OneStage) {
  // Data node 0 (w = 1), stage-1 node 1 (w = 2), one micro-batch, hops 0.35 s:
  //   F(0) [0, 1] -> 1.35: F(1) [1.35, 3.35] -> 3.70: H(0) [3.70, 3.95] -> 4.30: B(1) [4.30, 7.30]
  //   -> 7.65: B(0) [7.65, 9.15]. Iteration 9.15 s; busy: node 0 1 + 0.25 + 1.5 = 2.75, node 1 2 + 3 = 5.
  const Setting s = small_setting({1.0, 2.0}, 1);
  const Schedule sch = small_schedule(s, {{0}, {1}}, {{{"id", 0}, {"data_node", 0}, {"path", {1}}, {"inject_s", 0}}});
  const SimResult r = simulate_exact(s, sch);
  EXPECT_NEAR(r.iteration_time_s, 9.15, kTol);
  EXPECT_NEAR(r.busy_s[0], 2.75, kTol);
  EXPECT_NEAR(r.busy_s[1], 5.0, kTol);
  EXPECT_EQ(r.forwards[1], 1);
  EXPECT_EQ(r.backwards[1], 1);
  EXPECT_EQ(r.completed, 1);
}

TEST(SkipPipeExact, OnlyStageZeroAndALateInjection) {
  // An empty path, injected at 2: F(0) [2, 3], H(0) [3, 3.25], B(0) [3.25, 4.75] with no hop in between.
  const Setting s = small_setting({1.0, 1.0}, 1);
  const Schedule sch = small_schedule(s, {{0}, {1}}, {{{"id", 0}, {"data_node", 0}, {"path", nlohmann::json::array()},
                                                       {"inject_s", 2.0}}});
  const SimResult r = simulate_exact(s, sch);
  EXPECT_NEAR(r.iteration_time_s, 4.75, kTol);
  EXPECT_NEAR(r.busy_s[0], 2.75, kTol);
}

// Two data nodes 0 and 1, both sending their micro-batch a (from 0) and b (from 1) through node 2; w = 1 on all.
const nlohmann::json kTwoOnOne = {{{"id", 0}, {"data_node", 0}, {"path", {2}}, {"inject_s", 0}},
                                  {{"id", 1}, {"data_node", 1}, {"path", {2}}, {"inject_s", 0}}};

TEST(SkipPipeExact, TwoMicroBatchesCollideOnOneNode) {
  // C = 2: only the node's one-at-a-time rule makes b wait.
  //   F_a(0), F_b(1) [0, 1]; both reach node 2 at 1.35; a first (earlier in the schedule).
  //   node 2: F_a [1.35, 2.35], F_b [2.35, 3.35] (b waited 1 s).
  //   a: -> 2.70 H_a(0) [2.70, 2.95] -> 3.30 at node 2, busy with F_b until 3.35: B_a(2) [3.35, 4.85]
  //      -> 5.20 B_a(0) [5.20, 6.70].
  //   b: -> 3.70 H_b(1) [3.70, 3.95] -> 4.30 at node 2, busy with B_a until 4.85: B_b(2) [4.85, 6.35]
  //      -> 6.70 B_b(1) [6.70, 8.20]. Iteration 8.20 s (alone, each would take 6.70 s).
  const Setting s = small_setting({1.0, 1.0, 1.0}, 2);
  const Schedule sch = small_schedule(s, {{0, 1}, {2}}, kTwoOnOne);
  const SimResult r = simulate_exact(s, sch);
  EXPECT_NEAR(r.finish_s[0], 6.70, kTol);
  EXPECT_NEAR(r.finish_s[1], 8.20, kTol);
  EXPECT_NEAR(r.iteration_time_s, 8.20, kTol);
  EXPECT_NEAR(r.busy_s[2], 5.0, kTol);  // 1 + 1 + 1.5 + 1.5
  EXPECT_EQ(r.forwards[2], 2);
  // The order each node ran its operations in (what skippipe/node.h executes): node 2 F_a F_b B_a B_b,
  // node 0 F_a H_a B_a, node 1 F_b H_b B_b.
  using K = SimOpKind;
  const auto order = [&](int node) {
    std::vector<std::pair<int, K>> out;
    for (const SimOp& op : r.node_ops[node]) out.emplace_back(op.micro_batch, op.kind);
    return out;
  };
  EXPECT_EQ(order(2), (std::vector<std::pair<int, K>>{{0, K::kForward}, {1, K::kForward}, {0, K::kBackward},
                                                      {1, K::kBackward}}));
  EXPECT_EQ(order(0), (std::vector<std::pair<int, K>>{{0, K::kForward}, {0, K::kHead}, {0, K::kBackward}}));
  EXPECT_EQ(order(1), (std::vector<std::pair<int, K>>{{1, K::kForward}, {1, K::kHead}, {1, K::kBackward}}));
  EXPECT_NEAR(r.node_ops[2][3].start_s, 4.85, kTol);
}

TEST(SkipPipeExact, MemoryFullDefersTheForward) {
  // C = 1: node 2 holds a's activations from F_a's start to B_a's end, so F_b (arrived at 1.35) is deferred
  // although node 2 idles in [2.35, 3.30].
  //   node 2: F_a [1.35, 2.35]; a: -> 2.70 H_a(0) [2.70, 2.95] -> 3.30 B_a(2) [3.30, 4.80] (memory freed)
  //           F_b [4.80, 5.80].
  //   a: -> 5.15 B_a(0) [5.15, 6.65].
  //   b: -> 6.15 H_b(1) [6.15, 6.40] -> 6.75 B_b(2) [6.75, 8.25] -> 8.60 B_b(1) [8.60, 10.10]. Iteration 10.10 s.
  const Setting s = small_setting({1.0, 1.0, 1.0}, 1);
  const Schedule sch = small_schedule(s, {{0, 1}, {2}}, kTwoOnOne);
  const SimResult r = simulate_exact(s, sch);
  EXPECT_NEAR(r.finish_s[0], 6.65, kTol);
  EXPECT_NEAR(r.finish_s[1], 10.10, kTol);
  EXPECT_NEAR(r.iteration_time_s, 10.10, kTol);
  EXPECT_NEAR(r.busy_s[2], 5.0, kTol);
}

TEST(SkipPipeExact, CrossedPathsWithOneSlotDeadlockAndAreRefused) {
  // C = 1: a holds node 2 and waits for node 3; b holds node 3 and waits for node 2 (b swaps stages 1 and 2).
  const Setting s = small_setting({1.0, 1.0, 1.0, 1.0}, 1);
  const Schedule sch = small_schedule(s, {{0, 1}, {2}, {3}},
                                      {{{"id", 0}, {"data_node", 0}, {"path", {2, 3}}, {"inject_s", 0}},
                                       {{"id", 1}, {"data_node", 1}, {"path", {3, 2}}, {"inject_s", 0}}});
  try {
    simulate_exact(s, sch);
    FAIL() << "a deadlock must be refused";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 micro-batches never finish"), std::string::npos) << e.what();
  }
  // With two slots they pass each other: the same paths complete.
  const Setting roomy = small_setting({1.0, 1.0, 1.0, 1.0}, 2);
  EXPECT_EQ(simulate_exact(roomy, small_schedule(roomy, {{0, 1}, {2}, {3}},
                                                 {{{"id", 0}, {"data_node", 0}, {"path", {2, 3}}, {"inject_s", 0}},
                                                  {{"id", 1}, {"data_node", 1}, {"path", {3, 2}}, {"inject_s", 0}}}))
                .completed,
            2);
}

TEST(SkipPipeReferenceHand, CollisionWithBusyWindows) {
  // The reference on TwoMicroBatchesCollideOnOneNode (C = 2). After each compute a node stays busy 0.09 s (an
  // injected micro-batch) or 0.13 s, and what arrives inside [start, end + window) is postponed to its end.
  //   bucket 1, node 2: F_a [1.35, 2.35], window to 2.48: b (1.35) postponed to 2.48.
  //   bucket 2: node 0 H_a [2.70, 2.95] -> 3.30; node 2 F_b [2.48, 3.48], window to 3.61: a's 3.30 -> 3.61.
  //   bucket 3: node 1 H_b [3.83, 4.08] -> 4.43; node 2 B_a [3.61, 5.11], window to 5.24: b's 4.43 -> 5.24.
  //   bucket 5: node 0 B_a [5.46, 6.96]; node 2 B_b [5.24, 6.74] -> 7.09.  bucket 7: node 1 B_b [7.09, 8.59].
  // (com_sym.py itself, run on this case by hand, returns 8.59 too; and 10.23 on the next one.)
  const Setting s = small_setting({1.0, 1.0, 1.0}, 2);
  const SimResult r = simulate_reference(s, small_schedule(s, {{0, 1}, {2}}, kTwoOnOne));
  EXPECT_NEAR(r.finish_s[0], 6.96, 1e-9);
  EXPECT_NEAR(r.finish_s[1], 8.59, 1e-9);
  EXPECT_NEAR(r.iteration_time_s, 8.59, 1e-9);
  EXPECT_EQ(r.stranded, 0);
}

TEST(SkipPipeReferenceHand, MemoryFullRetriesThenWaitsForTheWindow) {
  // The reference on MemoryFullDefersTheForward (C = 1).
  //   bucket 1, node 2: F_a [1.35, 2.35] (memory 0), window to 2.48: b postponed to 2.48.
  //   bucket 2: node 0 H_a [2.70, 2.95] -> 3.30; node 2 has no memory for b: retried +0.1 s per sweep,
  //             2.58, 2.68, …, 3.08 (into bucket 3).
  //   bucket 3: b retried to 3.18; B_a [3.30, 4.80] frees the slot, window to 4.93 (b at 3.18 < 3.30: not
  //             postponed); next sweep b (3.18) is inside the window: moved to 4.93.
  //   bucket 4: F_b [4.93, 5.93] -> 6.28.  bucket 5: node 0 B_a [5.15, 6.65].
  //   bucket 6: node 1 H_b [6.28, 6.53] -> 6.88; node 2 B_b [6.88, 8.38] -> 8.73.  bucket 8: B_b [8.73, 10.23].
  const Setting s = small_setting({1.0, 1.0, 1.0}, 1);
  const SimResult r = simulate_reference(s, small_schedule(s, {{0, 1}, {2}}, kTwoOnOne));
  EXPECT_NEAR(r.finish_s[0], 6.65, 1e-9);
  EXPECT_NEAR(r.finish_s[1], 10.23, 1e-9);
  EXPECT_NEAR(r.busy_s[2], 5.0, 1e-9);
}

TEST(SkipPipeReferenceHand, ShortComputeMakesTheRetryStepShow) {
  // The same two micro-batches with w = 0.1 s: node 2's window ends before b's retried time catches up, so b runs
  // at a time set by the 0.1 s retry steps. The expected 3.03 s is what com_sym.py itself returns on this case
  // (an independent oracle, not worked out by hand); with a 0.5 s retry it returns 3.155 s. (On the stored
  // schedules and the cases above, the retry step is absorbed by the busy windows: 0.11 or 0.5 s give the same.)
  const Setting s = small_setting({0.1, 0.1, 0.1}, 1);
  const SimResult r = simulate_reference(s, small_schedule(s, {{0, 1}, {2}}, kTwoOnOne));
  EXPECT_NEAR(r.iteration_time_s, 3.03, 1e-9);
  EXPECT_EQ(r.completed, 2);
}

}  // namespace
}  // namespace dloco::skippipe
