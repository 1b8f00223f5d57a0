// Decoupled DiLoCo over learners that are groups of ranks (docs/parallel.md), with the real dloco binary: M = 2
// learners of 2 ranks each, learner 0 tensor-parallel (t = 2), learner 1 ZeRO-2 (d = 2), on the tiny corpus.
// Checked: merges happen and every learner ends holding Θ (the chaos analysis compares the final copies' hashes
// with the syncer's); kill -9 of learner 0's rank 1 (at learner 0's 30th step, or learner 1's 40th) stops learner 0,
// the launcher restarts it as a whole group (a new rank process joins) and the run finishes; learner 1 never waited
// (time outside its steps' compute stays below kMaxOutsideCompute_s); later, kill -9 of learner 1's leader takes its
// rank down with it (PR_SET_PDEATHSIG) and that learner restarts too. Sized in steps; the kills come at steps.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "chaos/chaos_report.h"
#include "support/process_checks.h"
#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
namespace testing_support = dloco::testing_support;
using nlohmann::json;
using testing_support::read_events;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(ParallelLearners, TensorParallelAndZeroGroupsTrainAndAKilledRankRestartsOnlyItsGroup) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_parallel_run", kDataTool);
  ASSERT_FALSE(root.empty()) << "dloco-data prepare failed on the tiny corpus";
  // 2 learners × 120 steps × 8 × 32 tokens; each learner a group of 2 single-thread ranks (4 processes on 2 cores).
  const std::string groups =
      "restart_delay_s = 0.5\n"
      "[parallel]\ntensor = 2\ntimeout_s = 20\n"
      "[[parallel.learner]]\nid = 1\ntensor = 1\ndata = 2\nzero = 2\n";
  const fs::path cfg = testing_support::write_decoupled_config(root, "groups", 2 * 120 * 8 * 32, groups, 8, 32, 2, 0);
  const fs::path run = root / "groups";
  const std::string cmd = kDloco + " train --config " + cfg.string() + " > " + (root / "groups.log").string() + " 2>&1";
  std::thread launcher([&] { EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << (root / "groups.log"); });

  // Once learner 0 trains (10 steps), at its 30th step or learner 1's 40th, whichever comes first (the two groups
  // run at different speeds: learner 1 must still be training), kill -9 learner 0's rank 1 (the pid its rank_joined
  // event names).
  pid_t victim = -1;
  for (int i = 0; i < 1800 && victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int steps0 = 0, steps1 = 0;
    for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) steps0 += e["event"] == "step";
    for (const auto& e : read_events(run / "events" / "learner_1.jsonl")) steps1 += e["event"] == "step";
    if (steps0 < 10 || (steps0 < 30 && steps1 < 40)) continue;
    for (const auto& e : read_events(run / "events" / "learner_0_rank_1.jsonl")) {
      if (e["event"] == "rank_joined") victim = e["pid"];
    }
  }
  if (victim <= 0) {
    launcher.join();
    FAIL() << "learner 0 never reached step 10 with its rank 1 joined";
  }
  EXPECT_EQ(testing_support::signal_child(victim, SIGKILL, "learner 0's rank 1"), 0);
  const double killed_at = now_unix();

  // Later, kill -9 learner 1's leader: its rank (PR_SET_PDEATHSIG) must not outlive it.
  pid_t leader1 = -1, rank1 = -1;
  for (int i = 0; i < 1800 && leader1 < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int steps = 0;
    for (const auto& e : read_events(run / "events" / "learner_1.jsonl")) {
      steps += e["event"] == "step";
      if (e["event"] == "group_formed") rank1 = e["pids"][0];
      if (e["event"] == "bootstrapped" && steps == 0) leader1 = e["pid"];
    }
    if (steps < 60) leader1 = -1;
  }
  bool rank_outlived_leader = false;
  if (leader1 > 0 && rank1 > 0) {
    EXPECT_EQ(testing_support::signal_child(leader1, SIGKILL, "learner 1's leader"), 0);
    rank_outlived_leader = true;
    for (int i = 0; i < 100 && rank_outlived_leader; ++i) {  // up to 10 s; measured: at once
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::ifstream stat("/proc/" + std::to_string(rank1) + "/stat");
      std::string pid, comm, state;
      rank_outlived_leader = static_cast<bool>(stat >> pid >> comm >> state) && state != "Z";
    }
  } else {
    ADD_FAILURE() << "learner 1 never reached step 60 with its group formed";
  }
  launcher.join();
  EXPECT_FALSE(rank_outlived_leader) << "learner 1's rank " << rank1 << " outlived its leader";

  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_EQ(report["tokens_trained"], 2 * 120 * 8 * 32);
  EXPECT_GT(report["merges"].get<int64_t>(), 20);

  // Both learners were groups of the configured kinds; learner 0's group formed twice (the restart) with a new
  // rank process, learner 1's once.
  std::vector<std::string> kinds[2];
  for (int id = 0; id < 2; ++id) {
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      if (e["event"] == "group_formed") kinds[id].push_back(e["group"]);
    }
  }
  ASSERT_EQ(kinds[0].size(), 2u) << "learner 0 should have formed its group, then again after the kill";
  EXPECT_EQ(kinds[0][0], "tensor-parallel t = 2");
  ASSERT_EQ(kinds[1].size(), 2u) << "learner 1 formed its group, then again after its leader was killed";
  EXPECT_EQ(kinds[1][0], "ZeRO-2 over d = 2");
  std::set<int> rank_pids;
  for (const auto& e : read_events(run / "events" / "learner_0_rank_1.jsonl")) {
    if (e["event"] == "rank_joined") rank_pids.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(rank_pids.size(), 2u) << "a new rank 1 process should have joined learner 0's second group";
  int restarts = 0;
  for (const auto& e : read_events(run / "events" / "launcher.jsonl")) {
    restarts += e["event"] == "learner_restarted";
  }
  EXPECT_EQ(restarts, 2);

  // Merges happened and every learner ends holding Θ, versions in order.
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 8 * 32, 2.0});
  EXPECT_EQ(a.version_regressions, 0);
  EXPECT_EQ(a.learners_finished, 2);
  EXPECT_EQ(a.fragments_checked, 2 * 4);
  EXPECT_EQ(a.fragments_equal, a.fragments_checked);
  for (const auto& m : a.copy_mismatches) ADD_FAILURE() << m;

  // Learner 1 never waited on learner 0's failure: its training thread spent at most kMaxOutsideCompute_s outside
  // its steps' compute (a wait would last a deadline), and it trained on after the kill.
  const auto steps = read_events(run / "events" / "learner_1.jsonl");
  const auto timing = testing_support::time_outside_compute(steps, testing_support::slowdown_of(1, 2));
  int after_kill = 0;
  for (const auto& e : steps) after_kill += e["event"] == "step" && e["t"].get<double>() > killed_at;
  std::printf("[learner 1] %zu steps (%d after the kill), median gap %.4f s, largest %.4f s, max time outside "
              "compute %.5f s\n",
              timing.steps, after_kill, timing.median_gap, timing.largest_gap, timing.most_outside);
  EXPECT_LE(timing.most_outside, testing_support::kMaxOutsideCompute_s)
      << "learner 1 waited before its step at t = " << timing.most_outside_t;
  EXPECT_GT(after_kill, 10) << "learner 1 trained little after learner 0's rank was killed";
  testing_support::remove_unless_kept(root);
}

}  // namespace
