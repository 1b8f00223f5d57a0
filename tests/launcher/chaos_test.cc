// Chaos on real processes (the chaos issue): `dloco train --plan` carries out a fault plan against a tiny decoupled
// run, and the run folder alone must show that nothing broke: every token of every stream trained at most once
// and none skipped, fragment versions only increase, every fragment of every learner that finished equals Θ, no
// NaN; and a paused (SIGSTOPped) learner, a cut or slow link, a kill or a join never makes another learner wait.
//
// Machine speed: every fault fires at a global step (at_step) and every fault that lasts while the run goes on
// ends at one (until_step; its duration_s is only a cap against a hang), and every run is sized in steps so that
// it is still going when its faults end. The waits the plans contain in seconds (restart delays, the syncer's
// restart, a stream's lease) are spaced by enough steps for a machine 3× faster, where a second holds 3× as many
// steps. DLOCO_TEST_SLOWDOWN=3 checks the slower side (tests/support/tiny_corpus.h). Data parallel under plans:
// dp_chaos_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chaos/chaos_report.h"
#include "data/stream_log.h"
#include "support/process_checks.h"
#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
namespace testing_support = dloco::testing_support;
using nlohmann::json;
using testing_support::kMaxOutsideCompute_s;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

using testing_support::read_events;

// How far past its planned step a fault may fire: the launcher reads the global step every 200 ms (~17 steps of
// ~0.012 s on a machine 3× faster than this one), and a restarted learner's start-up can hold the leader back. No
// plan here has a fault due while the syncer is down: the launcher cannot read the global step then, and its next
// reading after the restart is hundreds of steps on (however many the learners trained in the outage).
constexpr int64_t kFireSlackSteps = 40;

std::vector<json> events_named(const fs::path& run, const std::string& role, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : read_events(run / "events" / (role + ".jsonl"))) {
    if (e["event"] == name) out.push_back(e);
  }
  return out;
}

// Every fault the launcher injected fired at a global step, at or soon after the one the plan gave it (none at a
// wall time), in the plan's order; and every fault bounded by until_step ended at its step, not by its cap.
// docs/protocol.md §10: screening refuses nothing of honest learners under faults either (kills, restarts of the
// syncer, pauses, cut links, joins and leaves): no answer of any kind, no report (issue 16: "zero refusals in the
// chaos plan").
void expect_no_refusal(const json& report, const fs::path& run) {
  const json& screening = report.at("screening");
  bool refused = screening.at("reports_refused") != 0;
  for (const auto& [kind, n] : screening.at("answers_refused_by_kind").items()) {
    EXPECT_EQ(n, 0) << "answers refused as " << kind << ": " << screening.dump();
    refused = refused || n != 0;
  }
  EXPECT_EQ(screening.at("reports_refused"), 0) << screening.dump();
  if (!refused) return;
  // What a rare refusal needs to be understood (9 answers refused as `norm` once in CI after a pause, not
  // reproduced in 40 runs): the syncer's reasons (size per step, ratio, median) and liveness calls, and every event
  // of the refused learners but their steps.
  std::set<int> learners;
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    const std::string name = e["event"];
    if (name == "answer_refused" || name == "report_refused" || name == "learner_absent" || name == "learner_live" ||
        name == "refetch_told") {
      std::printf("syncer: %s\n", e.dump().c_str());
      if ((name == "answer_refused" || name == "report_refused") && e.contains("learner")) {
        learners.insert(e["learner"].get<int>());
      }
    }
  }
  for (int id : learners) {
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      if (e["event"] != "step" && e["event"] != "monitor") std::printf("learner %d: %s\n", id, e.dump().c_str());
    }
  }
}

void expect_faults_fired_at_their_steps(const fs::path& run, size_t expected) {
  const auto faults = events_named(run, "launcher", "fault");
  EXPECT_EQ(faults.size(), expected);
  int64_t previous = -1;
  for (const auto& f : faults) {
    ASSERT_TRUE(f.contains("at_step")) << "a fault planned at a wall time: " << f.dump();
    const int64_t planned = f["at_step"], fired = f["global_step"];
    EXPECT_GE(fired, planned) << f.dump();
    EXPECT_LE(fired, planned + kFireSlackSteps) << "fired late: " << f.dump();
    EXPECT_GE(planned, previous) << "out of the plan's order: " << f.dump();
    previous = planned;
  }
  for (const auto& e : events_named(run, "launcher", "fault_ended")) {
    if (!e.contains("until_step")) continue;
    EXPECT_EQ(e["reason"], "until_step") << "ended by its cap or the run's end, not at its step: " << e.dump();
    EXPECT_GE(e.value("global_step", int64_t{-1}), e["until_step"].get<int64_t>()) << e.dump();
  }
}

// The "fault" and "fault_ended" times of the one fault of `action` on `learner`.
std::pair<double, double> fault_window(const fs::path& run, const std::string& action, int learner) {
  double from = -1, to = -1;
  for (const auto& e : read_events(run / "events" / "launcher.jsonl")) {
    if (e.value("action", "") != action || e.value("learner", -1) != learner) continue;
    if (e["event"] == "fault") from = e["t"];
    if (e["event"] == "fault_ended" && from >= 0 && to < 0) to = e["t"];
  }
  return {from, to};
}

int steps_between(const fs::path& run, int learner, double from, double to) {
  int n = 0;
  for (const auto& e : events_named(run, "learner_" + std::to_string(learner), "step")) {
    n += e["t"].get<double>() > from && e["t"].get<double>() < to ? 1 : 0;
  }
  return n;
}

// Learner `id` of a run of M never waited: time outside compute between any two of its steps within the bound.
void expect_never_waited(const fs::path& run, int id, int learners) {
  const auto timing = testing_support::time_outside_compute(
      read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl")),
      testing_support::slowdown_of(id, learners));
  std::printf("learner %d: %zu steps, median gap %.4f s, largest %.4f s (%.2f×), most time outside compute %.4f s\n",
              id, timing.steps, timing.median_gap, timing.largest_gap,
              timing.largest_gap / std::max(1e-9, timing.median_gap), timing.most_outside);
  EXPECT_GT(timing.outside.size(), 20u) << "learner " << id << " trained too few steps to tell";
  EXPECT_LE(timing.most_outside, kMaxOutsideCompute_s)
      << "learner " << id << "'s training thread spent " << timing.most_outside << " s outside compute before its step"
      << " at t = " << timing.most_outside_t << ": it waited";
}

// The final-copy check: every fragment of every learner that finished was compared with Θ and equals it.
void expect_every_final_copy_equals_theta(const dloco::ChaosAnalysis& a, int finishing, int P) {
  EXPECT_EQ(a.learners_finished, finishing);
  EXPECT_EQ(a.fragments_checked, finishing * P);
  EXPECT_EQ(a.fragments_equal, a.fragments_checked);
  for (const auto& m : a.copy_mismatches) ADD_FAILURE() << m;
}

class ChaosTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing_support::make_tiny_corpus("dloco_chaos", kDataTool);
    ASSERT_FALSE(root_.empty()) << "dloco-data prepare failed on the tiny corpus";
  }
  static void TearDownTestSuite() { testing_support::remove_unless_kept(root_); }

  static json train_under_plan(const fs::path& cfg, const std::string& plan_toml, const std::string& name,
                               const std::string& sets = "") {
    return testing_support::train_under_plan(root_, kDloco, cfg, plan_toml, name, sets);
  }

  static fs::path root_;
};
fs::path ChaosTest::root_;

TEST_F(ChaosTest, KilledAndPausedLearnersLoseNoTokenAndKeepEveryCopyConsistent) {
  // M = 2 learners sharing a budget of 1200 steps; the global step (K = 1: the faster learner's) ends near 700 with steps
  // of ~0.035 s (2-core AMD EPYC) and near 600 when every learner is 3× slower. Learner 0 is killed 5 times and
  // learner 1 is paused for 1.5 s, all at global steps. Each restarted learner must bootstrap and contribute before
  // the next kill: 0.2 s of restart delay plus its start-up, ~30 steps at 0.035 s (~50 on a machine 3× faster, where
  // the 0.2 s are 3× as many steps), so the kills are 60 steps apart and the last one leaves 300 or more steps of
  // budget. The syncer's kill is the next test: the steps it costs are seconds of outage, so its number differs
  // 3× between machines and would move every fault planned after it.
  const int64_t budget = 2 * 600 * 32 * 32;
  const auto cfg = testing_support::write_decoupled_config(root_, "chaos", budget, "", 32, 96, 2, 0,
                                                           "shared_budget = true\nlearner_state_interval = 10\n");
  const json report = train_under_plan(cfg, R"(
[plan]
name = "test"
[[fault]]
at_step = 30
action = "kill_learner"
learner = 0
restart_after_s = 0.2
[[fault]]
at_step = 60
action = "pause_learner"
learner = 1
duration_s = 1.5
[[fault]]
at_step = 100
action = "kill_learner"
learner = 0
restart_after_s = 0.2
[[fault]]
at_step = 160
action = "kill_learner"
learner = 0
restart_after_s = 0.2
[[fault]]
at_step = 220
action = "kill_learner"
learner = 0
restart_after_s = 0.2
[[fault]]
at_step = 280
action = "kill_learner"
learner = 0
restart_after_s = 0.2
)", "chaos");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  expect_no_refusal(report, root_ / "chaos");
  EXPECT_EQ(report["faults_injected"], 6);
  EXPECT_EQ(report["learner_restarts"], 5);
  EXPECT_EQ(report["syncer_restarts"], 0);
  const fs::path run = root_ / "chaos";
  expect_faults_fired_at_their_steps(run, 6);

  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 32 * 32, 2.0});
  std::printf("%s\n", a.to_json().dump(1).c_str());
  // Exactly once: both streams' batches follow each other with no repeat and no gap, across 6 incarnations.
  EXPECT_GT(a.batches, 600);
  EXPECT_EQ(a.duplicate_batches, 0);
  EXPECT_EQ(a.gaps, 0);
  // The shared budget: the learners together took the budget. Past it: the steps in flight when the syncer's
  // notice went out (bounded here by 10%). Each stream's log holds one batch per step its learner trained, plus at
  // most one per kill (the batch whose step the kill cut short, lost, never retrained). (Which learner took more of
  // the budget is not asserted: it depends on what a restart costs in steps, 10–15 here, 2–3 with every learner 3×
  // slower.)
  int64_t batches[2] = {0, 0};
  for (int s = 0; s < 2; ++s) {  // the log's records (its header line is not a batch)
    batches[s] = static_cast<int64_t>(dloco::read_stream_log(dloco::stream_log_path(run, s)).size());
  }
  EXPECT_GE((batches[0] + batches[1]) * 32 * 32, budget);
  EXPECT_LE((batches[0] + batches[1]) * 32 * 32, budget + budget / 10);
  // Versions only increase, through 5 learner restarts.
  EXPECT_EQ(a.version_regressions, 0);
  // At the end every fragment of both learners (learner 0's sixth incarnation) equals Θ; no NaN anywhere.
  expect_every_final_copy_equals_theta(a, 2, 4);
  EXPECT_TRUE(a.nan_free);
  EXPECT_TRUE(a.consistent());
  ASSERT_EQ(a.learners.size(), 2u);
  // 6 processes, 5 or 6 of which bootstrapped: a kill lands in a restarted learner's start-up if that takes more
  // than the 60 steps between kills (~50 on a machine 3× faster, where 0.2 s of restart delay are 3× the steps).
  EXPECT_GE(a.learners[0].incarnations, 5);
  EXPECT_EQ(a.learners[0].kills, 5);
  EXPECT_GE(batches[0], a.learners[0].steps_trained);
  EXPECT_LE(batches[0], a.learners[0].steps_trained + a.learners[0].kills);
  EXPECT_EQ(batches[1], a.learners[1].steps_trained);
  // Every kill is followed by a rejoin. A contribution (a merge that includes the restarted learner) follows most
  // of them but not necessarily each: with K = 1 the never-killed learner leads and the restarted one's answers,
  // a few steps behind, can miss every grace window until the next kill or the end (a CI run on a 2-core EPYC:
  // the last two of five never contributed in the 60 steps before the next kill and the 120 before the end).
  ASSERT_EQ(a.recoveries.size(), 5u);
  int contributed = 0;
  for (const auto& r : a.recoveries) {
    EXPECT_GT(r.back_s, 0) << "learner 0 never rejoined after the kill at " << r.killed_at_s << " s";
    contributed += r.contributing_s > 0;
    std::printf("kill at %.1f s: back after %.2f s, contributing after %.2f s\n", r.killed_at_s, r.back_s,
                r.contributing_s);
  }
  EXPECT_GE(contributed, 3) << "learner 0 rarely contributed after its restarts";
  EXPECT_TRUE(a.syncer_downtime.empty());
  // A restarted learner resumes the AdamW moments its previous incarnation saved (every 10 of its steps; an
  // incarnation killed before its 10th step leaves the older save, so at least 3 of the 5 restarts find one).
  int restored = 0;
  for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
    if (e["event"] == "optimizer_restored") ++restored;
    EXPECT_NE(e["event"], "optimizer_not_restored") << e.dump();
  }
  EXPECT_GE(restored, 3);
  // The work of the learner that was never killed was merged. How much of it is not asserted: with K = 1 the clock
  // runs at the leading learner's pace and the other one's answers, a few steps behind, miss the grace window, so
  // the follower loses most of its work; which one leads depends on what a restart costs in steps (measured: the
  // never-killed learner kept 82–100% here, 36–100% with every learner 3× slower). Goodput counts both.
  EXPECT_GT(a.learners[1].steps_kept, 0);
  EXPECT_GT(a.goodput, 0.3);
  EXPECT_TRUE(std::isfinite(a.final_val_loss));
}

TEST_F(ChaosTest, KilledSyncerComesBackFromItsStateAndNoTokenOrCopyIsLost) {
  // M = 2 learners with 90 steps each (fixed shares: each learner stops at its own stream's budget whether the
  // syncer is up or not), the syncer killed at global step 60 and restarted 1 s later from its persisted state.
  // The learners never wait: they train on through the outage (the delay, the syncer's start-up, each client's
  // reconnect backoff of up to 2 s: 3–8 s), which is 100–250 of their steps on a 2-core EPYC, so here both finish
  // their share in it; with every learner 3× slower one may still be training when the syncer is back. Nothing
  // below depends on which: a learner that finished holds its last work until the syncer is back, the restarted
  // syncer waits for every stream's learner to re-attach before it ends (it once ended with the first one back,
  // dropping the other's last work: "incomplete", a copy one version behind Θ), and a learner that exited when
  // told to stop is never restarted (it once was, into a run that was over).
  const int64_t per_learner = 90;
  const auto cfg = testing_support::write_decoupled_config(root_, "syncer_kill", 2 * per_learner * 32 * 32, "", 32,
                                                           96, 2, 0, "learner_state_interval = 10\n");
  const json report = train_under_plan(cfg, "[[fault]]\nat_step = 60\naction = \"kill_syncer\"\n"
                                            "restart_after_s = 1.0\n", "syncer_kill");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  expect_no_refusal(report, root_ / "syncer_kill");
  EXPECT_EQ(report["faults_injected"], 1);
  EXPECT_EQ(report["syncer_restarts"], 1);
  EXPECT_EQ(report["learner_restarts"], 0);
  const fs::path run = root_ / "syncer_kill";
  expect_faults_fired_at_their_steps(run, 1);

  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 32 * 32, 2.0});
  std::printf("%s\n", a.to_json().dump(1).c_str());
  // Exactly once, and each stream's share exactly: the learners' cursors never depended on the syncer.
  EXPECT_EQ(a.duplicate_batches, 0);
  EXPECT_EQ(a.gaps, 0);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(static_cast<int64_t>(dloco::read_stream_log(dloco::stream_log_path(run, s)).size()), per_learner)
        << "stream " << s;
  }
  // The restarted syncer continued from what it had persisted (persist before broadcast): no fragment version went
  // back, and at the end both learners' every fragment equals its Θ; no NaN.
  EXPECT_EQ(a.version_regressions, 0);
  expect_every_final_copy_equals_theta(a, 2, 4);
  EXPECT_TRUE(a.nan_free);
  EXPECT_TRUE(a.consistent());
  ASSERT_EQ(a.syncer_downtime.size(), 1u);
  EXPECT_GT(a.syncer_downtime[0].back_s, 0.9);  // restarted after its 1 s delay
  EXPECT_GT(a.syncer_downtime[0].contributing_s, a.syncer_downtime[0].back_s) << "nothing merged after its return";
  // (Goodput is not asserted: with K = 1 the follower's answers miss most grace windows, 24–60% kept in all.)
  EXPECT_TRUE(std::isfinite(a.final_val_loss));
}

TEST_F(ChaosTest, PausedLearnerNeverMakesTheOtherWait) {
  // SIGSTOP learner 1 from global step 30 until global step 70 (K = 1: learner 0's own steps move the global
  // step while learner 1 is stopped; the 60 s cap only guards against a hang). Each learner has 120 steps, so the
  // run is still going when the pause ends, on any machine. Learner 0 trains ~40 steps through the pause and its
  // training thread never waits (time outside compute), and the run finishes once learner 1 is continued.
  const auto cfg = testing_support::write_decoupled_config(root_, "pause", 2 * 120 * 32 * 32, "", 32, 96, 2, 0);
  const json report = train_under_plan(cfg, "[[fault]]\nat_step = 30\naction = \"pause_learner\"\nlearner = 1\n"
                                            "until_step = 70\nduration_s = 60\n", "pause");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  expect_no_refusal(report, root_ / "pause");
  const fs::path run = root_ / "pause";
  expect_faults_fired_at_their_steps(run, 1);
  const auto [paused_at, resumed_at] = fault_window(run, "pause_learner", 1);
  ASSERT_GT(paused_at, 0) << "the pause was never injected";
  ASSERT_GT(resumed_at, paused_at) << "the pause never ended";
  const int during = steps_between(run, 0, paused_at, resumed_at);
  std::printf("pause of learner 1: %.2f s; learner 0 trained %d steps in it, learner 1 %d\n", resumed_at - paused_at,
              during, steps_between(run, 1, paused_at + 0.5, resumed_at));
  EXPECT_GE(during, 30) << "learner 0 stopped training while learner 1 was paused";
  // From 0.5 s after the fault event: on a loaded machine the launcher can be descheduled between logging the
  // fault and sending SIGSTOP, and a slowed learner can log a step in that gap (seen once with DLOCO_TEST_SLOWDOWN=3).
  EXPECT_EQ(steps_between(run, 1, paused_at + 0.5, resumed_at), 0) << "learner 1 was not stopped";
  EXPECT_GE(events_named(run, "learner_0", "step").size(), 100u);
  expect_never_waited(run, 0, 2);
}

TEST_F(ChaosTest, CutAndDelayedLinksNeverStopTrainingAndTheWorkCountsAgain) {
  // Learner 1's link to the syncer is cut from global step 30 to 70 (a partition: silence), learner 0's is
  // 100 ms slower each way from 40 to 90. Each learner has 200 steps. Both keep training through it (the global
  // step moves on with the other learner's steps), and learner 1's work is merged again after the cut.
  const auto cfg = testing_support::write_decoupled_config(root_, "links", 2 * 200 * 32 * 32, "", 32, 96, 2, 0);
  const json report = train_under_plan(cfg, R"(
[[fault]]
at_step = 30
action = "cut_link"
learner = 1
until_step = 70
duration_s = 60
[[fault]]
at_step = 40
action = "delay_link"
learner = 0
delay_ms = 100
until_step = 90
duration_s = 60
)", "links");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  expect_no_refusal(report, root_ / "links");
  EXPECT_EQ(report["faults_injected"], 2);
  const fs::path run = root_ / "links";
  expect_faults_fired_at_their_steps(run, 2);
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 32 * 32, 2.0});
  std::printf("%s\n", a.to_json()["link_faults"].dump(1).c_str());
  EXPECT_TRUE(a.consistent()) << a.to_json().dump(1);
  expect_every_final_copy_equals_theta(a, 2, 4);
  ASSERT_EQ(a.link_faults.size(), 2u);
  for (const auto& l : a.link_faults) {
    EXPECT_GE(l.steps_during, 20) << "learner " << l.learner << " stopped training during " << l.action;
    EXPECT_GE(l.contributing_s, 0) << "learner " << l.learner << "'s work never counted again after " << l.action;
  }
  // Neither training thread waited on its link.
  expect_never_waited(run, 1, 2);
  expect_never_waited(run, 0, 2);
}

TEST_F(ChaosTest, LearnerKilledWhileTheSyncerPullsFromItNeitherHangsNorReordersVersions) {
  // Learner 1's link is 0.8 s slower each way from global step 30 to 60, so every pull the syncer sends it is in
  // flight for at least 1.6 s; with K = 2 every round pulls from both learners. Killing learner 1 at step 60
  // therefore kills it while the syncer is pulling fragments from it (checked below from the syncer's log, not
  // assumed): the delay ends at the same step, just before the kill, and the bytes already in the proxy keep
  // their delay. It restarts 0.5 s later on a link without delay. (The delay must not outlast the kill in steps:
  // with K = 2 the global step stands still until learner 1 is back, and through an 0.8 s link its bootstrap
  // took 19 s, while learner 0 spent the shared budget alone.) The open rounds must close without it, every
  // version must only increase, and learner 0, which is never killed, must apply every version in order.
  const auto cfg = testing_support::write_decoupled_config(root_, "pullkill", 2 * 200 * 32 * 32, "", 32, 96, 2, 0,
                                                           "shared_budget = true\n");
  const json report = train_under_plan(cfg, R"(
[[fault]]
at_step = 30
action = "delay_link"
learner = 1
delay_ms = 800
until_step = 60
duration_s = 60
[[fault]]
at_step = 60
action = "kill_learner"
learner = 1
restart_after_s = 0.5
)", "pullkill", "--set diloco.quorum=2");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  expect_no_refusal(report, root_ / "pullkill");
  EXPECT_EQ(report["learner_restarts"], 1);
  const fs::path run = root_ / "pullkill";
  expect_faults_fired_at_their_steps(run, 2);
  double killed_at = -1;
  for (const auto& e : read_events(run / "events" / "launcher.jsonl")) {
    if (e["event"] == "fault" && e["action"] == "kill_learner") killed_at = e["t"];
  }
  ASSERT_GT(killed_at, 0) << "the kill was never injected";
  // Rounds whose pull included learner 1 and that were still open when it died: each was merged afterwards.
  std::map<std::pair<int, int64_t>, double> open_at_kill;  // (fragment, round) -> when its pull was sent
  std::vector<json> merged_after;
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    const double t = e["t"];
    if (e["event"] == "pull" && t < killed_at) {
      for (int who : e["learners"]) {
        if (who == 1) open_at_kill[{e["fragment"].get<int>(), e["round"].get<int64_t>()}] = t;
      }
    }
    if (e["event"] == "merged" || e["event"] == "round_skipped") {
      const std::pair<int, int64_t> key{e["fragment"].get<int>(), e["round"].get<int64_t>()};
      if (t < killed_at) {
        open_at_kill.erase(key);
      } else if (open_at_kill.count(key)) {
        merged_after.push_back(e);
        open_at_kill.erase(key);
      }
    }
  }
  EXPECT_GE(merged_after.size(), 1u) << "no pull from learner 1 was in flight when it was killed";
  EXPECT_TRUE(open_at_kill.empty()) << open_at_kill.size() << " round(s) pulling from the killed learner never closed";
  // Versions only increase, for both learners, through the kill; learner 0 applies every version in order.
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 32 * 32, 2.0});
  EXPECT_EQ(a.version_regressions, 0);
  std::map<int, int64_t> last;
  int out_of_order = 0, applied = 0;
  for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
    if (e["event"] != "applied") continue;
    const int p = e["fragment"];
    const int64_t v = e["version"];
    out_of_order += v != (last.count(p) ? last[p] + 1 : v) ? 1 : 0;
    last[p] = v;
    ++applied;
  }
  EXPECT_GT(applied, 40);
  EXPECT_EQ(out_of_order, 0) << "learner 0 skipped or reordered a version";
  EXPECT_EQ(a.duplicate_batches, 0);
  EXPECT_EQ(a.gaps, 0);
  expect_every_final_copy_equals_theta(a, 2, 4);  // learner 1's second incarnation finished too
  EXPECT_TRUE(a.nan_free);
}

TEST_F(ChaosTest, ALearnerJoiningMidRunNeverMakesTheOtherWait) {
  // The issue's measure, on a machine the join does not oversubscribe: M = 1 learner with one BLAS thread (plus
  // the syncer and the evaluator) on 2 cores, and learner 1 (one thread too) joins at global step 30 of ~150,
  // bootstrapping from learner 0 as its peer. Learner 0 never waits through the join: its time outside compute
  // stays within the bound. (Its raw gaps are printed, not asserted: the joiner's start-up, loading LibTorch and
  // building its model, competes with it for CPU and stretches its compute, seen up to 2.13× the median gap.)
  const auto cfg = testing_support::write_decoupled_config(root_, "join", 2 * 150 * 32 * 32, "", 32, 96, 1, 0,
                                                           "shared_budget = true\n");
  const json report = train_under_plan(cfg, "[[fault]]\nat_step = 30\naction = \"add_learner\"\nlearner = 1\n",
                                       "join", "--set data.streams=2 --set diloco.bootstrap=peers --set run.threads=1");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  expect_no_refusal(report, root_ / "join");
  const fs::path run = root_ / "join";
  expect_faults_fired_at_their_steps(run, 1);
  json joined;
  for (const auto& e : read_events(run / "events" / "learner_1.jsonl")) {
    if (e["event"] == "bootstrapped") joined = e;
  }
  ASSERT_FALSE(joined.is_null()) << "learner 1 never bootstrapped";
  EXPECT_EQ(joined["stream"], 1);
  int from_peer = 0;
  for (const auto& [source, n] : joined["sources"].items()) from_peer += source.rfind("peer 0", 0) == 0 ? n.get<int>() : 0;
  EXPECT_GE(from_peer, 1) << joined.dump();
  double added_at = -1;
  for (const auto& e : read_events(run / "events" / "launcher.jsonl")) {
    if (e["event"] == "learner_added") added_at = e["t"];
  }
  ASSERT_GT(added_at, 0);
  EXPECT_GT(steps_between(run, 0, added_at, 1e18), 20) << "learner 0 trained little after the join";
  EXPECT_GT(steps_between(run, 0, joined["t"].get<double>(), 1e18), 10) << "learner 0 trained little beside learner 1";
  expect_never_waited(run, 0, 1);
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {1, 4, 4, 32 * 32, 2.0});
  expect_every_final_copy_equals_theta(a, 2, 4);
}

TEST_F(ChaosTest, LearnersJoiningAndLeavingMidRunNeverMakeTheOthersWait) {
  // Scavenging (docs/protocol.md §7). M = 2 learners, S = 3 data streams, a shared budget of 1100 steps, bootstrap from
  // peers; the global step (K = 2: the second largest) ends near 470 here, near 260 when slots 0 and 1 are 3×
  // slower and the joiners are not (DLOCO_TEST_SLOWDOWN slows the M slots only). At global steps:
  //    20  learner 2 joins: it leases the free stream 2 and takes Θ from the live peers 0 and 1;
  //    40  learner 1 is killed for good: stream 1 is orphaned, its lease runs out ~5 s later;
  //    50  learner 3 joins: no stream is free until learner 1's lease runs out, then it takes stream 1 over
  //        and continues its log exactly where learner 1 stopped;
  //   200  learner 2 leaves gracefully: the syncer frees its stream at once and nobody restarts it. Stream 1
  //        must be free before stream 2 is, or learner 3 would take stream 2: the 160 steps since the kill
  //        outlast the 5 s lease on a machine with steps down to 0.035 s (~0.2 s here, 3× faster: ~0.07 s).
  // The others' training threads never wait for any of it. K = 2: with K = 1 and τ = 1 the clock runs at the
  // fastest learner's pace, and on this 2-core machine a learner a few steps behind it falls outside every grace
  // window (ξ_grace = γ·(τ·ξ_step − ξ_quorum − ξ_sync) ≈ 0.01 s), so a joiner's work would be merged only by
  // the final flush.
  const int64_t budget = 2 * 550 * 32 * 32;
  const auto cfg = testing_support::write_decoupled_config(root_, "scavenge", budget, "", 32, 96, 2, 0,
                                                           "shared_budget = true\n");
  const json report = train_under_plan(cfg, R"(
[[fault]]
at_step = 20
action = "add_learner"
learner = 2
[[fault]]
at_step = 40
action = "kill_learner"
learner = 1
restart_after_s = -1
[[fault]]
at_step = 50
action = "add_learner"
learner = 3
[[fault]]
at_step = 200
action = "leave_learner"
learner = 2
)", "scavenge", "--set data.streams=3 --set diloco.bootstrap=peers --set diloco.quorum=2");
  ASSERT_FALSE(report.is_null());
  EXPECT_EQ(report["status"], "finished");
  // A joiner's fresh AdamW amid warm learners moved 4–11× further per step in its first answers and the norm screen
  // refused one in 2 of 5 runs, until joiners re-warmed (lr_rewarmed below, core/lr_schedule.h).
  expect_no_refusal(report, root_ / "scavenge");
  EXPECT_EQ(report["faults_injected"], 4);
  EXPECT_EQ(report["learner_restarts"], 0) << "a learner that left, or one killed for good, was restarted";
  const fs::path run = root_ / "scavenge";
  expect_faults_fired_at_their_steps(run, 4);
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 32 * 32, 2.0});
  std::printf("%s\n", a.to_json().dump(1).c_str());

  // Each joiner leased the stream the plan implies, bootstrapped, and its work was merged.
  auto bootstrapped = [&](int id) {
    json out;
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      if (e["event"] == "bootstrapped") out = e;
    }
    return out;
  };
  const json b2 = bootstrapped(2), b3 = bootstrapped(3);
  ASSERT_FALSE(b2.is_null()) << "learner 2 never bootstrapped";
  ASSERT_FALSE(b3.is_null()) << "learner 3 never bootstrapped";
  for (int id : {2, 3}) {  // fresh moments in a warm run: each repeats the warmup from the step it joined at
    int rewarmed = 0;
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      if (e["event"] == "lr_rewarmed") rewarmed += e["from_step"] == (id == 2 ? b2 : b3)["global_step"];
    }
    EXPECT_EQ(rewarmed, 1) << "learner " << id;
  }
  EXPECT_EQ(b2["stream"], 2);
  EXPECT_EQ(b3["stream"], 1) << "learner 3 did not take over the orphaned stream";
  int from_peers = 0;
  for (const json& b : {b2, b3}) {
    for (const auto& [source, n] : b["sources"].items()) from_peers += source.rfind("peer", 0) == 0 ? n.get<int>() : 0;
  }
  EXPECT_GE(from_peers, 1) << "no fragment came from a peer: " << b2.dump() << b3.dump();
  ASSERT_EQ(a.learners.size(), 4u);
  EXPECT_EQ(a.learners_added, 2);
  EXPECT_EQ(a.learners_left, 1);
  EXPECT_GT(a.learners[2].steps_kept, 0);
  EXPECT_GT(a.learners[3].steps_kept, 0);
  EXPECT_EQ(a.learners[2].incarnations, 1);
  // Allocated learner-seconds: 2 slots for the window, plus the joiners from their join (learner 2 until its leave).
  EXPECT_GT(a.slot_seconds, 2.5 * a.window_s);
  EXPECT_LT(a.slot_seconds, 4.0 * a.window_s);

  // The leave reached the syncer (stream freed at once) and the learner said so.
  bool left = false;
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    if (e["event"] == "learner_left" && e["learner"] == 2) left = e["stream"] == 2;
  }
  EXPECT_TRUE(left) << "the syncer never saw learner 2 leave";

  // Exactly once across the handover: stream 1's log holds learner 1's batches, then learner 3's, with no
  // repeat and no gap (and so does every other stream).
  const auto records = dloco::read_stream_log(dloco::stream_log_path(run, 1));
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.front().learner, 1);
  EXPECT_EQ(records.back().learner, 3);
  EXPECT_TRUE(dloco::check_stream_log(records, 32 * 32).ok());
  EXPECT_EQ(a.duplicate_batches, 0);
  EXPECT_EQ(a.gaps, 0);
  EXPECT_LE(a.batches * 32 * 32, budget + budget / 10);
  EXPECT_EQ(a.version_regressions, 0);
  // Final copies: learners 0 and 3 finished (every fragment equals Θ); 1 was killed for good and 2 left.
  expect_every_final_copy_equals_theta(a, 2, 4);
  EXPECT_EQ(a.learners_gone, 2);
  EXPECT_EQ(a.learners[1].end, "killed");
  EXPECT_EQ(a.learners[2].end, "left");
  EXPECT_TRUE(a.nan_free);

  // Learner 0 never waited: not for the joins (bootstraps from it included), the kill, or the leave. On this
  // 2-core machine the third and fourth learner processes take CPU from it, so its forward/backward itself slows
  // (measured: up to ~2.7× the median gap while a joiner starts), which is contention, not waiting; its time
  // outside compute (boundary, metadata, applying merges, serving peers) stays within the bound.
  expect_never_waited(run, 0, 2);
}

}  // namespace
