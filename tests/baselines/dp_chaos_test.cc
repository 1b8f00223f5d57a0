// Data parallel under fault plans (the baseline users run today, run.recovery = elastic | restart): `dloco train
// --plan` against a dp group of M = 3 workers on the tiny corpus. The kills are triggered by global steps, not
// times (on a loaded machine the group may not have reached its first checkpoint after a few seconds, and on a
// fast one it may be done), and the runs are 160 steps long. Also dp over workers that are learner groups, one of
// whose ranks is killed. The decoupled chaos tests are chaos_test.cc.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "baselines/chaos_report.h"
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

// Data parallel under the same kind of plan (the baseline users run today). M = 3 workers, a checkpoint every 5
// steps; worker 1 is killed at global step 12 and comes back 4 s later (restart) or at global step 60 (elastic).
// The kill is triggered by a step, not a time: on a loaded machine the group may not have reached its first
// checkpoint after a few seconds.
class DpRecoveryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing_support::make_tiny_corpus("dloco_chaos_dp", kDataTool);
    ASSERT_FALSE(root_.empty()) << "dloco-data prepare failed on the tiny corpus";
  }
  static void TearDownTestSuite() { testing_support::remove_unless_kept(root_); }
  static json train_under_plan(const fs::path& cfg, const std::string& plan_toml, const std::string& name,
                               const std::string& sets = "", int expected_exit = 0) {
    return testing_support::train_under_plan(root_, kDloco, cfg, plan_toml, name, sets, expected_exit);
  }
  static constexpr int64_t kBudget = 3 * 160 * 32 * 32;  // 160 steps of all 3 workers
  // Worker 1 killed at global step 12 and restarted as `restart` says ("restart_after_s = 4": restart waits for it;
  // "restart_at_step = 60": elastic trains on without it, and it comes back once the survivors reach step 60, on a
  // machine of any speed).
  static json run(const std::string& name, const std::string& recovery, const std::string& restart) {
    const auto cfg = testing_support::write_decoupled_config(root_, name, kBudget, "", 32, 96, 3, 0);
    return train_under_plan(cfg, "[[fault]]\nat_step = 12\naction = \"kill_learner\"\nlearner = 1\n" + restart +
                                 "\n[[fault]]\nat_step = 14\naction = \"kill_syncer\"\n",
                            name, "--set diloco.mode=dp --set run.recovery=" + recovery +
                                      " --set train.checkpoint_interval=5");
  }
  static fs::path root_;
  // What went wrong, printed when a run did not fail as planned: the launcher's events except its progress rows,
  // its console (root/<name>.log) and the end of every worker's log (an unplanned failure names its exit there).
  static void print_run(const std::string& name) {
    for (const auto& e : read_events(root_ / name / "events" / "launcher.jsonl")) {
      if (e["event"] != "progress") std::printf("%s\n", e.dump().c_str());
    }
    std::vector<fs::path> logs{root_ / (name + ".log")};
    std::error_code ec;
    for (const auto& log : fs::directory_iterator(root_ / name / "logs", ec)) logs.push_back(log.path());
    for (const auto& log : logs) {
      const std::string text = testing_support::slurp(log);
      std::printf("== %s (end)\n%s\n", log.c_str(), text.substr(text.size() > 3000 ? text.size() - 3000 : 0).c_str());
    }
  }
  // The launcher's group formations: {generation, world, from_step}.
  static std::vector<json> formations(const std::string& name) {
    std::vector<json> out;
    for (const auto& e : read_events(root_ / name / "events" / "launcher.jsonl")) {
      if (e["event"] == "group_formed") out.push_back(e);
    }
    return out;
  }
};
fs::path DpRecoveryTest::root_;

TEST_F(DpRecoveryTest, ElasticShrinksAtOnceAndGrowsBackWithoutLosingTheVotedStep) {
  const json report = run("elastic", "elastic", "restart_at_step = 60");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  EXPECT_EQ(report["worker_failures"], 1);
  EXPECT_EQ(report["faults_injected"], 1);  // kill_syncer is skipped: no syncer in dp
  // The whole group's tokens reach the budget (the 2-worker generation took fewer per step) and stop short of
  // one more step of 3 workers.
  const int64_t tokens = report["tokens_trained"];
  EXPECT_LE(tokens, kBudget);
  EXPECT_GT(tokens, kBudget - 3 * 32 * 32);
  const auto groups = formations("elastic");
  if (report["status"] != "finished" || report["worker_failures"] != 1 || groups.size() != 3u) print_run("elastic");
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[1]["slots"], json::array({0, 2}));  // the survivors, at once
  EXPECT_EQ(groups[2]["slots"], json::array({0, 1, 2}));  // grown back
  const dloco::ChaosAnalysis a = dloco::analyze_dp_chaos_run(root_ / "elastic", {3, 1, 1, 32 * 32, 2.0});
  std::printf("%s\n", a.to_json().dump(1).c_str());
  EXPECT_TRUE(a.lineage_ok);
  EXPECT_TRUE(a.nan_free);
  ASSERT_EQ(a.pauses.size(), 2u);
  EXPECT_EQ(a.pauses[0].reason, "failure");
  EXPECT_LE(a.pauses[0].rolled_back_steps, 5) << "rolled back past the last checkpoint";
  // The survivors did not wait for the dead worker: it came back at step 60, which they alone reached (had they
  // waited, nobody would have moved the step and the run would not have ended).
  EXPECT_GE(groups[2]["from_step"].get<int64_t>(), 60) << "worker 1 was back before its restart_at_step";
  EXPECT_EQ(a.pauses[1].reason, "grow");
  EXPECT_EQ(a.pauses[1].rolled_back_steps, 0) << "the voted stop's checkpoint was not the one resumed from";
  // Every rank of the 2-worker generation stopped after the same step.
  std::vector<int64_t> stopped;
  for (int s : {0, 2}) {
    int64_t gen = -1;
    for (const auto& e : read_events(root_ / "elastic" / "events" / ("worker_" + std::to_string(s) + ".jsonl"))) {
      if (e["event"] == "joined") gen = e["generation"];
      if (e["event"] == "stopped" && gen == 1) stopped.push_back(e["step"]);
    }
  }
  ASSERT_EQ(stopped.size(), 2u);
  EXPECT_EQ(stopped[0], stopped[1]);
  EXPECT_EQ(stopped[0], groups[2]["from_step"]);
  EXPECT_GT(a.goodput, 0.3);
  EXPECT_LE(a.goodput, 1.0);
  ASSERT_EQ(a.recoveries.size(), 1u);
  EXPECT_GT(a.recoveries[0].back_s, 0);
  EXPECT_GT(a.recoveries[0].contributing_s, a.recoveries[0].back_s);
}

TEST_F(DpRecoveryTest, RestartGivesUpWithAClearErrorWhenAWorkerWillNeverBeBack) {
  const auto cfg = testing_support::write_decoupled_config(root_, "never", kBudget, "", 32, 96, 3, 0);
  const json report = train_under_plan(cfg, "[[fault]]\nat_step = 7\naction = \"kill_learner\"\nlearner = 1\n"
                                            "restart_after_s = -1\n", "never",
                                       "--set diloco.mode=dp --set run.recovery=restart --set train.checkpoint_interval=5",
                                       /*expected_exit=*/1);
  ASSERT_FALSE(report.is_null()) << "no report: the launcher hung or lost the checkpoint";
  EXPECT_EQ(report["status"], "failed");
  EXPECT_NE(report.value("failure", "").find("will not be restarted"), std::string::npos) << report.dump(1);
}

TEST_F(DpRecoveryTest, RestartWaitsForTheDeadWorkerThenResumesFromTheCheckpoint) {
  const json report = run("restart", "restart", "restart_after_s = 4");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  const int64_t tokens = report["tokens_trained"];
  EXPECT_LE(tokens, kBudget);
  EXPECT_GT(tokens, kBudget - 3 * 32 * 32);
  const auto groups = formations("restart");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1]["world"], 3);  // never without the dead worker
  EXPECT_GT(groups[1]["from_step"].get<int64_t>(), 0);  // from a checkpoint, not from scratch
  const dloco::ChaosAnalysis a = dloco::analyze_dp_chaos_run(root_ / "restart", {3, 1, 1, 32 * 32, 2.0});
  EXPECT_TRUE(a.lineage_ok);
  ASSERT_EQ(a.pauses.size(), 1u);
  EXPECT_GT(a.pauses[0].pause_s, 4.0) << "the group restarted before the dead worker's delay was over";
  EXPECT_LE(a.pauses[0].rolled_back_steps, 5);
}

// dp over learner groups (docs/parallel.md "Baselines over learner groups"): M = 2 workers, each ZeRO-2 over 2
// ranks, a checkpoint every 5 steps. kill -9 of worker 1's rank 1 once worker 0 logged 12 steps: worker 1 exits
// as the failed one (its own rank died; worker 0 is only a casualty), the launcher re-forms the whole group from
// the newest checkpoint, each group restoring its sharded AdamW state from the checkpoint's group_state, and the
// run finishes its budget.
TEST_F(DpRecoveryTest, AKilledRankOfAWorkersGroupRestartsTheGroupFromTheCheckpoint) {
  constexpr int64_t kSteps = 100, kTokensPerStep = 8 * 32;
  const auto cfg = testing_support::write_decoupled_config(
      root_, "dp_groups", 2 * kSteps * kTokensPerStep,
      "restart_delay_s = 0.5\n[parallel]\ndata = 2\nzero = 2\ntimeout_s = 20\n", 8, 32, 2, 0);
  const fs::path run = root_ / "dp_groups", log = root_ / "dp_groups.log";
  const std::string cmd = kDloco + " train --config " + cfg.string() + " --set diloco.mode=dp --set run.recovery=restart" +
                          " --set train.checkpoint_interval=5 > " + log.string() + " 2>&1";
  std::thread launcher([&] { EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << log; });
  pid_t victim = -1;
  for (int i = 0; i < 1800 && victim < 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int steps = 0;
    for (const auto& e : read_events(run / "events" / "worker_0.jsonl")) steps += e["event"] == "step";
    if (steps < 12) continue;
    for (const auto& e : read_events(run / "events" / "learner_1_rank_1.jsonl")) {
      if (e["event"] == "rank_joined") victim = e["pid"].get<pid_t>();
    }
  }
  if (victim <= 0) {  // stop the run before failing: a joinable thread would terminate the test binary
    ADD_FAILURE() << "worker 0 never logged 12 steps, or worker 1's rank 1 never joined; see " << log;
    (void)std::system(("pkill -KILL -f " + root_.string() + "/dp_groups").c_str());
    launcher.join();
    return;
  }
  ::kill(victim, SIGKILL);
  launcher.join();

  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_GT(report["tokens_trained"].get<int64_t>(), 2 * (kSteps - 1) * kTokensPerStep);
  std::vector<int> failed;
  for (const auto& e : read_events(run / "events" / "launcher.jsonl")) {
    if (e["event"] == "worker_failed") failed.push_back(e["slot"].get<int>());
  }
  EXPECT_EQ(failed, std::vector<int>{1}) << "the worker whose rank died is the failure; the other a casualty";
  const auto groups = formations("dp_groups");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1]["world"], 2);
  const int64_t from = groups[1]["from_step"].get<int64_t>();
  EXPECT_GT(from, 0) << "from a checkpoint, not from scratch";
  EXPECT_EQ(from % 5, 0) << "train.checkpoint_interval = 5";
  // the second generation's workers resumed at that step with the groups' optimizer state restored from the
  // checkpoint's group_state, and both groups' ranks joined again
  int resumed = 0;
  for (int w = 0; w < 2; ++w) {
    for (const auto& e : read_events(run / "events" / ("worker_" + std::to_string(w) + ".jsonl"))) {
      resumed += e["event"] == "optimizer_restored" && e["step"].get<int64_t>() == from &&
                 e["from"].get<std::string>().find("group_state") != std::string::npos;
    }
    int joins = 0;
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(w) + "_rank_1.jsonl"))) {
      joins += e["event"] == "rank_joined";
    }
    EXPECT_EQ(joins, 2) << "worker " << w << "'s rank 1 joined once per generation";
  }
  EXPECT_EQ(resumed, 2);
  bool group_state = false;
  for (const auto& d : fs::directory_iterator(run / "checkpoints")) {
    group_state |= fs::exists(d.path() / "group_state" / "state.json");
  }
  EXPECT_TRUE(group_state) << "dp checkpoints of learner groups carry the groups' optimizer state";
}

}  // namespace
