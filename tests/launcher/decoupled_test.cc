// Decoupled DiLoCo end to end with real processes over loopback: a syncer, an evaluator and 3 learners of a
// tiny model. Checks the integration properties (the global model beats a unigram model of the corpus,
// merges combine learners, every learner applied every fragment's versions in order and ends holding Θ) and
// failure isolation (kill -9 one learner mid-run: the others' training threads never wait, the run finishes; the
// syncer away and back; a wrong secret or layout is refused with a clear message). Runs are sized in steps and
// the kill comes at a step, so the tests hold on faster and slower machines (DLOCO_TEST_SLOWDOWN, tiny_corpus.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "chaos/chaos_report.h"
#include "support/process_checks.h"
#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
namespace testing_support = dloco::testing_support;
using nlohmann::json;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

using testing_support::read_events;
using testing_support::kMaxOutsideCompute_s;
using testing_support::signal_child;

// The pid of the learner whose event log is `log` once it has trained `steps` steps (polled every 0.1 s, for up to
// 120 s); −1 if it never got there.
pid_t pid_once_trained(const fs::path& log, int steps) {
  for (int i = 0; i < 1200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    int trained = 0, pid = -1;
    for (const auto& e : read_events(log)) {
      trained += e["event"] == "step";
      if (e["event"] == "bootstrapped") pid = e["pid"];
    }
    if (trained >= steps) return pid;
  }
  return -1;
}

class DecoupledTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing_support::make_tiny_corpus("dloco_decoupled", kDataTool);
    ASSERT_FALSE(root_.empty()) << "dloco-data prepare failed on the tiny corpus";
  }
  static void TearDownTestSuite() { testing_support::remove_unless_kept(root_); }

  // A tiny decoupled run: M = 3, P = 4 fragments, H = 4, τ = 1, K = 1 with the grace window.
  static fs::path write_config(const std::string& name, int64_t total_tokens, const std::string& extra = "",
                               int batch_size = 8, int d_model = 32, int learners = 3, int eval_interval = 10) {
    return testing_support::write_decoupled_config(root_, name, total_tokens, extra, batch_size, d_model, learners,
                                                   eval_interval);
  }

  static fs::path root_;
};
fs::path DecoupledTest::root_;

TEST_F(DecoupledTest, ThreeLearnersTrainTheGlobalModelOverLoopback) {
  // 3 learners × 120 steps × 256 tokens: a few seconds of training, so the evaluator (which starts alongside and
  // loads LibTorch first) sees the run before it ends, also on a busy CI machine.
  // K = 2: every round waits for two live learners, so merges before the final flush combine two learners whatever
  // the machine's speed (with K = 1 that needed their LibTorch start-ups to overlap, which a loaded CI machine
  // does not promise: seen once, no merge combined two).
  const auto cfg = write_config("three", 3 * 120 * 256);
  ASSERT_EQ(std::system((kDloco + " train --config " + cfg.string() + " --set diloco.quorum=2 > " +
                         (root_ / "three.log").string() +
                         " 2>&1")
                            .c_str()),
            0)
      << "see " << (root_ / "three.log");
  const fs::path run = root_ / "three";
  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_EQ(report["tokens_trained"], 3 * 120 * 256);
  // The global model learned more than token frequencies: its final loss on the validation split beats the
  // unigram cross-entropy of the corpus (train-split counts scored on that split, computed here from the shards).
  const double unigram = testing_support::unigram_cross_entropy(root_ / "data");
  const auto meta = json::parse(std::ifstream(root_ / "data" / "meta.json"));
  EXPECT_NEAR(unigram, meta["unigram_val_nats_per_token"].get<double>(), 1e-6);  // dloco-data agrees
  std::printf("final validation loss %.4f, unigram %.4f, uniform %.4f nats/token\n",
              report["final_val_loss"].get<double>(), unigram, std::log(400.0));
  EXPECT_LT(report["final_val_loss"].get<double>(), unigram) << report.dump(2);
  EXPECT_GT(report["merges"].get<int64_t>(), 20);

  // The syncer's merges: during training (before the final flush, which merges every learner by construction)
  // some combined the work of two or more learners (participants), and the versions each produced, per fragment,
  // are the ones the learners may apply. (Measured here: 8–21 of ~120 merges before the flush had 2 or 3.)
  std::map<int, std::set<int64_t>> merged_versions;  // fragment -> versions the syncer merged
  int combined = 0;
  bool flushing = false;
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    flushing |= e["event"] == "final_flush";
    if (e["event"] != "merged") continue;
    merged_versions[e["fragment"].get<int>()].insert(e["version"].get<int64_t>());
    combined += !flushing && e["participants"].size() >= 2 ? 1 : 0;
  }
  EXPECT_EQ(merged_versions.size(), 4u);
  std::printf("merges before the final flush that combined 2+ learners: %d\n", combined);
  EXPECT_GE(combined, 1) << "no merge during training combined two learners (K = 2)";
  // Every learner applied every fragment, each one's versions in strictly increasing order, each a version the
  // syncer merged; and at the end each holds every fragment at Θ's final version and hash.
  for (int id = 0; id < 3; ++id) {
    std::map<int, int64_t> last;
    int out_of_order = 0, unknown = 0;
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      if (e["event"] != "applied") continue;
      const int p = e["fragment"];
      const int64_t v = e["version"];
      out_of_order += last.count(p) && v <= last[p] ? 1 : 0;
      unknown += merged_versions[p].count(v) == 0 ? 1 : 0;
      last[p] = v;
    }
    EXPECT_EQ(last.size(), 4u) << "learner " << id << " did not receive every fragment";
    EXPECT_EQ(out_of_order, 0) << "learner " << id << " applied a fragment's versions out of order";
    EXPECT_EQ(unknown, 0) << "learner " << id << " applied a version the syncer never merged";
  }
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {3, 4, 4, 8 * 32, 2.0});
  EXPECT_EQ(a.version_regressions, 0);
  EXPECT_EQ(a.learners_finished, 3);
  EXPECT_EQ(a.fragments_checked, 3 * 4);
  EXPECT_EQ(a.fragments_equal, a.fragments_checked);
  for (const auto& m : a.copy_mismatches) ADD_FAILURE() << m;
  // The evaluator evaluated snapshots of Θ during the run (on train.eval_tokens tokens, so not comparable with the
  // final whole-split loss); each snapshot it saw had already learned something over the uniform ln 400.
  std::vector<double> evals;
  for (const auto& e : read_events(run / "events" / "evaluator.jsonl")) {
    if (e["event"] == "eval") evals.push_back(e["val_loss"]);
  }
  ASSERT_GE(evals.size(), 1u);
  for (double e : evals) EXPECT_LT(e, std::log(400.0));
}

TEST_F(DecoupledTest, EmulatedSlowerChipsReportTheirWholeStepSoTheGraceWindowOpens) {
  // run.slowdown emulates a chip F times slower: the learner sleeps (F − 1)× its steady compute after each step. The
  // syncer sizes the grace window by the slowest live learner's reported step time, ξ_grace = γ·(τ·ξ_step − ξ_quorum −
  // ξ_sync) (docs/protocol.md §5). A learner that reported its compute alone (1/F of its cadence) left no slack: the
  // time to sync (a learner answers at its next step boundary) took all of τ·compute, every grace window was 0 and
  // merges kept only the first K answers (issue 32's scavenging and heterogeneous benches). M = 3, K = 1, τ = 2,
  // every learner 16× its compute and learner 2 24×: most rounds reach their quorum with learners still to come.
  const auto cfg = write_config("emulated", 3 * 60 * 256, "", 8, 32, 3, 0);
  const std::string log = (root_ / "emulated.log").string();
  ASSERT_EQ(std::system((kDloco + " train --config " + cfg.string() +
                         " --set diloco.overlap=2 --set 'run.slowdown=\"*:16,2:24\"' > " + log + " 2>&1").c_str()),
            0)
      << "see " << log;
  const fs::path run = root_ / "emulated";
  EXPECT_EQ(json::parse(std::ifstream(run / "report.json"))["status"], "finished");
  std::vector<double> cadence;  // learners 0 and 1: the emulated chip's step, compute + sleep
  for (int id = 0; id < 2; ++id) {
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      if (e["event"] == "step") cadence.push_back(e["step_s"].get<double>() + e["sleep_s"].get<double>());
    }
  }
  ASSERT_GE(cadence.size(), 100u);
  std::nth_element(cadence.begin(), cadence.begin() + cadence.size() / 2, cadence.end());
  const double step_s = cadence[cadence.size() / 2];
  std::vector<double> grace;  // at each training round's quorum, the window it opened
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    if (e["event"] == "quorum_reached" && e["round"].get<int64_t>() >= 0) grace.push_back(e["grace_s"].get<double>());
  }
  ASSERT_GE(grace.size(), 20u);
  std::nth_element(grace.begin(), grace.begin() + grace.size() / 2, grace.end());
  const double median = grace[grace.size() / 2];
  std::printf("emulated step %.4f s; median grace window at a quorum %.4f s (%.2f of a step) over %zu rounds\n",
              step_s, median, median / step_s, grace.size());
  // γ·(τ·ξ_step − ξ_sync), ξ_step learner 2's (1.5 of the others' steps), ξ_sync ≲ one step: 1–1.5 steps measured;
  // 0 when the sleep is left out of ξ_step.
  EXPECT_GE(median, 0.15 * step_s) << "the grace windows are sized for a faster chip than the one emulated";
}

TEST_F(DecoupledTest, KilledLearnerNeverStallsTheOthers) {
  // M = 2 learners of one thread each on 2 cores, so a learner's step time is the same before and after the
  // kill; steps of ~0.1 s so scheduling noise stays small against a step; no evaluations competing for cores.
  // The streams are shuffled (data.order): the take-over resumes a shuffled stream from its cursor.
  const auto cfg = testing_support::write_decoupled_config(root_, "kill", 2 * 120 * 32 * 32, "restart_delay_s = -1.0\n",
                                                           32, 96, 2, 0, "", "order = \"shuffled\"\n");
  const fs::path run = root_ / "kill";
  const std::string cmd = kDloco + " train --config " + cfg.string() + " > " + (root_ / "kill.log").string() + " 2>&1";
  // Learner 1 is never restarted: once its lease has run out and learner 0 has spent its own share, learner 0 takes
  // stream 1 over and trains the rest of its share (docs/protocol.md §7, take-over), so the run finishes.
  std::thread launcher([&] {
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "status " << rc << ", see " << (root_ / "kill.log");
  });
  // Wait until learner 1 has trained 30 steps, then kill -9 it.
  const pid_t victim = pid_once_trained(run / "events" / "learner_1.jsonl", 30);
  if (victim <= 0) {
    launcher.join();  // the run ends by itself (its learners spend their budgets) before the test fails
    FAIL() << "learner 1 never reached step 30";
  }
  EXPECT_EQ(signal_child(victim, SIGKILL, "learner 1"), 0);
  const double killed_at =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  launcher.join();

  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_GE(report["tokens_trained"].get<int64_t>(), report["tokens_complete"].get<int64_t>());
  bool absent = false;
  int offered = 0, taken = 0;
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    absent |= e["event"] == "learner_absent";
    offered += e["event"] == "stream_offered" && e["learner"] == 0 && e["stream"] == 1;
    taken += e["event"] == "stream_taken_over" && e["learner"] == 0 && e["stream"] == 1;
  }
  EXPECT_TRUE(absent) << "the syncer should have noticed learner 1's absence";
  EXPECT_EQ(offered, 1) << "stream 1 should have been offered to learner 0 once";
  EXPECT_EQ(taken, 1);
  // Learner 0 continued stream 1 one batch after learner 1's last one: no batch of the stream repeated or skipped.
  double taken_at = std::numeric_limits<double>::infinity();
  for (const auto& e : read_events(run / "events" / "learner_0.jsonl")) {
    if (e["event"] == "stream_taken_over") taken_at = e["t"];
  }
  ASSERT_TRUE(std::isfinite(taken_at)) << "learner 0 logged no take-over";
  std::ifstream log(run / "streams" / "stream_1.jsonl");
  std::string line;
  int64_t expected = 0, by_0 = 0, by_1 = 0;
  while (std::getline(log, line)) {
    const json r = json::parse(line);
    if (!r.contains("tokens_served")) continue;  // the header
    EXPECT_EQ(r["tokens_served"].get<int64_t>(), expected) << "stream 1's batches repeat or skip: " << line;
    expected = r["tokens_served"].get<int64_t>() + 32 * 32;  // B·T of this run
    (r["learner"] == 0 ? by_0 : by_1) += 1;
  }
  EXPECT_GE(by_1, 30);
  EXPECT_GT(by_0, 0) << "learner 0 trained nothing of stream 1";
  EXPECT_EQ(expected, report["tokens_complete"].get<int64_t>() / 2) << "stream 1 did not reach its share";
  // The survivor never waited on anything: between any two of its steps its training thread spent at most
  // kMaxOutsideCompute_s outside the step's own compute (boundary, metadata, bookkeeping; a wait on the dead
  // learner or the network would last a deadline, hundreds of ms). Raw gaps are printed, not asserted: CPU
  // contention stretches the compute too, and that is not waiting.
  const auto steps = read_events(run / "events" / "learner_0.jsonl");
  // Its steps on its own stream: after them it waited, finished, for stream 1's lease to run out.
  const auto timing = testing_support::time_outside_compute(steps, testing_support::slowdown_of(0, 2), 6,
                                                            -std::numeric_limits<double>::infinity(), taken_at);
  double max_boundary = 0;
  for (const auto& e : steps) {
    if (e["event"] == "step") max_boundary = std::max(max_boundary, e["boundary_s"].get<double>());
  }
  std::printf("[learner 0] %zu steps, median gap %.4f s, largest %.4f s, max boundary %.5f s (slowdown sleep "
              "included), max time outside compute %.5f s\n",
              timing.steps, timing.median_gap, timing.largest_gap, max_boundary, timing.most_outside);
  EXPECT_LE(timing.most_outside, kMaxOutsideCompute_s) << "learner 0 waited before its step at t = "
                                                       << timing.most_outside_t;
  // Its own stream's steps (before the take-over), some of them after the kill (the run is sized so: 120 steps
  // each, the kill at learner 1's 30th).
  int own = 0, after_kill = 0;
  for (const auto& e : steps) {
    if (e["event"] != "step" || e["t"].get<double>() > taken_at) continue;
    ++own;
    after_kill += e["t"].get<double>() > killed_at;
  }
  EXPECT_EQ(own, 120) << "learner 0 did not train its own share before taking stream 1 over";
  EXPECT_GT(after_kill, 20) << "learner 0 trained little after learner 1 was killed";
}

TEST_F(DecoupledTest, APausedLearnersStreamIsNotTakenOverWhileItsLogIsLocked) {
  // Take-over (docs/protocol.md §7) meets a holder that is alive but silent: learner 1 is stopped (SIGSTOP) at its
  // 30th step, so its lease runs out while it holds its stream's log. Learner 0 spends its share and is offered
  // stream 1, finds the log locked and declines; learner 1 is continued only then (event-driven, whatever the
  // machine's speed), claims its stream back and finishes its own share: nothing is trained twice, the run finishes.
  const auto cfg = write_config("pause", 2 * 120 * 32 * 32, "", 32, 96, 2, 0);
  const fs::path run = root_ / "pause";
  const std::string cmd = kDloco + " train --config " + cfg.string() + " > " + (root_ / "pause.log").string() + " 2>&1";
  std::thread launcher([&] {
    const int rc = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "status " << rc << ", see " << (root_ / "pause.log");
  });
  auto count = [&](const fs::path& log, const char* event) {
    int n = 0;
    for (const auto& e : read_events(log)) n += e["event"] == event;
    return n;
  };
  const pid_t victim = pid_once_trained(run / "events" / "learner_1.jsonl", 30);
  if (victim <= 0) {
    launcher.join();
    FAIL() << "learner 1 never reached step 30";
  }
  ASSERT_EQ(signal_child(victim, SIGSTOP, "learner 1"), 0);
  bool declined = false;  // learner 0's own event: it found the log locked
  for (int i = 0; i < 1200 && !declined; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    declined = count(run / "events" / "learner_0.jsonl", "stream_offer_declined") > 0;
  }
  EXPECT_EQ(signal_child(victim, SIGCONT, "learner 1"), 0);
  launcher.join();
  ASSERT_TRUE(declined) << "learner 0 was never offered stream 1, or took it over although its log was locked";
  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_GE(report["tokens_trained"].get<int64_t>(), report["tokens_complete"].get<int64_t>());
  EXPECT_EQ(count(run / "events" / "syncer.jsonl", "stream_taken_over"), 0);
  EXPECT_GE(count(run / "events" / "syncer.jsonl", "stream_offer_declined"), 1);
  std::ifstream log(run / "streams" / "stream_1.jsonl");
  std::string line;
  int64_t expected = 0;
  while (std::getline(log, line)) {
    const json r = json::parse(line);
    if (!r.contains("tokens_served")) continue;  // the header
    EXPECT_EQ(r["learner"], 1) << "another learner trained stream 1: " << line;
    EXPECT_EQ(r["tokens_served"].get<int64_t>(), expected) << "stream 1's batches repeat or skip: " << line;
    expected = r["tokens_served"].get<int64_t>() + 32 * 32;
  }
  EXPECT_EQ(expected, report["tokens_complete"].get<int64_t>() / 2) << "learner 1 did not finish its share";
  const dloco::ChaosAnalysis a = dloco::analyze_chaos_run(run, {2, 4, 4, 32 * 32, 2.0});
  EXPECT_EQ(a.learners_finished, 2);
  EXPECT_EQ(a.fragments_equal, a.fragments_checked);
  EXPECT_EQ(a.fragments_checked, 2 * 4);
}

// Starts `dloco syncer` in the background; returns its pid. The bound address lands in `address_file`.
int start_syncer(const fs::path& cfg, const std::string& listen, const fs::path& run, const fs::path& address_file,
                 const std::string& log) {
  const std::string cmd = kDloco + " syncer --config " + cfg.string() + " --run-dir " + run.string() + " --listen " +
                          listen + " --address-file " + address_file.string() + " > " + (run / log).string() +
                          " 2>&1 & echo $!";
  int pid = 0;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    if (std::fscanf(p, "%d", &pid) != 1) pid = 0;
    ::pclose(p);
  }
  return pid;
}

std::string wait_for_address(const fs::path& file) {
  std::string address;
  for (int i = 0; i < 300 && address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream(file) >> address;
  }
  return address;
}

int count_events(const fs::path& file, const std::string& name, double after = 0) {
  int n = 0;
  for (const auto& e : read_events(file)) n += e["event"] == name && e["t"].get<double>() > after;
  return n;
}

double now_unix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST_F(DecoupledTest, LearnerKeepsTrainingWhileTheSyncerIsAwayAndReattaches) {
  const auto cfg = write_config("away", 1'000'000'000, "", 8, 32, 1, 0);
  const fs::path run = root_ / "away";
  fs::create_directories(run);
  testing_support::ChildGuard children;  // nothing keeps running if an ASSERT below stops the test
  const int syncer = children.hold(start_syncer(cfg, "127.0.0.1:0", run, run / "addr1", "syncer1.log"));
  ASSERT_GT(syncer, 0) << "the syncer did not start";
  const std::string address = wait_for_address(run / "addr1");
  ASSERT_FALSE(address.empty());
  const std::string learner_cmd = kDloco + " learner --config " + cfg.string() + " --syncer " + address +
                                  " --id 0 --run-dir " + run.string() + " > " + (run / "learner.log").string() +
                                  " 2>&1 & echo $!";
  int learner = 0;
  if (FILE* p = ::popen(learner_cmd.c_str(), "r")) {
    if (std::fscanf(p, "%d", &learner) != 1) learner = 0;
    ::pclose(p);
  }
  ASSERT_GT(children.hold(learner), 0) << "the learner did not start";
  const fs::path events = run / "events" / "learner_0.jsonl";
  for (int i = 0; i < 300 && count_events(events, "applied") < 8; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(count_events(events, "applied"), 8) << "no merges before the syncer kill";

  ASSERT_EQ(children.kill(syncer, SIGKILL, "the syncer"), 0);
  const double killed = now_unix();
  std::map<int, int64_t> held;  // fragment -> the version the learner holds when the syncer dies
  for (const auto& e : read_events(events)) {
    if (e["event"] == "applied") held[e["fragment"].get<int>()] = e["version"];
  }
  // What a SIGKILL in the middle of persisting leaves behind (every write is temp file + rename): a half-written
  // temp copy of each fragment file and of state.json. The restart must ignore them and load the previous files.
  int planted = 0;
  for (const auto& entry : fs::directory_iterator(run / "syncer")) {
    const fs::path f = entry.path();
    if (f.extension() != ".safetensors" && f.filename() != "state.json") continue;
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(f.string() + ".tmp.12345.0", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    ++planted;
  }
  EXPECT_GT(planted, 1);
  // The learner trains on alone: 20 steps (a deadline only against a hang, not a measure of speed).
  for (int i = 0; i < 600 && count_events(events, "step", killed) < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(count_events(events, "step", killed), 20) << "the learner stopped training while the syncer was away";

  // The syncer comes back on the same port from its persisted fragments; the learner re-attaches on its own.
  const int syncer2 = children.hold(start_syncer(cfg, address, run, run / "addr2", "syncer2.log"));
  EXPECT_GT(syncer2, 0) << "the syncer did not restart";
  const double restarted = now_unix();
  for (int i = 0; i < 300 && count_events(events, "applied", restarted) < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  children.kill(learner, SIGKILL, "the learner");
  children.kill(syncer2, SIGKILL, "the restarted syncer");
  ASSERT_GE(count_events(events, "applied", restarted), 4) << "the learner did not re-attach to the restarted syncer";
  // Durability: the restarted syncer's versions are never below what the learner held (persist-before-broadcast),
  // and every version the learner applies afterwards is higher than the one it held for that fragment.
  bool restored = false;
  for (const auto& e : read_events(run / "events" / "syncer.jsonl")) {
    EXPECT_NE(e["event"], "persisted_fragment_skipped") << e.dump();
    EXPECT_NE(e["event"], "persisted_state_skipped") << e.dump();
    if (e["event"] != "restored") continue;
    restored = true;
    for (const auto& [p, v] : held) EXPECT_GE(e["versions"][p].get<int64_t>(), v) << "fragment " << p;
  }
  EXPECT_TRUE(restored);
  for (const auto& e : read_events(events)) {
    if (e["event"] == "applied" && e["t"].get<double>() > restarted) {
      EXPECT_GT(e["version"].get<int64_t>(), held[e["fragment"].get<int>()]) << "fragment " << e["fragment"];
    }
  }
}

TEST_F(DecoupledTest, WrongSecretAndWrongLayoutAreRefusedWithTheReason) {
  const auto cfg = write_config("refuse", 3 * 2000 * 256, "secret = \"s3cret\"\n");
  const fs::path run = root_ / "refuse";
  fs::create_directories(run);
  const std::string syncer = kDloco + " syncer --config " + cfg.string() + " --listen 127.0.0.1:0 --address-file " +
                             (run / "addr").string() + " > " + (run / "syncer.log").string() + " 2>&1 & echo $!";
  int syncer_pid = 0;
  if (FILE* p = ::popen(syncer.c_str(), "r")) {
    if (std::fscanf(p, "%d", &syncer_pid) != 1) syncer_pid = 0;
    ::pclose(p);
  }
  testing_support::ChildGuard children;
  ASSERT_GT(children.hold(syncer_pid), 0) << "the syncer did not start";
  std::string address;
  for (int i = 0; i < 300 && address.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ifstream(run / "addr") >> address;
  }
  ASSERT_FALSE(address.empty());
  auto learner_output = [&](const std::string& overrides) {
    const std::string cmd = kDloco + " learner --config " + cfg.string() + " --syncer " + address +
                            " --id 0 --run-dir " + run.string() + " " + overrides + " 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[512];
      while (std::fgets(buf, sizeof buf, p)) out += buf;
      ::pclose(p);
    }
    return out;
  };
  const std::string wrong_secret = learner_output("--set run.secret=guess");
  const std::string wrong_layout = learner_output("--set diloco.fragments=2 --set diloco.inner_steps=4");
  // A learner with another inner learning rate joined silently before and pulled the run to a loss worse than the
  // unigram baseline (issue 16): the handshake names the field and both values.
  const std::string wrong_lr = learner_output("--set train.lr=0.3");
  children.kill(syncer_pid, SIGKILL, "the syncer");
  EXPECT_NE(wrong_lr.find("train.lr = 0.3 (expected "), std::string::npos) << wrong_lr;
  EXPECT_NE(wrong_secret.find("not authenticated"), std::string::npos) << wrong_secret;
  EXPECT_NE(wrong_layout.find("fragment layout hash differs"), std::string::npos) << wrong_layout;
}

}  // namespace
