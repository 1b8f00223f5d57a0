// Exact-data stream logs and the chaos analysis, on run folders written by hand (the process-level chaos test is
// tests/launcher/chaos_test.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "baselines/chaos_report.h"
#include "chaos/chaos_report.h"
#include "chaos/sim_replay.h"
#include "core/check.h"
#include "data/stream_log.h"
#include "sim/goodput_sim.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;

class ChaosReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dloco_chaos_report_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "events");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& file, const std::vector<nlohmann::json>& lines) {
    std::ofstream out(dir_ / file, std::ios::app);
    for (const auto& l : lines) out << l.dump() << "\n";
  }
  fs::path dir_;
};

StreamCursor at(int64_t batch, int64_t per_batch = 100) { return {0, batch * per_batch, 0, batch * per_batch}; }

TEST_F(ChaosReportTest, StreamLogResumesAfterATornLineAndCountsRepeatsAndGaps) {
  const fs::path path = stream_log_path(dir_, 0);
  {
    StreamLog log(path);
    EXPECT_FALSE(log.last_taken().has_value());
    for (int b = 0; b < 3; ++b) log.take(at(b), 0, b);
  }
  {  // a writer killed mid-line: the torn record is dropped, the last complete one is the cursor
    std::ofstream out(path, std::ios::app);
    out << "{\"stream\":0,\"posi";
  }
  {
    StreamLog log(path);
    ASSERT_TRUE(log.last_taken().has_value());
    EXPECT_EQ(log.last_taken()->tokens_served, 200);
    log.take(at(3), 0, 3);
  }
  auto records = read_stream_log(path);
  ASSERT_EQ(records.size(), 4u);
  auto check = check_stream_log(records, 100);
  EXPECT_TRUE(check.ok());
  EXPECT_EQ(check.batches, 4);
  records.push_back({at(3), 1, 4});  // the same batch again
  records.push_back({at(6), 1, 5});  // two batches skipped
  check = check_stream_log(records, 100);
  EXPECT_EQ(check.duplicates, 1);
  EXPECT_EQ(check.gaps, 1);
  EXPECT_EQ(check.skipped_tokens, 200);
}

TEST_F(ChaosReportTest, GoodputRecoveriesAndChecksFromTheEventLogs) {
  // M = 2, P = 2, H = 2; steps every 0.1 s; learner 1 is killed at t0 + 1.0 and rejoins at t0 + 1.5.
  const double t0 = 1000.0;
  write("events/launcher.jsonl", {{{"t", t0}, {"event", "started"}},
                                  {{"t", t0 + 1.0}, {"event", "fault"}, {"action", "kill_learner"}, {"learner", 1}},
                                  {{"t", t0 + 1.2}, {"event", "fault"}, {"action", "kill_syncer"}}});
  std::vector<nlohmann::json> syncer = {{{"t", t0 + 0.05}, {"event", "listening"}}};
  for (int i = 0; i < 20; ++i) {
    if (i >= 12 && i < 15) continue;  // the syncer is away from 1.2 s to 1.5 s
    syncer.push_back({{"t", t0 + 0.1 * i}, {"event", "merged"}});
  }
  syncer.push_back({{"t", t0 + 1.4}, {"event", "listening"}});
  syncer.push_back({{"t", t0 + 2.0}, {"event", "final_flush"}});
  syncer.push_back({{"t", t0 + 2.1},
                    {"event", "final_state"},
                    {"versions", {9, 9}},
                    {"hashes", {"aaaa", "bbbb"}}});
  write("events/syncer.jsonl", syncer);
  // Learner 0: 20 steps, all kept; its final copies equal Θ.
  std::vector<nlohmann::json> l0 = {{{"t", t0}, {"event", "bootstrapped"}, {"versions", {0, 0}}}};
  for (int i = 1; i <= 20; ++i) l0.push_back({{"t", t0 + 0.1 * i}, {"event", "step"}, {"loss", 5.0}});
  for (int p = 0; p < 2; ++p) l0.push_back({{"t", t0 + 2.0}, {"event", "kept"}, {"fragment", p}, {"steps", 20}});
  l0.push_back({{"t", t0 + 2.2}, {"event", "stopped"}, {"versions", {9, 9}}, {"hashes", {"aaaa", "bbbb"}}});
  write("events/learner_0.jsonl", l0);
  // Learner 1: 9 steps, half of them kept for fragment 0 only; killed; back at 1.5 (versions never regress),
  // 4 more steps kept for both fragments from 1.9; its final copies equal Θ too.
  std::vector<nlohmann::json> l1 = {{{"t", t0}, {"event", "bootstrapped"}, {"versions", {0, 0}}}};
  for (int i = 1; i <= 9; ++i) l1.push_back({{"t", t0 + 0.1 * i}, {"event", "step"}, {"loss", 5.0}});
  l1.push_back({{"t", t0 + 0.5}, {"event", "kept"}, {"fragment", 0}, {"steps", 4}});
  l1.push_back({{"t", t0 + 0.6}, {"event", "applied"}, {"fragment", 0}, {"version", 3}});
  l1.push_back({{"t", t0 + 1.5}, {"event", "bootstrapped"}, {"versions", {5, 5}}});
  for (int i = 1; i <= 4; ++i) l1.push_back({{"t", t0 + 1.5 + 0.1 * i}, {"event", "step"}, {"loss", 5.0}});
  for (int p = 0; p < 2; ++p) l1.push_back({{"t", t0 + 1.9}, {"event", "kept"}, {"fragment", p}, {"steps", 4}});
  l1.push_back({{"t", t0 + 2.2}, {"event", "stopped"}, {"versions", {9, 9}}, {"hashes", {"aaaa", "bbbb"}}});
  write("events/learner_1.jsonl", l1);
  {
    StreamLog log(stream_log_path(dir_, 0));
    for (int b = 0; b < 3; ++b) log.take(at(b), 0, b);
  }
  write("report.json", {{{"final_val_loss", 5.1}}});

  const ChaosAnalysis a = analyze_chaos_run(dir_, {2, 2, 2, 100, 0.5});
  EXPECT_DOUBLE_EQ(a.window_s, 2.0);
  EXPECT_NEAR(a.nominal_step_s, 0.1, 1e-9);
  ASSERT_EQ(a.learners.size(), 2u);
  EXPECT_EQ(a.learners[0].steps_trained, 20);
  EXPECT_DOUBLE_EQ(a.learners[0].steps_kept, 20);
  EXPECT_EQ(a.learners[1].steps_trained, 13);
  EXPECT_DOUBLE_EQ(a.learners[1].steps_kept, 2 + 4);  // 4 steps × 1/2, then 4 steps × 2/2
  EXPECT_DOUBLE_EQ(a.learners[1].steps_lost, 7);
  EXPECT_EQ(a.learners[1].incarnations, 2);
  EXPECT_EQ(a.learners[1].kills, 1);
  EXPECT_NEAR(a.goodput, (20 + 6) * 0.1 / (2 * 2.0), 1e-9);
  ASSERT_EQ(a.recoveries.size(), 1u);
  EXPECT_NEAR(a.recoveries[0].back_s, 0.5, 1e-9);
  EXPECT_NEAR(a.recoveries[0].contributing_s, 0.9, 1e-9);
  ASSERT_EQ(a.syncer_downtime.size(), 1u);
  EXPECT_NEAR(a.syncer_downtime[0].back_s, 0.2, 1e-9);
  EXPECT_NEAR(a.syncer_downtime[0].contributing_s, 0.3, 1e-9);
  // Expected merges: P / (H · 0.1 s) = 10/s, 5 per 0.5 s bin; the bin [1.0, 1.5) has 2 merges: down.
  EXPECT_NEAR(a.uptime, 0.75, 1e-9);
  EXPECT_EQ(a.version_regressions, 0);
  EXPECT_EQ(a.learners_finished, 2);
  EXPECT_EQ(a.fragments_expected, 2 * 2);
  EXPECT_EQ(a.fragments_checked, 2 * 2);
  EXPECT_EQ(a.fragments_equal, 2 * 2);
  EXPECT_TRUE(a.copy_mismatches.empty());
  EXPECT_EQ(a.batches, 3);
  EXPECT_TRUE(a.consistent());
  EXPECT_DOUBLE_EQ(a.final_val_loss, 5.1);
}

TEST_F(ChaosReportTest, RegressedVersionsRepeatedBatchesAndNaNFailTheChecks) {
  const double t0 = 50.0;
  write("events/launcher.jsonl", {{{"t", t0}, {"event", "started"}}});
  write("events/syncer.jsonl", {{{"t", t0 + 1}, {"event", "final_flush"}},
                                {{"t", t0 + 1}, {"event", "final_state"}, {"versions", {4}}, {"hashes", {"aa"}}}});
  write("events/learner_0.jsonl", {{{"t", t0}, {"event", "bootstrapped"}, {"versions", {0}}},
                                   {{"t", t0 + 0.1}, {"event", "step"}, {"loss", nullptr}},
                                   {{"t", t0 + 0.2}, {"event", "applied"}, {"fragment", 0}, {"version", 4}},
                                   {{"t", t0 + 0.3}, {"event", "bootstrapped"}, {"versions", {3}}},
                                   {{"t", t0 + 0.9}, {"event", "stopped"}, {"versions", {4}}, {"hashes", {"ab"}}}});
  {
    StreamLog log(stream_log_path(dir_, 0));
    log.take(at(0), 0, 0);
    log.take(at(0), 0, 1);
  }
  const ChaosAnalysis a = analyze_chaos_run(dir_, {1, 1, 1, 100, 1.0});
  EXPECT_FALSE(a.nan_free);
  EXPECT_EQ(a.version_regressions, 1);
  EXPECT_EQ(a.duplicate_batches, 1);
  EXPECT_EQ(a.fragments_checked, 1);
  EXPECT_EQ(a.fragments_equal, 0);
  EXPECT_FALSE(a.consistent());
  EXPECT_THROW(analyze_chaos_run(dir_ / "nowhere", {1, 1, 1, 100, 1.0}), InputError);
}

TEST_F(ChaosReportTest, EveryFragmentOfEveryFinishingLearnerIsComparedWithTheFinalTheta) {
  // M = 4 slots plus learner 4 added by the plan, P = 2. Final Θ: versions {7, 7}, hashes {aa, bb}.
  //   learner 0  finishes with Θ's copies: 2 equal
  //   learner 1  finishes one version behind on fragment 1 (a copy the old check skipped): compared, differs
  //   learner 2  killed and restarted; its last incarnation never logged "stopped" (the first one did): 2 not
  //              compared, and the check fails for them
  //   learner 3  killed for good: no final copy, counted apart
  //   learner 4  joined and left: no final copy, counted apart
  const double t0 = 10.0;
  write("events/launcher.jsonl",
        {{{"t", t0}, {"event", "started"}},
         {{"t", t0 + 0.3}, {"event", "fault"}, {"action", "kill_learner"}, {"learner", 2}, {"restart_after_s", 0.1}},
         {{"t", t0 + 0.4}, {"event", "fault"}, {"action", "kill_learner"}, {"learner", 3}, {"restart_after_s", -1.0}},
         {{"t", t0 + 0.5}, {"event", "learner_added"}, {"learner", 4}},
         {{"t", t0 + 0.8}, {"event", "fault"}, {"action", "leave_learner"}, {"learner", 4}}});
  write("events/syncer.jsonl", {{{"t", t0 + 1}, {"event", "final_flush"}},
                                {{"t", t0 + 1}, {"event", "final_state"}, {"versions", {7, 7}}, {"hashes", {"aa", "bb"}}}});
  auto learner = [&](int id, std::vector<nlohmann::json> tail) {
    std::vector<nlohmann::json> e = {{{"t", t0}, {"event", "bootstrapped"}, {"versions", {0, 0}}}};
    e.insert(e.end(), tail.begin(), tail.end());
    write("events/learner_" + std::to_string(id) + ".jsonl", e);
  };
  learner(0, {{{"t", t0 + 1.1}, {"event", "stopped"}, {"versions", {7, 7}}, {"hashes", {"aa", "bb"}}}});
  learner(1, {{{"t", t0 + 1.1}, {"event", "stopped"}, {"versions", {7, 6}}, {"hashes", {"aa", "b6"}}}});
  learner(2, {{{"t", t0 + 0.2}, {"event", "stopped"}, {"versions", {7, 7}}, {"hashes", {"aa", "bb"}}},
              {{"t", t0 + 0.5}, {"event", "bootstrapped"}, {"versions", {3, 3}}}});
  learner(3, {});
  learner(4, {{{"t", t0 + 0.8}, {"event", "stopped"}, {"versions", {2, 2}}, {"hashes", {"x", "y"}}, {"leaving", true}}});
  write("report.json", {{{"final_val_loss", 3.0}}});
  ChaosAnalysis a = analyze_chaos_run(dir_, {4, 2, 2, 100, 1.0});
  EXPECT_EQ(a.learners_finished, 3);
  EXPECT_EQ(a.learners_gone, 2);
  EXPECT_EQ(a.fragments_expected, 3 * 2);
  EXPECT_EQ(a.fragments_checked, 2 * 2);  // learners 0 and 1
  EXPECT_EQ(a.fragments_equal, 3);
  ASSERT_EQ(a.copy_mismatches.size(), 3u) << a.to_json().dump(1);
  EXPECT_NE(a.copy_mismatches[0].find("learner 1 fragment 1: version 6"), std::string::npos) << a.copy_mismatches[0];
  EXPECT_NE(a.copy_mismatches[1].find("learner 2 fragment 0: not compared"), std::string::npos) << a.copy_mismatches[1];
  ASSERT_EQ(a.learners.size(), 5u);
  EXPECT_EQ(a.learners[3].end, "killed");
  EXPECT_EQ(a.learners[4].end, "left");
  EXPECT_FALSE(a.consistent());

  // Without the syncer's final_state nothing can be compared: every expected pair is reported, the check fails.
  fs::remove(dir_ / "events" / "syncer.jsonl");
  write("events/syncer.jsonl", {{{"t", t0 + 1}, {"event", "final_flush"}}});
  a = analyze_chaos_run(dir_, {4, 2, 2, 100, 1.0});
  EXPECT_EQ(a.fragments_checked, 0);
  EXPECT_EQ(a.copy_mismatches.size(), 3u * 2);
  EXPECT_FALSE(a.consistent());
}

TEST_F(ChaosReportTest, DpRollbacksPausesAndLineageFromTheEventLogs) {
  // Elastic dp, M = 2, a step every 1 s. Generation 0 (slots 0, 1) trains steps 1–8; slot 1 is killed at t0 + 8.5;
  // generation 1 (slot 0 alone) resumes from the checkpoint at step 5 and trains 6–10 from t0 + 10; slot 1 is
  // back and generation 2 resumes from step 10 (the voted stop) and trains 11–12 from t0 + 17.
  const double t0 = 1000.0;
  write("events/launcher.jsonl",
        {{{"t", t0}, {"event", "group_formed"}, {"generation", 0}, {"world", 2}, {"from_step", 0}},
         {{"t", t0}, {"event", "started"}},
         {{"t", t0 + 8.5}, {"event", "fault"}, {"action", "kill_learner"}, {"learner", 1}, {"restart_after_s", 5.0}},
         {{"t", t0 + 8.7}, {"event", "group_stopped"}, {"generation", 0}, {"reason", "failure"}},
         {{"t", t0 + 8.8}, {"event", "group_formed"}, {"generation", 1}, {"world", 1}, {"from_step", 5}},
         {{"t", t0 + 15.5}, {"event", "group_stopped"}, {"generation", 1}, {"reason", "grow"}},
         {{"t", t0 + 15.6}, {"event", "group_formed"}, {"generation", 2}, {"world", 2}, {"from_step", 10}}});
  std::vector<nlohmann::json> w0, w1;
  w0.push_back({{"t", t0}, {"event", "joined"}, {"generation", 0}, {"from_step", 0}});
  w1.push_back({{"t", t0}, {"event", "joined"}, {"generation", 0}, {"from_step", 0}});
  for (int n = 1; n <= 8; ++n) {
    w0.push_back({{"t", t0 + n}, {"event", "step"}, {"step", n}, {"loss", 5.0}});
    w1.push_back({{"t", t0 + n}, {"event", "step"}, {"step", n}, {"loss", 5.0}});
  }
  w0.push_back({{"t", t0 + 9}, {"event", "joined"}, {"generation", 1}, {"from_step", 5}});
  for (int n = 6; n <= 10; ++n) w0.push_back({{"t", t0 + 4 + n}, {"event", "step"}, {"step", n}, {"loss", 5.0}});
  for (auto* w : {&w0, &w1}) {
    w->push_back({{"t", t0 + 16}, {"event", "joined"}, {"generation", 2}, {"from_step", 10}});
    for (int n = 11; n <= 12; ++n) w->push_back({{"t", t0 + 6 + n}, {"event", "step"}, {"step", n}, {"loss", 5.0}});
  }
  write("events/worker_0.jsonl", w0);
  write("events/worker_1.jsonl", w1);
  write("report.json", {{{"final_val_loss", 4.5}}});

  const ChaosAnalysis a = analyze_dp_chaos_run(dir_, {2, 1, 1, 100, 2.0});
  EXPECT_EQ(a.mode, "dp");
  EXPECT_EQ(a.generations, 3);
  EXPECT_DOUBLE_EQ(a.window_s, 18.0);
  EXPECT_DOUBLE_EQ(a.nominal_step_s, 1.0);  // intervals of the 2-worker generations only
  ASSERT_EQ(a.learners.size(), 2u);
  EXPECT_EQ(a.learners[0].steps_trained, 15);
  EXPECT_DOUBLE_EQ(a.learners[0].steps_kept, 12);  // 1–5, 6–10 (generation 1), 11–12
  EXPECT_DOUBLE_EQ(a.learners[1].steps_kept, 7);   // 1–5, 11–12
  EXPECT_DOUBLE_EQ(a.learners[1].steps_lost, 3);   // 6–8, rolled back
  EXPECT_DOUBLE_EQ(a.goodput, 19.0 * 1.0 / (2 * 18.0));
  ASSERT_EQ(a.pauses.size(), 2u);
  EXPECT_EQ(a.pauses[0].reason, "failure");
  EXPECT_DOUBLE_EQ(a.pauses[0].pause_s, 2.0);  // last step at 8, first of generation 1 at 10
  EXPECT_EQ(a.pauses[0].rolled_back_steps, 3);
  EXPECT_EQ(a.pauses[0].world_after, 1);
  EXPECT_EQ(a.pauses[1].reason, "grow");
  EXPECT_DOUBLE_EQ(a.pauses[1].pause_s, 3.0);
  EXPECT_EQ(a.pauses[1].rolled_back_steps, 0);
  ASSERT_EQ(a.recoveries.size(), 1u);
  EXPECT_DOUBLE_EQ(a.recoveries[0].back_s, 7.5);          // joined at 16
  EXPECT_DOUBLE_EQ(a.recoveries[0].contributing_s, 8.5);  // first step at 17
  EXPECT_TRUE(a.lineage_ok);
  EXPECT_TRUE(a.consistent());

  // A generation that resumes from a step nobody reached, or a slot that skips a step, breaks the lineage.
  write("events/worker_0.jsonl", {{{"t", t0 + 19}, {"event", "joined"}, {"generation", 3}, {"from_step", 12}},
                                  {{"t", t0 + 20}, {"event", "step"}, {"step", 14}, {"loss", 5.0}}});
  EXPECT_FALSE(analyze_dp_chaos_run(dir_, {2, 1, 1, 100, 2.0}).lineage_ok);
}

TEST(SimReplay, ReplaysKillsPausesAndSlowdownsOfTheRun) {
  ChaosAnalysis a;
  a.window_s = 100;
  a.nominal_step_s = 1.0;
  a.recoveries = {{1, 50.0, 10.0, 12.0, 13.0}};  // killed at 50 s, restarted after 10 s, bootstrapped 2 s later
  a.faults = nlohmann::json::array({
      {{"t", 50.0}, {"action", "kill_learner"}, {"learner", 1}, {"restart_after_s", 10.0}},
      {{"t", 20.0}, {"action", "pause_learner"}, {"learner", 0}, {"duration_s", 5.0}},
      {{"t", 70.0}, {"action", "slow_learner"}, {"learner", 0}, {"factor", 2.0}, {"duration_s", 10.0}},
      {{"t", 80.0}, {"action", "kill_syncer"}},
  });
  const sim::GoodputConfig c = replay_config(a, {2, 1, 2, 2, 1});
  EXPECT_EQ(c.chips, 2);
  EXPECT_EQ(c.learners, 2);
  EXPECT_DOUBLE_EQ(c.step_s, 1.0);
  EXPECT_DOUBLE_EQ(c.rejoin_s, 2.0);
  ASSERT_EQ(c.trace.size(), 3u);  // the syncer kill is not replayed
  EXPECT_DOUBLE_EQ(c.trace[0].t_s, 20.0);
  EXPECT_TRUE(c.trace[0].keeps_state);
  EXPECT_DOUBLE_EQ(c.trace[1].away_s, 10.0);
  EXPECT_FALSE(c.trace[1].keeps_state);
  EXPECT_DOUBLE_EQ(c.trace[2].away_s, 5.0);  // 10 s at half speed lose 5 s
  // Lost: pause 5 + slowdown 5 + kill (10 away + 2 rejoin + H/2 = 1 unmerged step) = 23 of 200 slot-seconds.
  EXPECT_NEAR(sim::simulate_goodput(c).goodput, 177.0 / 200.0, 1e-9);
  a.nominal_step_s = 0;
  EXPECT_THROW(replay_config(a, {2, 1, 2, 2, 1}), InputError);
}

}  // namespace
}  // namespace dloco
