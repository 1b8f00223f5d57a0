// `dloco skippipe train` as real processes (skippipe/launcher.h, skippipe/node_run.h): the hand
// 3-stage setting of skippipe_node_test (5 nodes: stage 0 data nodes 0 and 1, stage 1 replicas 2 and 3, stage 2
// node 4 alone) and its 6 micro-batches with skips, a tiny GPT of 3 blocks on the tiny corpus made by the real
// dloco-data tool. Asserted:
//   - 2 iterations with emulated links exit 0, every node writes its JSON with 2 iterations, the losses are finite
//     and equal on all nodes (each node's loss comes from one all-gather), replicas of a stage end with equal
//     parameter hashes (bitwise equal parameters) and different stages with different hashes (the hash sees them);
//   - node 2 killing itself at iteration 1 (DLOCO_SKIPPIPE_KILL=2:1) makes the command exit non-zero naming
//     "node 2 killed by signal 9", the other nodes stop on their own (a CollectiveError, exit 75) before the
//     parent's kill, and the whole command ends before the deadline (the nodes' --timeout-s plus the parent's 5 s
//     plus start-up), the only wall-clock assertion;
//   - --compute-scale 0.01 (with --link-scale 0.01) gives every node the same losses and parameter hash as a run
//     without emulation, bitwise, and some node slept to pad its compute;
//   - node 4 hanging at iteration 1 (DLOCO_SKIPPIPE_HANG=4:1, --timeout-s 5): the others stop at their deadline
//     (exit 75), the parent SIGTERMs node 4 after the deadline + 5 s and names it ("node 4 killed by signal 15");
//   - bad input (a setting with a node the schedule does not place; 3 stages and 4 blocks) exits 2 with the
//     reason and starts no process (no node log); so do --iterations 0 and a negative --compute-scale.
// Faults are triggered at iterations, never at seconds. DLOCO_TEST_SLOWDOWN scales only the deadline bound: the
// nodes have no slowdown knob (their compute is real).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/skippipe_setting.h"
#include "support/tiny_corpus.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
namespace ts = testing_support;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";
constexpr int kNodes = 5;
constexpr double kTimeout_s = 20;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SkipPipeProcessTest : public ::testing::Test {
 protected:
  // One corpus for the suite (dloco-data takes seconds under load).
  static void SetUpTestSuite() { corpus_ = ts::make_tiny_corpus("dloco_skipproc", kDataTool); }
  static void TearDownTestSuite() { ts::remove_unless_kept(corpus_); }

  void SetUp() override {
    root_ = corpus_;
    ASSERT_FALSE(root_.empty()) << "dloco-data failed";
    write_config("config.toml", 3);
    write_config("config4.toml", 4);
    std::ofstream(root_ / "setting.json") << ts::one_region_setting_json({1, 1, 1, 1, 1.5}, 1e6, 16384, 2).dump(1);
    std::ofstream(root_ / "setting6.json")
        << ts::one_region_setting_json({1, 1, 1, 1, 1.5, 1}, 1e6, 16384, 2).dump(1);
    // skippipe_node_test's hand schedule: stage 1 visited 4 times, stage 2 three times, micro-batch 4 only stage 0.
    nlohmann::json mbs = nlohmann::json::array();
    const std::vector<std::pair<int, std::vector<int>>> paths = {{0, {2}}, {1, {4}}, {0, {3, 4}},
                                                                 {1, {2, 4}}, {0, {}}, {1, {3}}};
    for (size_t i = 0; i < paths.size(); ++i) {
      mbs.push_back({{"id", i}, {"data_node", paths[i].first}, {"path", paths[i].second}, {"inject_s", 0}});
    }
    const nlohmann::json schedule = {{"format", "dloco-skippipe-schedule"}, {"version", 1},
                                     {"source", "hand case"},              {"method", "hand"},
                                     {"placement", {{0, 1}, {2, 3}, {4}}}, {"micro_batches", mbs}};
    std::ofstream(root_ / "schedule.json") << schedule.dump(1);
    // A skip schedule the scheduler could have made (every path one non-zero stage, 3 visits per stage), for the
    // re-routing tests: stage 1 served by node 2 (micro-batches 0, 4) and node 3 (2), stage 2 by node 4 (1, 3, 5).
    nlohmann::json uniform = schedule;
    uniform["micro_batches"] = nlohmann::json::array();
    const std::vector<std::pair<int, int>> hops = {{0, 2}, {1, 4}, {0, 3}, {1, 4}, {0, 2}, {1, 4}};
    for (size_t i = 0; i < hops.size(); ++i) {
      uniform["micro_batches"].push_back(
          {{"id", i}, {"data_node", hops[i].first}, {"path", {hops[i].second}}, {"inject_s", 0}});
    }
    std::ofstream(root_ / "uniform.json") << uniform.dump(1);
  }

  void write_config(const std::string& name, int n_layer) {
    std::ofstream(root_ / name) << "[model]\npreset = \"tiny\"\nvocab_size = 400\nd_model = 32\nn_layer = "
                                << n_layer << "\nseq_len = 32\n[data]\ndir = \"" << (root_ / "data").string()
                                << "\"\n[train]\nbatch_size = 2\ngrad_accum = 6\ntotal_tokens = 100000\n"
                                << "lr = 1e-3\nwarmup_steps = 1\ngrad_clip = 1.0\n[run]\nseed = 42\n";
  }

  // Runs `dloco skippipe train` with `extra` flags (and `env` before it), output in root/<name>.log; returns the
  // exit status (WEXITSTATUS) and the wall seconds.
  std::pair<int, double> train(const std::string& name, const std::string& extra, const std::string& env = "",
                               const std::string& config = "config.toml", const std::string& setting = "setting.json",
                               const std::string& schedule = "schedule.json") {
    const std::string cmd = env + " " + kDloco + " skippipe train --config " + (root_ / config).string() +
                            " --setting " + (root_ / setting).string() + " --schedule " +
                            (root_ / schedule).string() + " --out " + (root_ / name).string() + " " + extra +
                            " > " + (root_ / (name + ".log")).string() + " 2>&1";
    const auto began = std::chrono::steady_clock::now();
    const int rc = std::system(cmd.c_str());
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, wall};
  }

  static inline fs::path corpus_;
  fs::path root_;
};

TEST_F(SkipPipeProcessTest, TwoIterationsLossesEqualReplicasBitwiseEqual) {
  const auto [rc, wall] = train("ok", "--iterations 2 --link-scale 0.01 --timeout-s 60");
  const std::string log = slurp(root_ / "ok.log");
  ASSERT_EQ(rc, 0) << log;
  std::printf("%s(wall %.1f s)\n", log.c_str(), wall);
  EXPECT_NE(log.find("simulated_s"), std::string::npos);
  EXPECT_NE(log.find("compute is real, not emulated"), std::string::npos);
  std::vector<nlohmann::json> nodes;
  for (int n = 0; n < kNodes; ++n) {
    const fs::path p = root_ / "ok" / ("node_" + std::to_string(n) + ".json");
    ASSERT_TRUE(fs::exists(p)) << p;
    nodes.push_back(nlohmann::json::parse(std::ifstream(p)));
    ASSERT_EQ(nodes.back()["iterations"].size(), 2u);
    EXPECT_EQ(nodes.back()["node"], n);
  }
  for (int k = 0; k < 2; ++k) {
    const double loss = nodes[0]["iterations"][k]["loss"];
    EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
    for (const auto& j : nodes) {
      EXPECT_EQ(j["iterations"][k]["loss"].get<double>(), loss) << "node " << j["node"] << " iteration " << k;
      EXPECT_EQ(j["iterations"][k]["grad_norm"].get<double>(), nodes[0]["iterations"][k]["grad_norm"].get<double>());
    }
  }
  // The stage-1 replicas and the stage-0 data nodes each end bitwise equal; stages differ.
  EXPECT_EQ(nodes[0]["param_hash"], nodes[1]["param_hash"]);
  EXPECT_EQ(nodes[2]["param_hash"], nodes[3]["param_hash"]);
  EXPECT_NE(nodes[0]["param_hash"], nodes[2]["param_hash"]);
  EXPECT_NE(nodes[2]["param_hash"], nodes[4]["param_hash"]);
  // Links were emulated: some node's receives were held.
  double waited = 0;
  for (const auto& j : nodes) waited += j["iterations"][0]["link_wait_s"].get<double>();
  EXPECT_GT(waited, 0);
}

TEST_F(SkipPipeProcessTest, KilledNodeIsNamedAndTheOthersStopWithinTheDeadline) {
  const auto [rc, wall] = train("kill", "--iterations 3 --on-failure stop --timeout-s " + std::to_string(kTimeout_s),
                                "DLOCO_SKIPPIPE_KILL=2:1");
  const std::string log = slurp(root_ / "kill.log");
  std::printf("%s(wall %.1f s)\n", log.c_str(), wall);
  EXPECT_NE(rc, 0);
  // Only node 2 is blamed: the survivors' exits (75, a peer failed) are told from its death.
  EXPECT_NE(log.find("skippipe train: node 2 killed by signal 9 (5 of 5"), std::string::npos) << log;
  EXPECT_EQ(log.find("killing them"), std::string::npos) << "the survivors should stop on their own";
  for (int n : {0, 1, 3, 4}) {
    EXPECT_NE(slurp(root_ / "kill" / ("node_" + std::to_string(n) + ".log")).find("stopped:"), std::string::npos)
        << "node " << n;
    EXPECT_FALSE(fs::exists(root_ / "kill" / ("node_" + std::to_string(n) + ".json")));
  }
  // The deadline: after the death the others have kTimeout_s (their waits) + 5 s (the parent's grace); before it,
  // the start of 5 LibTorch processes and iteration 0 took up to ~55 s under nice 19 on 2 loaded cores.
  EXPECT_LT(wall, (kTimeout_s + 5 + 120) * ts::test_slowdown());
}

// Emulated compute (--compute-scale 0.01: forwards of 10–15 ms against a real ~1 ms) changes no number: every
// node's losses and parameter hash equal those of a run without it, bitwise (also a check that two runs from the
// same seed are deterministic), and some node slept to pad its compute.
TEST_F(SkipPipeProcessTest, EmulatedComputeChangesNoNumber) {
  const auto [rc0, wall0] = train("plain", "--iterations 2");
  ASSERT_EQ(rc0, 0) << slurp(root_ / "plain.log");
  const auto [rc1, wall1] = train("padded", "--iterations 2 --compute-scale 0.01 --link-scale 0.01");
  const std::string log = slurp(root_ / "padded.log");
  ASSERT_EQ(rc1, 0) << log;
  std::printf("%s(wall %.1f s; without emulation %.1f s)\n", log.c_str(), wall1, wall0);
  EXPECT_NE(log.find("padded by sleeps"), std::string::npos);
  double padded = 0;
  for (int n = 0; n < kNodes; ++n) {
    const std::string file = "node_" + std::to_string(n) + ".json";
    const auto a = nlohmann::json::parse(std::ifstream(root_ / "plain" / file));
    const auto b = nlohmann::json::parse(std::ifstream(root_ / "padded" / file));
    EXPECT_EQ(a["param_hash"], b["param_hash"]) << "node " << n;
    for (int k = 0; k < 2; ++k) {
      EXPECT_EQ(a["iterations"][k]["loss"].get<double>(), b["iterations"][k]["loss"].get<double>());
      EXPECT_EQ(a["iterations"][k]["compute_pad_s"].get<double>(), 0.0);
      padded += b["iterations"][k]["compute_pad_s"].get<double>();
    }
  }
  EXPECT_GT(padded, 0);
}

// A node that hangs (alive, its sockets open) instead of dying: the others' waits pass their deadline
// (CollectiveError, exit 75), and the parent stops the hung node S + 5 s after the first of them stopped.
TEST_F(SkipPipeProcessTest, HungNodeIsNamedAfterTheDeadline) {
  constexpr double kShortTimeout_s = 5;
  const auto [rc, wall] = train("hang", "--iterations 3 --on-failure stop --timeout-s " +
                                std::to_string(kShortTimeout_s), "DLOCO_SKIPPIPE_HANG=4:1");
  const std::string log = slurp(root_ / "hang.log");
  std::printf("%s(wall %.1f s)\n", log.c_str(), wall);
  EXPECT_NE(rc, 0);
  EXPECT_NE(log.find("skippipe train: node 4 killed by signal 15 (5 of 5"), std::string::npos) << log;
  EXPECT_NE(log.find("killing them"), std::string::npos) << log;
  for (int n : {0, 1, 2, 3}) {
    EXPECT_NE(slurp(root_ / "hang" / ("node_" + std::to_string(n) + ".log")).find("stopped:"), std::string::npos)
        << "node " << n;
  }
  EXPECT_LT(wall, (2 * kShortTimeout_s + 5 + 120) * ts::test_slowdown());
}

// Re-routing (docs/skippipe.md "Re-routing around a dead node"): on the uniform skip schedule, a node SIGKILLed
// mid-iteration (after its first operation of iteration 1: DLOCO_SKIPPIPE_KILL=node:1:0) is routed around — the
// survivors tear their group down, redo iteration 1 on a group of 4 with the dead node's micro-batches through the
// other replica of its stage, and the scheduler re-plans iteration 2. The command exits 0, every survivor writes 3
// iterations (iteration 1 marked redone, generation 1 from there on), the losses are finite and equal on all
// survivors, the stage-0 replicas end bitwise equal, and iterations 0 and 1 have the loss of the same run without
// the fault (the redone iteration routes every micro-batch through the same stages, whose replicas hold bitwise
// equal parameters: the same sums, up to the order in which the data nodes' losses are added). Node 3 is a stage-1
// replica; node 1 a data node (its micro-batches move to node 0).
class SkipPipeRerouteTest : public SkipPipeProcessTest, public ::testing::WithParamInterface<int> {};

TEST_P(SkipPipeRerouteTest, ANodeKilledMidIterationIsRoutedAroundAndTheIterationCompletes) {
  const int victim = GetParam();
  const auto [rc0, wall0] = train("uniform_ok", "--iterations 2", "", "config.toml", "setting.json", "uniform.json");
  ASSERT_EQ(rc0, 0) << slurp(root_ / "uniform_ok.log");
  const std::string name = "reroute" + std::to_string(victim);
  const auto [rc, wall] = train(name, "--iterations 3 --timeout-s " + std::to_string(kTimeout_s),
                                "DLOCO_SKIPPIPE_KILL=" + std::to_string(victim) + ":1:0", "config.toml",
                                "setting.json", "uniform.json");
  const std::string log = slurp(root_ / (name + ".log"));
  std::printf("%s(wall %.1f s)\n", log.c_str(), wall);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_NE(log.find("node " + std::to_string(victim) + " killed by signal 9: routing around it"), std::string::npos)
      << log;
  EXPECT_NE(log.find("iteration 1 redone on 4 nodes with node(s) " + std::to_string(victim) + " routed around"),
            std::string::npos) << log;
  EXPECT_NE(log.find("re-planned by the scheduler"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(root_ / name / ("node_" + std::to_string(victim) + ".json")));
  std::vector<nlohmann::json> nodes;
  for (int n = 0; n < kNodes; ++n) {
    if (n == victim) continue;
    const fs::path p = root_ / name / ("node_" + std::to_string(n) + ".json");
    ASSERT_TRUE(fs::exists(p)) << p;
    nodes.push_back(nlohmann::json::parse(std::ifstream(p)));
    const auto& its = nodes.back()["iterations"];
    ASSERT_EQ(its.size(), 3u) << "node " << n;
    EXPECT_FALSE(its[0]["redone"].get<bool>());
    EXPECT_TRUE(its[1]["redone"].get<bool>()) << "node " << n;
    EXPECT_EQ(its[1]["generation"], 1);
    EXPECT_EQ(its[2]["generation"], 1);
    ASSERT_EQ(nodes.back()["reroutes"].size(), 1u);
    EXPECT_EQ(nodes.back()["reroutes"][0]["dead"], nlohmann::json::array({victim}));
  }
  const auto ok0 = nlohmann::json::parse(std::ifstream(root_ / "uniform_ok" / "node_0.json"));
  for (int k = 0; k < 3; ++k) {
    const double loss = nodes[0]["iterations"][k]["loss"];
    EXPECT_TRUE(std::isfinite(loss) && loss > 0) << loss;
    for (const auto& j : nodes) EXPECT_EQ(j["iterations"][k]["loss"].get<double>(), loss) << "node " << j["node"];
    if (k < 2) {
      const double want = ok0["iterations"][k]["loss"];
      EXPECT_NEAR(loss, want, 1e-6 * want) << "iteration " << k << " differs from the run without the fault";
    }
  }
  if (victim != 1) EXPECT_EQ(nodes[0]["param_hash"], nodes[1]["param_hash"]) << "stage 0's replicas";
  const auto plan = nlohmann::json::parse(std::ifstream(root_ / name / "plan_1.json"));
  EXPECT_EQ(plan["redo_iteration"], 1);
  EXPECT_EQ(plan["world"], 4);
  EXPECT_EQ(plan["rank_of_node"][victim], -1);
  const auto next = nlohmann::json::parse(std::ifstream(plan["next_schedule"].get<std::string>()));
  for (const auto& stage : next["placement"]) {
    for (const auto& n : stage) EXPECT_NE(n.get<int>(), victim) << "the re-plan places the dead node";
  }
  EXPECT_LT(wall, (kTimeout_s + 5 + 120) * ts::test_slowdown());
  // The same folder again without a fault: the earlier run's notice, plan and release files are gone first (read as
  // this run's, the notice would tear every new node's group down at its start).
  const auto [rc2, wall2] = train(name, "--iterations 2", "", "config.toml", "setting.json", "uniform.json");
  ASSERT_EQ(rc2, 0) << slurp(root_ / (name + ".log"));
  const auto again = nlohmann::json::parse(std::ifstream(root_ / name / ("node_" + std::to_string(victim) + ".json")));
  EXPECT_TRUE(again["reroutes"].empty());
  EXPECT_FALSE(fs::exists(root_ / name / "plan_1.json"));
}

INSTANTIATE_TEST_SUITE_P(StageReplicaAndDataNode, SkipPipeRerouteTest, ::testing::Values(3, 1));

// A death that cannot be routed around (node 4 is stage 2's only node: its parameters died with it): the run
// stops naming it, and the survivors are told at once by the parent (an "abort" plan) instead of waiting out
// their deadline.
TEST_F(SkipPipeProcessTest, ADeathThatCannotBeRoutedAroundStopsTheRunAndTellsTheSurvivors) {
  const auto [rc, wall] = train("unroutable", "--iterations 3 --timeout-s " + std::to_string(kTimeout_s),
                                "DLOCO_SKIPPIPE_KILL=4:1:0", "config.toml", "setting.json", "uniform.json");
  const std::string log = slurp(root_ / "unroutable.log");
  std::printf("%s(wall %.1f s)\n", log.c_str(), wall);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("cannot be routed around: stage 2 has no node left"), std::string::npos) << log;
  for (int n : {0, 1, 2, 3}) {
    EXPECT_NE(slurp(root_ / "unroutable" / ("node_" + std::to_string(n) + ".log")).find("the parent stopped the run"),
              std::string::npos) << "node " << n;
  }
}

TEST_F(SkipPipeProcessTest, BadInputIsRefusedBeforeAnyProcessStarts) {
  const auto [rc6, wall6] = train("bad6", "", "", "config.toml", "setting6.json");
  EXPECT_EQ(rc6, 2);
  EXPECT_NE(slurp(root_ / "bad6.log").find("node 5 is in no stage"), std::string::npos) << slurp(root_ / "bad6.log");
  EXPECT_FALSE(fs::exists(root_ / "bad6" / "node_0.log"));
  const auto [rc4, wall4] = train("bad4", "", "", "config4.toml");
  EXPECT_EQ(rc4, 2);
  EXPECT_NE(slurp(root_ / "bad4.log").find("3 stages do not divide model.n_layer = 4"), std::string::npos)
      << slurp(root_ / "bad4.log");
  EXPECT_FALSE(fs::exists(root_ / "bad4" / "node_0.log"));
  const auto [rcm, wallm] = train("badm", "--iterations 0");
  EXPECT_EQ(rcm, 2);
  const auto [rcc, wallc] = train("badc", "--compute-scale -1");
  EXPECT_EQ(rcc, 2);
  EXPECT_NE(slurp(root_ / "badc.log").find("--compute-scale"), std::string::npos) << slurp(root_ / "badc.log");
}

}  // namespace
}  // namespace dloco
