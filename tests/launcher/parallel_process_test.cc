// Decoupled DiLoCo over learners that are groups of ranks (docs/parallel.md), with the real dloco binary: M = 2
// learners of 2 ranks each, learner 0 tensor-parallel (t = 2), learner 1 ZeRO-2 (d = 2), on the tiny corpus.
// Checked: merges happen and every learner ends holding Θ (the chaos analysis compares the final copies' hashes
// with the syncer's); kill -9 of learner 0's rank 1 (at learner 0's 30th step, or learner 1's 40th) stops learner 0,
// the launcher restarts it as a whole group (a new rank process joins) and the run finishes; learner 1 never waited
// (time outside its steps' compute stays below kMaxOutsideCompute_s); later, kill -9 of learner 1's leader takes its
// rank down with it (PR_SET_PDEATHSIG) and that learner restarts too. Sized in steps; the kills come at steps.
// Also: Megatron's layout in bf16 (TP2 × PP2 × DP2 with the distributed optimizer, 8 ranks) as one decoupled
// learner beside a one-process learner ends holding Θ; a SkipPipe pipeline as one learner.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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

// Whether process `pid` has exited (gone, or a zombie not reaped yet).
bool exited(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string id, comm, state;
  return !(stat >> id >> comm >> state) || state == "Z";
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

// A rank that dies mid-step fails its group at once (issue 30 item 5; docs/parallel.md "Failures"): M = 2, learner 0
// a TP2 × PP2 group (4 processes), learner 1 one process. For each point of a step — forward, backward, the gradient
// reduction, the optimizer step — rank 1 (stage 0, TP rank 1) SIGKILLs itself there in its 10th step
// (DLOCO_RANK_FAULT, parallel/rank_fault.h, which writes the time of death first). Checked: the survivors (the
// leader and ranks 2, 3) have all exited within 2 s of the death, measured by polling /proc every 10 ms; the group
// is restarted and the run finishes with every token trained exactly once (the report's count, the stream logs
// contiguous per the chaos analysis, every copy Θ); learner 1 never waited.
TEST(ParallelLearners, ARankKilledMidStepFailsItsGroupAtOnceAtEveryPointOfTheStep) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_rank_fault", kDataTool);
  ASSERT_FALSE(root.empty()) << "dloco-data prepare failed on the tiny corpus";
  constexpr int64_t kTokensPerStep = 8 * 32, kTokens = 2 * 60 * kTokensPerStep;  // 2 learners × 60 steps
  for (const std::string point : {"forward", "backward", "reduce", "optimizer"}) {
    const std::string groups =
        "restart_delay_s = 0.5\n[parallel]\ntimeout_s = 30\n"
        "[[parallel.learner]]\nid = 0\ntensor = 2\npipeline = 2\nmicro_batches = 2\n";
    const fs::path cfg = testing_support::write_decoupled_config(root, point, kTokens, groups, 8, 32, 2, 0);
    const fs::path run = root / point, death = root / (point + ".death");
    const std::string cmd = "DLOCO_RANK_FAULT=1:" + point + ":10:" + death.string() + " " + kDloco +
                            " train --config " + cfg.string() + " > " + (root / (point + ".log")).string() + " 2>&1";
    std::thread launcher([&] { EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << (root / (point + ".log")); });
    // The first group's processes: the leader (its first bootstrapped event, which comes after group_formed) and
    // ranks 1 … 3 (the first group_formed); rank 1 is the victim.
    std::vector<pid_t> survivors;
    for (int i = 0; i < 6000 && survivors.empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      pid_t leader = -1;
      json ranks;
      for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
        if (e["event"] == "bootstrapped" && leader < 0) leader = e["pid"];
        if (e["event"] == "group_formed" && ranks.is_null()) ranks = e["pids"];
      }
      if (leader > 0 && ranks.size() == 3) survivors = {leader, ranks[1].get<pid_t>(), ranks[2].get<pid_t>()};
    }
    std::vector<double> gone(survivors.size(), 0);
    for (int i = 0; i < 12000 && !fs::exists(death); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (int i = 0; i < 1000 && std::count(gone.begin(), gone.end(), 0.0) > 0; ++i) {  // up to ~10 s
      for (size_t s = 0; s < survivors.size(); ++s) {
        if (gone[s] == 0 && exited(survivors[s])) gone[s] = now_unix();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    launcher.join();
    ASSERT_EQ(survivors.size(), 3u) << point << ": learner 0's group never formed";
    ASSERT_TRUE(fs::exists(death)) << point << ": rank 1 never reached the fault point";
    double died = 0;
    std::ifstream(death) >> died;
    double slowest = 0;
    for (size_t s = 0; s < survivors.size(); ++s) {
      EXPECT_GT(gone[s], 0) << point << ": survivor " << s << " (pid " << survivors[s] << ") was still running 10 s on";
      slowest = std::max(slowest, gone[s] - died);
    }
    const json report = json::parse(std::ifstream(run / "report.json"));
    EXPECT_EQ(report["status"], "finished") << point;
    EXPECT_EQ(report["tokens_trained"], kTokens) << point;
    int restarts = 0;
    for (const auto& e : read_events(run / "events" / "launcher.jsonl")) restarts += e["event"] == "learner_restarted";
    EXPECT_EQ(restarts, 1) << point;
    const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, kTokensPerStep, 2.0});
    EXPECT_EQ(a.learners_finished, 2) << point;
    EXPECT_EQ(a.fragments_equal, a.fragments_checked) << point;
    for (const auto& m : a.copy_mismatches) ADD_FAILURE() << point << ": " << m;
    const auto timing = testing_support::time_outside_compute(read_events(run / "events" / "learner_1.jsonl"),
                                                              testing_support::slowdown_of(1, 2));
    std::printf("[rank 1 killed at %s] the survivors exited %.3f s after its death at the latest; learner 1 at most "
                "%.4f s outside compute\n", point.c_str(), slowest, timing.most_outside);
    EXPECT_LE(slowest, 2.0) << point << ": the survivors of a dead rank waited";
    EXPECT_LE(timing.most_outside, testing_support::kMaxOutsideCompute_s) << point << ": learner 1 waited";
  }
  testing_support::remove_unless_kept(root);
}

// A rank that hangs (SIGSTOP: alive, its sockets open, silent) is given up within seconds, not after
// parallel.timeout_s (issue 30 item 5; parallel/step_deadline.h): M = 2, learner 0 TP2 × PP2 with timeout_s = 60,
// learner 1 one process. Rank 2 stops itself (DLOCO_RANK_FAULT …:stop, parallel/rank_fault.h) after a backward of
// its 20th step — inside a step, wherever the machine's speed puts the test's polling; the step's collectives have
// 20 × the slowest recent step, floored at 5 s, so learner 0's group fails (group_failed) and its leader exits
// (it kills its ranks, so no operation stuck on the hung rank holds the exit) well inside 15 s of the stop — a
// fixed 60 s deadline would wait a minute — the group restarts and the run finishes with every token trained;
// learner 1 never waited.
TEST(ParallelLearners, AHungRankFailsItsGroupAtTheAdaptiveStepDeadline) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_rank_hang", kDataTool);
  ASSERT_FALSE(root.empty()) << "dloco-data prepare failed on the tiny corpus";
  constexpr int64_t kTokensPerStep = 8 * 32, kTokens = 2 * 80 * kTokensPerStep;  // 2 learners × 80 steps
  const std::string groups =
      "restart_delay_s = 0.5\n[parallel]\ntimeout_s = 60\n"
      "[[parallel.learner]]\nid = 0\ntensor = 2\npipeline = 2\nmicro_batches = 2\n";
  const fs::path cfg = testing_support::write_decoupled_config(root, "hang", kTokens, groups, 8, 32, 2, 0);
  const fs::path run = root / "hang", stop = root / "hang.stop";
  const std::string cmd = "DLOCO_RANK_FAULT=2:backward:20:" + stop.string() + ":stop " + kDloco + " train --config " +
                          cfg.string() + " > " + (root / "hang.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "see " << (root / "hang.log");
  ASSERT_TRUE(fs::exists(stop)) << "rank 2 never reached the fault point";
  double stopped_at = 0, failed_at = 0, restarted_at = 0;
  std::ifstream(stop) >> stopped_at;
  std::string error;
  for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
    if (e["event"] == "group_failed" && failed_at == 0) {
      failed_at = e["t"];
      error = e["error"];
    }
  }
  for (const auto& e : read_events(run / "events" / "launcher.jsonl")) {
    if (e["event"] == "learner_restarted" && restarted_at == 0) restarted_at = e["t"];
  }
  ASSERT_GT(failed_at, 0) << "learner 0's group never failed after its rank 2 was stopped";
  ASSERT_GT(restarted_at, 0) << "learner 0 was never restarted";
  const double exited_by = restarted_at - 0.5;  // run.restart_delay_s after the leader's exit
  std::printf("[rank 2 stopped] learner 0's group failed %.2f s later, its leader had exited by %.2f s: %s\n",
              failed_at - stopped_at, exited_by - stopped_at, error.c_str());
  EXPECT_LT(failed_at - stopped_at, 15.0) << "the group waited on a hung rank for its whole parallel.timeout_s";
  EXPECT_LT(exited_by - stopped_at, 15.0) << "the leader's exit waited on an operation stuck on the hung rank";
  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_EQ(report["tokens_trained"], kTokens);
  const auto timing = testing_support::time_outside_compute(read_events(run / "events" / "learner_1.jsonl"),
                                                            testing_support::slowdown_of(1, 2));
  EXPECT_LE(timing.most_outside, testing_support::kMaxOutsideCompute_s) << "learner 1 waited";
  testing_support::remove_unless_kept(root);
}

// A two-learner decoupled run whose learner 0 is a group of `ranks` processes beside its leader: the run finished with
// every one of `tokens` trained and merges, learner 0 formed one group and every one of its (> 10) steps had a finite
// loss, and both learners end holding Θ (their fragments equal the syncer's; `tokens_per_step` for the analysis).
// Returns the group's description for the caller's own check.
std::string expect_group_learner_ends_on_theta(const fs::path& run, int64_t tokens, int64_t tokens_per_step,
                                               size_t ranks, const char* what) {
  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_EQ(report["tokens_trained"], tokens);
  EXPECT_GT(report["merges"].get<int64_t>(), 4);
  std::vector<std::string> kinds;
  json pids;
  int steps = 0, finite = 0;
  for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
    if (e["event"] == "group_formed") {
      kinds.push_back(e["group"]);
      pids = e["pids"];
    }
    if (e["event"] == "step") {
      ++steps;
      finite += e.contains("loss") && e["loss"].is_number() && std::isfinite(e["loss"].get<double>());
    }
  }
  EXPECT_EQ(kinds.size(), 1u);
  EXPECT_EQ(pids.size(), ranks) << "the ranks as processes beside the leader";
  EXPECT_GT(steps, 10);
  EXPECT_EQ(finite, steps) << "every step of learner 0's group has a finite loss";
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, tokens_per_step, 2.0});
  EXPECT_EQ(a.version_regressions, 0);
  EXPECT_EQ(a.learners_finished, 2);
  EXPECT_EQ(a.fragments_checked, 2 * 4);
  EXPECT_EQ(a.fragments_equal, a.fragments_checked);
  for (const auto& m : a.copy_mismatches) ADD_FAILURE() << m;
  const std::string kind = kinds.empty() ? "" : kinds[0];
  std::printf("[%s] %d steps of learner 0, %lld merges, group: %s\n", what, steps,
              static_cast<long long>(report["merges"].get<int64_t>()), kind.c_str());
  return kind;
}

// Runs `dloco train` (decoupled, M = 2, 40 steps each of 8 × 32 tokens) whose learner 0 is the group
// [[parallel.learner]] `group` (`set`: more --set flags) and returns its run folder; fails the test if it did not exit 0.
fs::path train_two_learners(const fs::path& root, const std::string& name, const std::string& group,
                            const std::string& set = "") {
  constexpr int64_t kTokens = 2 * 40 * 8 * 32;
  const std::string groups = "[parallel]\ntimeout_s = 30\n[[parallel.learner]]\nid = 0\n" + group;
  const fs::path cfg = testing_support::write_decoupled_config(root, name, kTokens, groups, 8, 32, 2, 0);
  const std::string cmd = kDloco + " train --config " + cfg.string() + set + " > " + (root / (name + ".log")).string() +
                          " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "see " << (root / (name + ".log"));
  return root / name;
}

// Megatron's layout in bf16 as one Decoupled DiLoCo learner (issue 30): M = 2, learner 0 TP2 × PP2 × DP2 with the
// distributed optimizer (ZeRO-1) in bf16 — 8 rank processes — learner 1 one fp32 process. The run finishes with
// every token trained, learner 0's group is that layout, its losses are finite, merges happen, and every learner
// ends holding Θ: the fragments the syncer merged reach the bf16 group's fp32 masters exactly.
TEST(ParallelLearners, MegatronsLayoutInBf16IsOneDecoupledLearnerThatEndsHoldingTheta) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_megatron_learner", kDataTool);
  ASSERT_FALSE(root.empty()) << "dloco-data prepare failed on the tiny corpus";
  constexpr int64_t kTokensPerStep = 8 * 32, kTokens = 2 * 40 * kTokensPerStep;  // 2 learners × 40 steps
  const fs::path run = train_two_learners(
      root, "megatron", "precision = \"bf16\"\ntensor = 2\npipeline = 2\ndata = 2\nzero = 1\nmicro_batches = 2\n");
  const std::string kind = expect_group_learner_ends_on_theta(run, kTokens, kTokensPerStep, 7, "megatron learner");
  EXPECT_NE(kind.find("bf16 + distributed optimizer (ZeRO-1)"), std::string::npos) << kind;
  testing_support::remove_unless_kept(root);
}

// FSDP × TP in bf16 as one Decoupled DiLoCo learner (issue 30 item 3): M = 2, learner 0 ZeRO-3 × TP2 × DP2 in bf16
// (4 rank processes, untied embeddings), learner 1 one fp32 process; the same checks as above.
TEST(ParallelLearners, FsdpTimesTpInBf16IsOneDecoupledLearnerThatEndsHoldingTheta) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_fsdp_tp_learner", kDataTool);
  ASSERT_FALSE(root.empty()) << "dloco-data prepare failed on the tiny corpus";
  constexpr int64_t kTokensPerStep = 8 * 32, kTokens = 2 * 40 * kTokensPerStep;  // 2 learners × 40 steps
  const fs::path run = train_two_learners(root, "fsdp_tp", "precision = \"bf16\"\ntensor = 2\ndata = 2\nzero = 3\n",
                                          " --set model.tie_embeddings=false");
  const std::string kind = expect_group_learner_ends_on_theta(run, kTokens, kTokensPerStep, 3, "fsdp x tp learner");
  EXPECT_NE(kind.find("ZeRO-3 × tensor t = 2 over d = 2, bf16"), std::string::npos) << kind;
  testing_support::remove_unless_kept(root);
}

// A SkipPipe pipeline as one Decoupled DiLoCo learner (docs/skippipe.md "A SkipPipe learner"; issue 13 part 6):
// M = 2, learner 0 the 5-node hand pipeline of skippipe_node_test (3 stages, 6 micro-batches per step that skip
// stages; [[parallel.learner]] skippipe_setting / skippipe_schedule), learner 1 one process, a 3-block tiny GPT.
// The syncer sees learner 0 as one learner: the run finishes with every token trained, learner 0's group is the
// pipeline of 5 nodes (4 rank processes beside its leader), it trains steps with finite losses, merges happen, and
// every learner ends holding Θ (the chaos analysis compares each final copy's fragments with the syncer's).
TEST(ParallelLearners, ASkipPipePipelineIsOneDecoupledLearner) {
  const fs::path root = testing_support::make_tiny_corpus("dloco_skippipe_learner", kDataTool);
  ASSERT_FALSE(root.empty()) << "dloco-data prepare failed on the tiny corpus";
  {
    json nodes = json::array();
    for (double w : {1.0, 1.0, 1.0, 1.0, 1.5}) nodes.push_back({{"region", "A"}, {"forward_s", w}});
    std::ofstream(root / "setting.json")
        << json{{"format", "dloco-skippipe-setting"}, {"version", 1}, {"source", "hand case"}, {"regions", {"A"}},
                {"nodes", nodes}, {"links", json::array()},
                {"default_link", {{"latency_s", 0.1}, {"bandwidth_bytes_per_s", 1e6}}}, {"hop_overhead_s", 0.05},
                {"bytes_per_hop", 16384}, {"memory_capacity", 2}, {"backward_factor", 1.5}, {"head_factor", 0.25}}
               .dump();
    // Stage 1 visited 4 times (nodes 2, 3), stage 2 three times (node 4), micro-batch 4 only stage 0.
    json mbs = json::array();
    const std::vector<std::pair<int, std::vector<int>>> paths = {{0, {2}}, {1, {4}}, {0, {3, 4}},
                                                                 {1, {2, 4}}, {0, {}}, {1, {3}}};
    for (size_t i = 0; i < paths.size(); ++i) {
      mbs.push_back({{"id", i}, {"data_node", paths[i].first}, {"path", paths[i].second}, {"inject_s", 0}});
    }
    std::ofstream(root / "schedule.json")
        << json{{"format", "dloco-skippipe-schedule"}, {"version", 1}, {"source", "hand case"}, {"method", "hand"},
                {"placement", {{0, 1}, {2, 3}, {4}}}, {"micro_batches", mbs}}
               .dump();
  }
  // 2 learners × 40 steps × 6 micro-batches of 2 × 32 tokens.
  constexpr int64_t kTokensPerStep = 6 * 2 * 32, kTokens = 2 * 40 * kTokensPerStep;
  std::string slowdown;
  if (testing_support::test_slowdown() > 1.0) {
    const std::string f = std::to_string(testing_support::test_slowdown());
    slowdown = "slowdown = \"0:" + f + ",1:" + f + "\"\n";
  }
  const fs::path cfg = root / "skippipe.toml";
  std::ofstream(cfg) << "[model]\npreset = \"tiny\"\nvocab_size = 400\nn_layer = 3\n"
                     << "[data]\ndir = \"" << (root / "data").string() << "\"\n"
                     << "[train]\nbatch_size = 2\ngrad_accum = 6\ntotal_tokens = " << kTokens
                     << "\nlr = 3e-3\nwarmup_steps = 5\neval_interval = 0\ncheckpoint_interval = 0\n"
                     << "[diloco]\nmode = \"decoupled\"\nlearners = 2\ninner_steps = 4\nfragments = 4\noverlap = 1\n"
                     << "quorum = 1\n"
                     << "[run]\nname = \"skippipe\"\nout_dir = \"" << root.string()
                     << "\"\nthreads = 2\nreport_interval_s = 1.0\n" << slowdown
                     << "[parallel]\ntimeout_s = 30\n"
                     << "[[parallel.learner]]\nid = 0\nskippipe_setting = \"" << (root / "setting.json").string()
                     << "\"\nskippipe_schedule = \"" << (root / "schedule.json").string() << "\"\n";
  const fs::path run = root / "skippipe";
  const std::string cmd = kDloco + " train --config " + cfg.string() + " > " + (root / "skippipe.log").string() +
                          " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "see " << (root / "skippipe.log");

  const std::string kind = expect_group_learner_ends_on_theta(run, kTokens, kTokensPerStep, 4, "skippipe learner");
  EXPECT_EQ(kind.rfind("SkipPipe pipeline of 5 nodes in 3 stages, 6 micro-batches per step", 0), 0u) << kind;
  testing_support::remove_unless_kept(root);
}

}  // namespace
