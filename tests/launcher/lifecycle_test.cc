// A run's life cycle as a user meets it (issue 15, "Life cycle"), with the real `dloco train` launcher, syncer,
// evaluator and learners of a tiny decoupled run:
//   - a learner that fails the same way on every start (here run.device = "banana") stops the run with its error on
//     the console and exit status 1, instead of being restarted for ever;
//   - a launcher killed with SIGKILL leaves no process of its run behind (the children die with it);
//   - SIGHUP (the terminal closed) and SIGPIPE (`dloco train … | head -1`) stop the run cleanly: report written,
//     exit 128 + the signal, no process left;
//   - a second Ctrl-C hurries: the children are killed at once and the final evaluation is skipped;
//   - roles started by hand (the multi-machine path) say what they do: a learner with no syncer says so at once, the
//     syncer prints its rows, an end summary and writes the report, learners and the evaluator print theirs;
//   - a run stopped at ~50% and resumed trains the same tokens as one never stopped, each batch once, no checkpoint
//     overwritten, its report covering the whole run; resuming it once finished changes nothing.
// Signals are sent after a learner's 5th step (a step count, not a time), and every wait is a poll with a generous
// deadline, so the tests hold on faster and slower machines.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/stream_log.h"
#include "support/process_checks.h"
#include "support/tiny_corpus.h"

namespace {

namespace fs = std::filesystem;
namespace testing_support = dloco::testing_support;
using nlohmann::json;
using testing_support::read_events;
using testing_support::slurp;

const std::string kDloco = std::string(DLOCO_BINARY_DIR) + "/bin/dloco";
const std::string kDataTool = std::string(DLOCO_BINARY_DIR) + "/bin/dloco-data";

// Pids of the processes whose command line contains `needle` (every role of a run names its run folder).
std::vector<pid_t> processes_naming(const std::string& needle) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = slurp(entry.path() / "cmdline");
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid != ::getpid() && cmdline.find(needle) != std::string::npos) out.push_back(pid);
  }
  return out;
}

// Polls until no process names `needle`; returns the ones left after `deadline_s`.
std::vector<pid_t> wait_until_none_naming(const std::string& needle, double deadline_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  std::vector<pid_t> left = processes_naming(needle);
  while (!left.empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    left = processes_naming(needle);
  }
  return left;
}

int steps_of(const fs::path& events) {
  int steps = 0;
  for (const auto& e : read_events(events)) steps += e["event"] == "step";
  return steps;
}

class LifecycleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing_support::make_tiny_corpus("dloco_lifecycle", kDataTool);
    ASSERT_FALSE(root_.empty()) << "dloco-data prepare failed on the tiny corpus";
  }
  static void TearDownTestSuite() { testing_support::remove_unless_kept(root_); }

  // M = 2 learners with far more budget (2 × 100,000 steps, minutes even on a fast machine) than a test lets them
  // train: every test signals the launcher long before the end, and a run that outlived its launcher would still be
  // training when the test looks.
  static fs::path write_config(const std::string& name, const std::string& run_extra = "") {
    return testing_support::write_decoupled_config(root_, name, 2 * 100000 * 8 * 32, run_extra, 8, 32, 2, 10);
  }

  // `dloco train --config CFG` with its console in root/<name>.log; returns the launcher's pid.
  static pid_t start_launcher(const fs::path& cfg, const std::string& name) {
    return start({"train", "--config", cfg.string()}, root_ / (name + ".log"));
  }

  // `dloco ARGS…` with its console in `log`; returns its pid.
  static pid_t start(const std::vector<std::string>& dloco_args, const fs::path& log_file) {
    return testing_support::spawn_to_log(kDloco, dloco_args, log_file);
  }

  // Waits (up to 300 s) until learner 0 of run `name` has trained `steps` steps; false if it never did.
  static bool wait_for_steps(const std::string& name, int steps) {
    for (int i = 0; i < 3000; ++i) {
      if (steps_of(root_ / name / "events" / "learner_0.jsonl") >= steps) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Waits for the launcher to exit (up to 300 s, then SIGKILL); returns its waitpid status.
  static int wait_launcher(pid_t pid) {
    int status = 0;
    for (int i = 0; i < 3000; ++i) {
      if (::waitpid(pid, &status, WNOHANG) == pid) return status;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "the launcher did not exit within 300 s";
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return status;
  }

  // What every child of run `name` has on its command line: the run folder's resolved config.
  static std::string children_of(const std::string& name) { return (root_ / name / "config.toml").string(); }

  static fs::path root_;
};
fs::path LifecycleTest::root_;

TEST_F(LifecycleTest, ALearnerThatFailsOnEveryStartStopsTheRunWithItsError) {
  // Learners that die at their first batch: a copy of the corpus whose train shards hold token ids past the
  // vocabulary (their headers are intact, so the launcher's own checks pass; the syncer and the evaluator read only
  // the validation split). A bad run.device used to be this test's trigger; the launcher now refuses it up front.
  const fs::path bad = root_ / "data_corrupt";
  fs::remove_all(bad);
  fs::copy(root_ / "data", bad, fs::copy_options::recursive);
  int corrupted = 0;
  for (const auto& entry : fs::directory_iterator(bad)) {
    if (entry.path().filename().string().rfind("train_", 0) != 0) continue;
    const auto size = fs::file_size(entry.path());
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(64);  // past the header
    const std::string ones(static_cast<size_t>(size - 64), '\xff');
    f.write(ones.data(), static_cast<std::streamsize>(ones.size()));
    ++corrupted;
  }
  ASSERT_GT(corrupted, 0);
  const auto cfg = write_config("corrupt", "restart_delay_s = 0.2\n");
  const fs::path log = root_ / "corrupt.log";
  // `timeout`: before crash loops were told from crashes, this run restarted its learners for ever.
  const int rc = std::system(("timeout 600 " + kDloco + " train --config " + cfg.string() + " --set data.dir='\"" +
                              bad.string() + "\"' > " + log.string() + " 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(rc));
  EXPECT_EQ(WEXITSTATUS(rc), 1) << slurp(log);
  const std::string console = slurp(log);
  EXPECT_NE(console.find("failed 3 times in a row before its first training step"), std::string::npos) << console;
  EXPECT_NE(console.find("a shard is corrupt"), std::string::npos) << "the learner's own error is not on the console:\n"
                                                                   << console;
  const json report = json::parse(std::ifstream(root_ / "corrupt" / "report.json"));
  EXPECT_EQ(report["status"], "failed");
  EXPECT_NE(report.value("failure", "").find("a shard is corrupt"), std::string::npos) << report.dump(1);
  EXPECT_TRUE(report["final_val_loss"].is_null()) << "a failed run evaluated an untrained model";
  EXPECT_TRUE(wait_until_none_naming(children_of("corrupt"), 60).empty());
}

// A run.device this build cannot use is refused before anything starts (it used to start learners that died before
// their first step, three times each).
TEST_F(LifecycleTest, ADeviceThisBuildCannotUseIsRefusedBeforeAnyProcessStarts) {
  // "cuda" only where this build has no CUDA device (`dloco --version` says which).
  const fs::path version = root_ / "version.txt";
  ASSERT_EQ(std::system((kDloco + " --version > " + version.string()).c_str()), 0);
  std::vector<std::string> devices{"banana"};
  if (slurp(version).find("no CUDA device") != std::string::npos) devices.push_back("cuda");
  for (const std::string& device : devices) {
    const std::string name = std::string("device_") + device;
    const auto cfg = write_config(name, std::string("device = \"") + device + "\"\n");
    const fs::path log = root_ / (name + ".log");
    const int rc = std::system(("timeout 120 " + kDloco + " train --config " + cfg.string() + " > " + log.string() +
                                " 2>&1").c_str());
    ASSERT_TRUE(WIFEXITED(rc));
    EXPECT_EQ(WEXITSTATUS(rc), 2) << slurp(log);
    EXPECT_NE(slurp(log).find(std::string("run.device = \"") + device + "\""), std::string::npos) << slurp(log);
    EXPECT_FALSE(fs::exists(root_ / name / "logs" / "learner_0.log")) << "a learner was started";
  }
}

TEST_F(LifecycleTest, ALauncherKilledWithSigkillLeavesNoProcessBehind) {
  const auto cfg = write_config("sigkill");
  const pid_t launcher = start_launcher(cfg, "sigkill");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_steps("sigkill", 5)) << slurp(root_ / "sigkill.log");
  ASSERT_GE(processes_naming(children_of("sigkill")).size(), 4u) << "syncer, 2 learners and the evaluator";
  testing_support::signal_child(launcher, SIGKILL, "the launcher");
  int status = 0;
  ::waitpid(launcher, &status, 0);
  const auto left = wait_until_none_naming(children_of("sigkill"), 60);
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the run outlived their launcher, e.g. pid " << left[0];
  for (pid_t pid : left) ::kill(pid, SIGKILL);
}

TEST_F(LifecycleTest, SighupStopsTheRunCleanlyWithItsReport) {
  const auto cfg = write_config("sighup");
  const pid_t launcher = start_launcher(cfg, "sighup");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_steps("sighup", 5)) << slurp(root_ / "sighup.log");
  testing_support::signal_child(launcher, SIGHUP, "the launcher");
  const int status = wait_launcher(launcher);
  ASSERT_TRUE(WIFEXITED(status)) << "the launcher died of signal " << WTERMSIG(status) << " instead of stopping";
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGHUP);
  const json report = json::parse(std::ifstream(root_ / "sighup" / "report.json"));
  EXPECT_EQ(report["status"], "stopped");
  EXPECT_EQ(report["signal"], SIGHUP);
  EXPECT_TRUE(report["final_val_loss"].is_number()) << "the stopped run's checkpoint was not evaluated";
  EXPECT_TRUE(wait_until_none_naming(children_of("sighup"), 60).empty());
}

// One writer per run folder (process/run_lock.h): while a run trains, `--resume` of it and a new run of its name are
// refused (exit 2, naming the live run's pid) before they start anything, and the live run goes on to its own stop.
TEST_F(LifecycleTest, ALiveRunsFolderIsRefusedToASecondLauncher) {
  const auto cfg = write_config("live");
  const pid_t launcher = start_launcher(cfg, "live");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_steps("live", 5)) << slurp(root_ / "live.log");
  const std::string url_before = slurp(root_ / "live" / "monitor.url");
  for (const auto& [args, log] : {std::pair{"--resume " + (root_ / "live").string(), root_ / "live-resume.log"},
                                  std::pair{"--config " + cfg.string(), root_ / "live-again.log"}}) {
    const int rc = std::system(("timeout 120 " + kDloco + " train " + args + " > " + log.string() + " 2>&1").c_str());
    ASSERT_TRUE(WIFEXITED(rc)) << slurp(log);
    EXPECT_EQ(WEXITSTATUS(rc), 2) << slurp(log);
    EXPECT_NE(slurp(log).find("is in use by a live run (pid " + std::to_string(launcher)), std::string::npos)
        << slurp(log);
  }
  EXPECT_EQ(slurp(root_ / "live" / "monitor.url"), url_before) << "a refused launcher touched the live run's folder";
  const int before = steps_of(root_ / "live" / "events" / "learner_0.jsonl");
  ASSERT_TRUE(wait_for_steps("live", before + 3)) << "the live run stopped training";
  testing_support::signal_child(launcher, SIGINT, "the launcher");
  const int status = wait_launcher(launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  EXPECT_EQ(json::parse(std::ifstream(root_ / "live" / "report.json"))["status"], "stopped");
  EXPECT_TRUE(wait_until_none_naming(children_of("live"), 60).empty());
}

TEST_F(LifecycleTest, AClosedOutputPipeStopsTheRunCleanly) {
  const auto cfg = write_config("sigpipe");
  // head exits after the first line; the launcher's next log line (its log is stderr) meets a closed pipe (SIGPIPE).
  const int rc = std::system(("timeout 600 " + kDloco + " train --config " + cfg.string() +
                              " 2>&1 | head -1 > " + (root_ / "sigpipe.log").string()).c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "head failed or the launcher hung (timeout): " << rc;
  const fs::path report_file = root_ / "sigpipe" / "report.json";
  ASSERT_TRUE(fs::exists(report_file)) << "the launcher died of SIGPIPE without a report";
  const json report = json::parse(std::ifstream(report_file));
  EXPECT_EQ(report["status"], "stopped");
  EXPECT_EQ(report["signal"], SIGPIPE);
  EXPECT_TRUE(wait_until_none_naming(children_of("sigpipe"), 60).empty());
}

TEST_F(LifecycleTest, ASecondCtrlCStopsAtOnceWithoutTheFinalEvaluation) {
  const auto cfg = write_config("twice");
  const pid_t launcher = start_launcher(cfg, "twice");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_steps("twice", 5)) << slurp(root_ / "twice.log");
  testing_support::signal_child(launcher, SIGINT, "the launcher");
  // The first stop waits 1 s for the children to exit on their own before it signals them: the second lands in it.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  testing_support::signal_child(launcher, SIGINT, "the launcher");
  const int status = wait_launcher(launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  const json report = json::parse(std::ifstream(root_ / "twice" / "report.json"));
  EXPECT_EQ(report["status"], "stopped");
  EXPECT_TRUE(report["final_val_loss"].is_null());
  EXPECT_EQ(report.value("final_eval_skipped", ""), "a second signal asked to stop at once");
  EXPECT_TRUE(wait_until_none_naming(children_of("twice"), 60).empty());
}

TEST_F(LifecycleTest, RolesStartedByHandSayWhatTheyDo) {
  // M = 2, 2 × 300 steps, a console row every 10 ms (rows are timed: frequent ones appear even on a fast machine).
  const auto cfg = testing_support::write_decoupled_config(root_, "byhand", 2 * 300 * 8 * 32, "", 8, 32, 2, 20);
  const fs::path run = root_ / "byhand";
  fs::create_directories(run);
  const std::string address = "127.0.0.1:" + std::to_string(testing_support::free_loopback_port());
  testing_support::ChildGuard children;
  // A learner started before its syncer says so at once (not after its 2-minute deadline).
  const std::vector<std::string> rows = {"--set", "run.report_interval_s=0.01"};
  auto role = [&](std::vector<std::string> args) {
    args.insert(args.end(), rows.begin(), rows.end());
    return args;
  };
  const pid_t l0 = children.hold(start(role({"learner", "--config", cfg.string(), "--syncer", address, "--id", "0",
                                             "--run-dir", run.string()}), run / "learner_0.console"));
  bool said = false;
  for (int i = 0; i < 600 && !said; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    said = slurp(run / "learner_0.console").find("no answer from the syncer at " + address) != std::string::npos;
  }
  ASSERT_TRUE(said) << slurp(run / "learner_0.console");
  const pid_t syncer = children.hold(start(role({"syncer", "--config", cfg.string(), "--run-dir", run.string(),
                                                 "--listen", address}), run / "syncer.console"));
  const pid_t ev = children.hold(start(role({"evaluator", "--config", cfg.string(), "--syncer", address,
                                             "--run-dir", run.string()}), run / "evaluator.console"));
  // Learner 1 starts once the evaluator has evaluated (learner 0 alone moves the global step past the first
  // evaluation; fixed shares: the run cannot end before learner 1 trains its stream). Started at once, the two
  // learners' 300 tiny steps can be over before a loaded machine has the evaluator up, and it has nothing to say.
  bool evaluated = false;
  for (int i = 0; i < 1200 && !evaluated; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    evaluated = slurp(run / "evaluator.console").find("[evaluator] global step") != std::string::npos;
  }
  EXPECT_TRUE(evaluated) << slurp(run / "evaluator.console");
  const pid_t l1 = children.hold(start(role({"learner", "--config", cfg.string(), "--syncer", address, "--id", "1",
                                             "--run-dir", run.string()}), run / "learner_1.console"));
  for (pid_t pid : {syncer, l0, l1, ev}) {
    EXPECT_EQ(wait_launcher(pid), 0) << "a role exited with an error";
  }
  const std::string s = slurp(run / "syncer.console");
  EXPECT_NE(s.find("| merges"), std::string::npos) << "no periodic row:\n" << s;
  EXPECT_NE(s.find("[syncer] finished at global step"), std::string::npos) << s;
  EXPECT_NE(s.find("final validation loss"), std::string::npos) << s;
  const json report = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(report["status"], "finished");
  EXPECT_EQ(report["written_by"], "syncer");
  EXPECT_TRUE(report["final_val_loss"].is_number());
  for (const char* learner : {"learner_0.console", "learner_1.console"}) {
    const std::string l = slurp(run / learner);
    EXPECT_NE(l.find("merges applied"), std::string::npos) << learner << ":\n" << l;
  }
}

TEST_F(LifecycleTest, AStoppedRunResumesExactlyAndAFinishedOneIsLeftAlone) {
  // M = 2 learners, 2 × 1000 steps (240 ended before the stop reached them on a 2-core machine), AdamW state saved
  // every 50 steps (and on SIGTERM). Quorum K = M = 2: every merge has both learners' work, so the final loss has a
  // small spread between runs, and the comparison with the uninterrupted run below means something. With K = 1 the
  // spread is the asynchronous mode's, and on a loaded CI machine an uninterrupted run ended at 0.55 where others
  // end near 0.25.
  const int64_t budget = 2 * 1000 * 8 * 32;
  auto config = [&](const std::string& name) {
    const fs::path path = testing_support::write_decoupled_config(root_, name, budget, "", 8, 32, 2, 0,
                                                                  "learner_state_interval = 50\n");
    std::string text = slurp(path);
    const auto at = text.find("quorum = 1\n");
    EXPECT_NE(at, std::string::npos);
    if (at != std::string::npos) text.replace(at, 11, "quorum = 2\ngrace_window = false\n");
    std::ofstream(path) << text;
    return path;
  };
  // The reference: never stopped.
  const auto reference_cfg = config("whole");
  ASSERT_EQ(std::system((kDloco + " train --config " + reference_cfg.string() + " > " +
                         (root_ / "whole.log").string() + " 2>&1").c_str()), 0) << slurp(root_ / "whole.log");
  const json whole = json::parse(std::ifstream(root_ / "whole" / "report.json"));

  // Stopped by Ctrl-C once learner 0 trained 500 of its 1000 steps.
  const auto cfg = config("resumed");
  const fs::path run = root_ / "resumed";
  const pid_t launcher = start_launcher(cfg, "resumed");
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_steps("resumed", 500)) << slurp(root_ / "resumed.log");
  testing_support::signal_child(launcher, SIGINT, "the launcher");
  const int status = wait_launcher(launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  const json stopped = json::parse(std::ifstream(run / "report.json"));
  ASSERT_EQ(stopped["status"], "stopped");
  // One source of truth: the report, the syncer's state and the checkpoint the report names agree.
  const json state = json::parse(std::ifstream(run / "syncer" / "state.json"));
  const fs::path named = stopped["checkpoint"].get<std::string>();
  const json manifest = json::parse(std::ifstream(named / "manifest.json"));
  EXPECT_EQ(stopped["global_step"], state["global_step"]);
  EXPECT_EQ(stopped["global_step"], manifest["global_step"]);
  EXPECT_EQ(stopped["tokens_trained"], state["tokens_trained"]);
  EXPECT_EQ(stopped["tokens_trained"], manifest["tokens_trained"]);
  EXPECT_EQ(stopped["merges"], state["merges"]);
  EXPECT_LT(stopped["tokens_trained"].get<int64_t>(), budget);
  std::map<std::string, fs::file_time_type> before;  // no checkpoint may be overwritten by the resumed run
  for (const auto& c : fs::directory_iterator(run / "checkpoints")) {
    before[c.path().filename().string()] = fs::last_write_time(c.path() / "manifest.json");
  }

  const std::string resume = kDloco + " train --resume " + run.string();
  ASSERT_EQ(std::system((resume + " > " + (root_ / "resumed-2.log").string() + " 2>&1").c_str()), 0)
      << slurp(root_ / "resumed-2.log");
  const json resumed = json::parse(std::ifstream(run / "report.json"));
  EXPECT_EQ(resumed["status"], "finished");
  EXPECT_EQ(resumed["tokens_trained"], whole["tokens_trained"]) << "the resumed run trained other tokens";
  EXPECT_GT(resumed["merges"].get<int64_t>(), stopped["merges"].get<int64_t>()) << "merges of the first part lost";
  EXPECT_GT(resumed["wall_seconds"].get<double>(), stopped["wall_seconds"].get<double>());
  for (const auto& [name, time] : before) {
    EXPECT_EQ(fs::last_write_time(run / "checkpoints" / name / "manifest.json"), time) << name << " was overwritten";
  }
  // Each batch of each stream trained once, none skipped, across the stop.
  for (int s : {0, 1}) {
    const auto check = dloco::check_stream_log(
        dloco::read_stream_log(run / "streams" / ("stream_" + std::to_string(s) + ".jsonl")), 8 * 32);
    EXPECT_TRUE(check.ok()) << "stream " << s << ": " << check.duplicates << " batches twice, " << check.gaps
                            << " gaps";
    EXPECT_EQ(check.batches, 1000) << "stream " << s;
  }
  // The learners resumed with their AdamW moments, saved when the first part stopped.
  for (int id : {0, 1}) {
    int restored = 0, saved = 0;
    for (const auto& e : read_events(run / "events" / ("learner_" + std::to_string(id) + ".jsonl"))) {
      restored += e["event"] == "optimizer_restored";
      saved += e["event"] == "state_saved";
    }
    EXPECT_GE(saved, 1) << "learner " << id << " saved nothing when stopped";
    EXPECT_GE(restored, 1) << "learner " << id << " resumed with fresh AdamW moments";
  }
  std::printf("final validation loss: never stopped %.4f, stopped and resumed %.4f\n",
              whole["final_val_loss"].get<double>(), resumed["final_val_loss"].get<double>());
  EXPECT_NEAR(resumed["final_val_loss"].get<double>(), whole["final_val_loss"].get<double>(), 0.25);

  // Resuming the finished run says so and changes nothing.
  const std::string report_text = slurp(run / "report.json");
  const auto checkpoints = std::distance(fs::directory_iterator(run / "checkpoints"), fs::directory_iterator());
  ASSERT_EQ(std::system((resume + " > " + (root_ / "resumed-3.log").string() + " 2>&1").c_str()), 0);
  EXPECT_NE(slurp(root_ / "resumed-3.log").find("already finished"), std::string::npos)
      << slurp(root_ / "resumed-3.log");
  EXPECT_EQ(slurp(run / "report.json"), report_text);
  EXPECT_EQ(std::distance(fs::directory_iterator(run / "checkpoints"), fs::directory_iterator()), checkpoints);
}

}  // namespace
