// The SkipPipe scheduler (issue 13 part 2, "Tests"): determinism for a seed, the rules of its result checked here
// independently of check_schedule_rules (equal visits per non-zero stage, at most C routes per node, stage 0 first
// and distinct increasing stages, swaps only when allowed), impossible arithmetic refused with a message, the
// scheduler beating the network-oblivious baseline in the simulator, the full pipeline visiting every stage (and
// reproducing the reference's 27-micro-batch time), and a written schedule reading back the same.
// Budgets are iteration counts (no wall clock decides anything), small enough for ASan + UBSan.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "core/check.h"
#include "skippipe/reroute.h"
#include "skippipe/schedule.h"
#include "skippipe/scheduler.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {
namespace {

const std::string kDir = std::string(DLOCO_SOURCE_DIR) + "/configs/skippipe/";

const Setting& reference_setting() {
  static const Setting s = load_setting(kDir + "reference_setting.json");
  return s;
}

SchedulerOptions reference_options(int64_t iterations, uint64_t seed) {
  SchedulerOptions o;
  o.placement = load_schedule(kDir + "skippipe.json", reference_setting()).placement;
  o.iterations = iterations;
  o.seed = seed;
  return o;
}

// A hand setting: data nodes 0, 1 and stages 1..3 of two replicas each, one near (region A) and one far (B):
// stage 1 = {2, 3}, stage 2 = {4, 5}, stage 3 = {6, 7}, B = the odd inner nodes. A hop within A costs
// 0.01 + 200 / 1e6 + 0.05 = 0.0602 s, a hop to or from B 10 + 0.2 + 0.05 = 10.25 s; w = 1 s; C = 3.
Setting hand_setting() {
  nlohmann::json nodes = nlohmann::json::array();
  for (int n = 0; n < 8; ++n) nodes.push_back({{"region", n >= 2 && n % 2 == 1 ? "B" : "A"}, {"forward_s", 1.0}});
  const nlohmann::json j = {
      {"format", "dloco-skippipe-setting"}, {"version", 1}, {"source", "hand case"}, {"regions", {"A", "B"}},
      {"nodes", nodes},
      {"links", {{{"regions", {"A", "B"}}, {"latency_s", 10.0}, {"bandwidth_bytes_per_s", 1000.0}}}},
      {"default_link", {{"latency_s", 0.01}, {"bandwidth_bytes_per_s", 1e6}}}, {"hop_overhead_s", 0.05},
      {"bytes_per_hop", 200}, {"memory_capacity", 3}, {"backward_factor", 1.5}, {"head_factor", 0.25}};
  return parse_setting(j, "hand");
}

SchedulerOptions hand_options() {
  SchedulerOptions o;
  o.placement = std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}};
  o.skip = 0.25;  // round(4 · 0.75) = 3 stages per path: stage 0 + 2 of 3
  o.micro_batches_per_data_node = 3;
  o.iterations = 400;
  return o;
}

// The rules, checked from the schedule alone.
void expect_rules(const Schedule& s, int64_t per_path, int64_t memory, int64_t max_swaps, int64_t visits_each) {
  std::map<int, std::set<std::vector<int>>> routes;
  std::vector<int64_t> visits(s.placement.size(), 0);
  for (const MicroBatch& mb : s.micro_batches) {
    EXPECT_EQ(s.stage_of_node[mb.data_node], 0) << "micro-batch " << mb.id;
    ASSERT_EQ(static_cast<int64_t>(mb.path.size()), per_path) << "micro-batch " << mb.id;
    std::vector<int> route{mb.data_node};
    int64_t inversions = 0;
    std::set<int> seen;
    for (size_t k = 0; k < mb.path.size(); ++k) {
      const int st = s.stage_of_node[mb.path[k]];
      EXPECT_GT(st, 0);
      EXPECT_TRUE(seen.insert(st).second) << "micro-batch " << mb.id << " repeats stage " << st;
      for (size_t q = 0; q < k; ++q) inversions += s.stage_of_node[mb.path[q]] > st ? 1 : 0;
      ++visits[st];
      route.push_back(mb.path[k]);
    }
    EXPECT_LE(inversions, max_swaps) << "micro-batch " << mb.id;
    for (int node : route) routes[node].insert(route);
  }
  for (size_t st = 1; st < visits.size(); ++st) EXPECT_EQ(visits[st], visits_each) << "stage " << st;
  for (const auto& [node, set] : routes) EXPECT_LE(static_cast<int64_t>(set.size()), memory) << "node " << node;
}

TEST(SkipPipeScheduler, SameSeedSameBytesOtherSeedOtherSchedule) {
  const SchedulerResult a = schedule_skippipe(reference_setting(), reference_options(300, 7));
  const SchedulerResult b = schedule_skippipe(reference_setting(), reference_options(300, 7));
  const SchedulerResult c = schedule_skippipe(reference_setting(), reference_options(300, 8));
  EXPECT_EQ(schedule_to_json(a.schedule, {}).dump(), schedule_to_json(b.schedule, {}).dump());
  EXPECT_EQ(a.exact_s, b.exact_s);
  EXPECT_EQ(a.reference_s, b.reference_s);
  EXPECT_NE(schedule_to_json(a.schedule, {}).dump(), schedule_to_json(c.schedule, {}).dump());
}

TEST(SkipPipeScheduler, ReferenceSettingResultKeepsEveryRule) {
  // 5 data nodes x 6 micro-batches x 3 stages = 90 visits: 18 per non-zero stage; C = 3.
  for (int64_t swaps : {0, 1}) {
    SchedulerOptions o = reference_options(300, 1);
    o.max_swaps = swaps;
    const SchedulerResult r = schedule_skippipe(reference_setting(), o);
    SCOPED_TRACE("swaps " + std::to_string(swaps));
    EXPECT_EQ(r.schedule.micro_batches.size(), 30u);
    expect_rules(r.schedule, 3, 3, swaps, 18);
    EXPECT_EQ(check_schedule_rules(r.schedule, reference_setting(), o), "");
    EXPECT_EQ(r.exact_s, simulate_exact(reference_setting(), r.schedule).iteration_time_s);
    // Even 300 moves beat the reference's network-oblivious skip schedule (48.92 s in reference mode).
    EXPECT_LT(r.reference_s, 48.915682705668054);
  }
}

// --budget-s caps the whole search, the placement search included: a search of 10^9 placement swaps and 10^9 path
// moves (hours) ends soon after the budget with a schedule that keeps every rule. The bound is 30x the budget: a
// hang guard, not a speed check.
TEST(SkipPipeScheduler, TheWallTimeBudgetCapsTheWholeSearch) {
  SchedulerOptions o;
  o.stages = 6;
  o.placement_iterations = 1'000'000'000;
  o.iterations = 1'000'000'000;
  o.budget_s = 1.0;
  const SchedulerResult r = schedule_skippipe(reference_setting(), o);
  EXPECT_LT(r.wall_s, 30.0);
  EXPECT_LT(r.iterations_run, o.iterations);
  EXPECT_EQ(check_schedule_rules(r.schedule, reference_setting(), o), "");
}

TEST(SkipPipeScheduler, ObliviousBaselineKeepsTheSameRules) {
  const SchedulerResult r = schedule_oblivious(reference_setting(), reference_options(0, 3));
  expect_rules(r.schedule, 3, 3, 0, 18);
}

TEST(SkipPipeScheduler, ImpossibleArithmeticIsRefusedWithTheReason) {
  auto message = [](const Setting& s, const SchedulerOptions& o) {
    try {
      schedule_skippipe(s, o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SchedulerOptions o = reference_options(10, 1);
  o.data_nodes = 3;
  o.micro_batches_per_data_node = 1;  // 3 x 1 x 3 = 9 visits over 5 stages
  EXPECT_NE(message(reference_setting(), o).find("9 visits do not divide evenly over the 5 non-zero stages"),
            std::string::npos)
      << message(reference_setting(), o);
  o = reference_options(10, 1);
  o.skip = 0.9;  // round(6 · 0.1) = 1 stage: only stage 0
  EXPECT_NE(message(reference_setting(), o).find("no non-zero stage"), std::string::npos);
  o = reference_options(10, 1);
  o.memory = 1'000'000'000;  // --memory 1e9: more than any setting file may say
  EXPECT_NE(message(reference_setting(), o).find("--memory 1000000000: expected at most 1000000"), std::string::npos)
      << message(reference_setting(), o);
  SchedulerOptions h = hand_options();
  h.memory = 2;  // G must divide 3 and be <= 2: G = 1, and 2 x 1 x 2 = 4 route visits over 3 stages
  EXPECT_NE(message(hand_setting(), h).find("no route grouping keeps every node on at most C = 2"), std::string::npos)
      << message(hand_setting(), h);
  h = hand_options();
  h.micro_batches_per_data_node = 2;  // 2 x 2 x 2 = 8 visits over 3 stages
  EXPECT_NE(message(hand_setting(), h).find("8 visits do not divide evenly"), std::string::npos);
  // Values no search can honour are refused with the flag named (a negative swap count used to fail an internal check).
  h = hand_options();
  h.max_swaps = -1;
  EXPECT_EQ(message(hand_setting(), h), "--swaps -1: expected >= 0");
  h = hand_options();
  h.memory = -3;
  EXPECT_EQ(message(hand_setting(), h), "--memory -3: expected >= 0");
  h = hand_options();
  h.budget_s = -1;
  EXPECT_NE(message(hand_setting(), h).find("--budget-s"), std::string::npos);
}

TEST(SkipPipeScheduler, BeatsTheNetworkObliviousScheduleOnAHandSetting) {
  const Setting s = hand_setting();
  const SchedulerResult ours = schedule_skippipe(s, hand_options());
  expect_rules(ours.schedule, 2, 3, 0, 4);  // 2 data nodes x 3 x 2 = 12 visits: 4 per stage
  int64_t strictly = 0;
  for (uint64_t seed : {1, 2, 3, 4}) {
    SchedulerOptions o = hand_options();
    o.seed = seed;
    const SchedulerResult random = schedule_oblivious(s, o);
    expect_rules(random.schedule, 2, 3, 0, 4);
    EXPECT_LE(ours.exact_s, random.exact_s) << "oblivious seed " << seed;
    EXPECT_LE(ours.reference_s, random.reference_s) << "oblivious seed " << seed;
    strictly += ours.exact_s < random.exact_s ? 1 : 0;
    std::printf("[hand] ours exact %.4f reference %.4f | oblivious seed %llu exact %.4f reference %.4f\n",
                ours.exact_s, ours.reference_s, static_cast<unsigned long long>(seed), random.exact_s,
                random.reference_s);
  }
  EXPECT_GT(strictly, 0);
  // Each stage needs 4 route visits (G = 3 routes per data node, one micro-batch each) and the scheduler puts at most
  // C = 3 routes on a node: at least one far visit per stage.
  int64_t far = 0;
  for (const MicroBatch& mb : ours.schedule.micro_batches) {
    for (int node : mb.path) far += node % 2;
  }
  EXPECT_GE(far, 3);
  // And the near nodes are used to the full: C = 3 routes each, so that only the 3 forced far visits remain.
  EXPECT_EQ(far, 3);
}

// Data node 0 in region A and one node per stage, in B, C and D; the links A-B and C-D cost 5 s, every other pair
// 0.05 + 200 / 1e6 + 0.05 s. The increasing path 0 -> 1 -> 2 -> 3 -> 0 pays both slow links; the path with one
// adjacent swap, 0 -> 2 -> 1 -> 3 -> 0, pays neither.
Setting swap_setting() {
  nlohmann::json nodes = nlohmann::json::array();
  for (const char* region : {"A", "B", "C", "D"}) nodes.push_back({{"region", region}, {"forward_s", 1.0}});
  const nlohmann::json j = {
      {"format", "dloco-skippipe-setting"}, {"version", 1}, {"source", "hand case"},
      {"regions", {"A", "B", "C", "D"}}, {"nodes", nodes},
      {"links", {{{"regions", {"A", "B"}}, {"latency_s", 5.0}, {"bandwidth_bytes_per_s", 1e6}},
                 {{"regions", {"C", "D"}}, {"latency_s", 5.0}, {"bandwidth_bytes_per_s", 1e6}}}},
      {"default_link", {{"latency_s", 0.05}, {"bandwidth_bytes_per_s", 1e6}}}, {"hop_overhead_s", 0.05},
      {"bytes_per_hop", 200}, {"memory_capacity", 3}, {"backward_factor", 1.5}, {"head_factor", 0.25}};
  return parse_setting(j, "swaps");
}

TEST(SkipPipeScheduler, AdjacentSwapsOnlyWhenAllowed) {
  const Setting s = swap_setting();
  SchedulerOptions o;
  o.placement = std::vector<std::vector<int>>{{0}, {1}, {2}, {3}};
  o.skip = 0.0;  // every stage, so only the order can change
  o.micro_batches_per_data_node = 2;
  o.iterations = 300;
  const SchedulerResult in_order = schedule_skippipe(s, o);
  expect_rules(in_order.schedule, 3, 3, 0, 2);
  for (const MicroBatch& mb : in_order.schedule.micro_batches) EXPECT_EQ(mb.path, (std::vector<int>{1, 2, 3}));
  o.max_swaps = 1;
  const SchedulerResult swapped = schedule_skippipe(s, o);
  expect_rules(swapped.schedule, 3, 3, 1, 2);
  for (const MicroBatch& mb : swapped.schedule.micro_batches) EXPECT_EQ(mb.path, (std::vector<int>{2, 1, 3}));
  // Both slow links, there and back: 4 x (5 − 0.05) s = 19.8 s saved on the one chain that bounds the makespan.
  EXPECT_NEAR(in_order.exact_s - swapped.exact_s, 19.8, 1e-9);
}

TEST(SkipPipeScheduler, FullPipelineVisitsEveryStageAndMatchesTheReferenceBaseline) {
  SchedulerOptions o = reference_options(0, 1);
  o.data_nodes = 3;
  o.micro_batches_per_data_node = 9;  // the reference's 3 pipelines x 9
  const SchedulerResult r = schedule_full_pipeline(reference_setting(), o);
  ASSERT_EQ(r.schedule.micro_batches.size(), 27u);
  for (const MicroBatch& mb : r.schedule.micro_batches) {
    ASSERT_EQ(mb.path.size(), 5u);
    for (size_t k = 0; k < mb.path.size(); ++k) {
      EXPECT_EQ(r.schedule.stage_of_node[mb.path[k]], static_cast<int>(k + 1));
    }
  }
  EXPECT_EQ(visits_per_stage(r.schedule), (std::vector<int64_t>{27, 27, 27, 27, 27, 27}));
  EXPECT_NEAR(r.reference_s, 79.93971963540922, 1e-9);  // the stored full-pipeline time
  o = reference_options(0, 1);  // the fair 30: all 5 data nodes x 6 on 3 pipelines
  const SchedulerResult fair = schedule_full_pipeline(reference_setting(), o);
  EXPECT_EQ(visits_per_stage(fair.schedule), (std::vector<int64_t>{30, 30, 30, 30, 30, 30}));
}

TEST(SkipPipeScheduler, SearchedPlacementHasTheReferenceShapeAndIsDeterministic) {
  SchedulerOptions o;
  o.stages = 6;
  o.placement_iterations = 40;
  const auto a = search_placement(reference_setting(), o), b = search_placement(reference_setting(), o);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 6u);
  std::set<int> nodes;
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s].size(), s == 0 ? 5u : 3u);
    nodes.insert(a[s].begin(), a[s].end());
  }
  EXPECT_EQ(nodes.size(), 20u);
}

TEST(SkipPipeScheduler, ShippedSchedulesKeepTheRulesAndTheirTimes) {
  // configs/skippipe/dloco_schedule*.json, written by `dloco skippipe schedule` (the command line is in each file's
  // notes): the committed placement with one swap allowed, without swaps, and a searched placement without swaps.
  struct Case {
    const char* file;
    int64_t swaps;
    double reference_s;
  };
  for (const Case& c : {Case{"dloco_schedule.json", 1, 33.05379002209655},
                        Case{"dloco_schedule_no_swaps.json", 0, 34.89137697386478},
                        Case{"dloco_schedule_placed.json", 0, 24.67255226834752}}) {
    SCOPED_TRACE(c.file);
    const Schedule s = load_schedule(kDir + c.file, reference_setting());
    SchedulerOptions o;
    o.max_swaps = c.swaps;
    EXPECT_EQ(check_schedule_rules(s, reference_setting(), o), "");
    expect_rules(s, 3, 3, c.swaps, 18);
    EXPECT_NEAR(simulate_reference(reference_setting(), s).iteration_time_s, c.reference_s, 1e-9);
    // The transcribed NL–London link (0.000237 GB/s, ~132 s a hop) is used by no shipped schedule: the costliest
    // hop of each is the path's real network, a few seconds at most.
    double worst_hop_s = 0;
    for (const auto& mb : s.micro_batches) {
      int at = mb.data_node;
      for (int node : mb.path) {
        worst_hop_s = std::max(worst_hop_s, reference_setting().hop_s(at, node));
        at = node;
      }
      worst_hop_s = std::max(worst_hop_s, reference_setting().hop_s(at, mb.data_node));
    }
    EXPECT_LT(worst_hop_s, 10.0);
  }
  // Below the reference's own SkipPipe schedule (33.31379002209655 s) in its own simulator.
  EXPECT_LT(simulate_reference(reference_setting(), load_schedule(kDir + "dloco_schedule.json", reference_setting()))
                .iteration_time_s,
            33.31379002209655);
}

TEST(SkipPipeScheduler, WrittenScheduleReadsBackWithTheSameTimes) {
  const SchedulerResult r = schedule_skippipe(hand_setting(), hand_options());
  const Schedule back = parse_schedule(schedule_to_json(r.schedule, {"note"}), "written", hand_setting());
  EXPECT_EQ(simulate_exact(hand_setting(), back).iteration_time_s, r.exact_s);
  EXPECT_EQ(simulate_reference(hand_setting(), back).iteration_time_s, r.reference_s);
}

}  // namespace
}  // namespace dloco::skippipe

// Routing around dead nodes (skippipe/reroute.h) on the reference setting's stored SkipPipe schedule: a dead path
// node's micro-batches go to the surviving replicas of its stage (the dead node appears nowhere, every micro-batch
// keeps its id, data node and the stages it visits, in the same order), a stage whose every node died is refused
// naming it, and the re-plan places no dead node and still has equal visits per non-zero stage.
TEST(SkipPipeReroute, DeadNodesAreReplacedByTheirStageReplicasAndAnEmptyStageIsRefused) {
  const std::string dir = std::string(DLOCO_SOURCE_DIR) + "/configs/skippipe/";
  const auto setting = dloco::skippipe::load_setting(dir + "reference_setting.json");
  const auto before = dloco::skippipe::load_schedule(dir + "dloco_schedule.json", setting);
  const int dead = before.placement[2].front();
  const auto after = dloco::skippipe::reroute_around(before, setting, {dead});
  ASSERT_EQ(after.micro_batches.size(), before.micro_batches.size());
  for (size_t i = 0; i < after.micro_batches.size(); ++i) {
    const auto &a = after.micro_batches[i], &b = before.micro_batches[i];
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.data_node, b.data_node);
    ASSERT_EQ(a.path.size(), b.path.size());
    for (size_t j = 0; j < a.path.size(); ++j) {
      EXPECT_NE(a.path[j], dead);
      EXPECT_EQ(after.stage_of_node[static_cast<size_t>(a.path[j])],
                before.stage_of_node[static_cast<size_t>(b.path[j])]) << "micro-batch " << a.id;
    }
  }
  EXPECT_EQ(after.stage_of_node[static_cast<size_t>(dead)], -1);
  std::string why;
  const auto next = dloco::skippipe::replan_around(after, before, setting, &why);
  EXPECT_NE(why.find("re-planned by the scheduler"), std::string::npos) << why;
  for (const auto& m : next.micro_batches) {
    for (int n : m.path) EXPECT_NE(n, dead);
  }
  const auto visits = dloco::skippipe::visits_per_stage(next);
  for (size_t s = 2; s < visits.size(); ++s) EXPECT_EQ(visits[s], visits[1]) << "stage " << s;
  std::set<int> whole_stage(before.placement[3].begin(), before.placement[3].end());
  try {
    (void)dloco::skippipe::reroute_around(before, setting, whole_stage);
    FAIL() << "routed around a stage with no node left";
  } catch (const dloco::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("stage 3 has no node left"), std::string::npos) << e.what();
  }
}
