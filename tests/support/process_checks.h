// Shared by the process tests: the measures they assert, written once so every test means the same thing by them.
//   - time outside compute: whether a learner's training thread waited (not raw gaps between steps, which CPU
//     contention stretches as well), with the one bound every test uses;
//   - signals to child processes that refuse a pid ≤ 0 (kill(0, …) would hit the test's own process group);
//   - the unigram cross-entropy of a prepared corpus: the score a model that learned anything must beat;
//   - a run of `dloco train` under a fault plan, to its end;
//   - a file's text, a program started with its console in a file, a free loopback port.
// Deliberately not here: config files and event logs (tiny_corpus.h).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/shards.h"

extern "C" char** environ;

namespace dloco::testing_support {

/// The whole text of `file`; "" if it cannot be read (a log not written yet).
inline std::string slurp(const std::filesystem::path& file) {
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Starts `program` with `args` (argv[1…]) and this process's environment, stdout and stderr both into `log`
/// (truncated). Returns its pid, or −1 (and a test failure) if it could not be started. The caller waits for it.
/// `own_group`: the child leads a new process group (kill(-pid, sig) then reaches it and everything it starts, as a
/// terminal's Ctrl-C reaches a foreground job).
inline pid_t spawn_to_log(const std::string& program, const std::vector<std::string>& args,
                          const std::filesystem::path& log, bool own_group = false) {
  std::vector<std::string> all = {program};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = log.string();
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  if (own_group) {
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
  }
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  EXPECT_EQ(rc, 0) << "could not start " << program;
  return rc == 0 ? pid : -1;
}

/// A TCP port that was free on loopback a moment ago (the process started next binds it; another process could
/// take it in between, which a test on one machine does not see).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// The most time a training thread may spend outside compute between two of its steps, seconds. What it does
/// there (log the batch's cursor, queue metadata, apply merged fragments, write an event line) takes under 10 ms
/// on the test model on an idle machine; on 2 cores shared with the run's other processes and other builds a
/// descheduled thread or a write throttled by the page cache has been seen at up to 0.16 s. Anything it could
/// wait on lasts longer: the link's RPC deadlines and a learner's lease are 5 s, its reconnect backoff starts at
/// 0.2 s, and the faults the tests inject (a paused peer, a cut or slow link) last seconds. A fixed bound, not a
/// fraction of the step: it must not tighten on a faster machine.
inline constexpr double kMaxOutsideCompute_s = 0.5;

/// A learner's training thread from its "step" events. For two consecutive steps of one incarnation (a
/// "bootstrapped" event starts a new one) the gap between their times `t`, minus the step's own compute `step_s`
/// (batch, forward, backward, inner update, measured by the learner), minus the sleep a slowdown adds after the
/// compute (the event's sleep_s; (factor − 1)·step_s for events without one, run.slowdown), is the time the thread
/// spent outside compute. Waiting on anyone
/// makes it grow; contention for the CPU slows the compute instead.
struct ThreadTiming {
  std::vector<double> outside;  // per step, seconds (the first `skip` steps of each incarnation left out)
  double most_outside = 0;      // the largest of them
  double most_outside_t = 0;    // the time of the step that ended it
  double median_gap = 0;        // raw gaps between steps, for the printout
  double largest_gap = 0;
  size_t steps = 0;             // "step" events of the learner
};

inline ThreadTiming time_outside_compute(const std::vector<nlohmann::json>& events, double slowdown = 1.0,
                                         size_t skip = 6,
                                         double from_t = -std::numeric_limits<double>::infinity(),
                                         double to_t = std::numeric_limits<double>::infinity()) {
  ThreadTiming out;
  std::vector<double> gaps;
  double last_t = -1;
  size_t in_incarnation = 0;
  for (const auto& e : events) {
    if (e["event"] == "bootstrapped") {
      last_t = -1;
      in_incarnation = 0;
    }
    if (e["event"] != "step") continue;
    ++out.steps;
    const double t = e["t"];
    const double step_s = e["step_s"].get<double>();
    // The sleep as slept: run.slowdown stretches the steady compute, not this step's (core/slowdown.h).
    const double compute = step_s + (e.contains("sleep_s") ? e["sleep_s"].get<double>() : (slowdown - 1) * step_s);
    if (last_t >= 0 && ++in_incarnation > skip && t >= from_t && t <= to_t) {
      const double outside = t - last_t - compute;
      out.outside.push_back(outside);
      gaps.push_back(t - last_t);
      if (outside > out.most_outside) {
        out.most_outside = outside;
        out.most_outside_t = t;
      }
    }
    last_t = t;
  }
  if (!gaps.empty()) {
    out.largest_gap = *std::max_element(gaps.begin(), gaps.end());
    std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
    out.median_gap = gaps[gaps.size() / 2];
  }
  return out;
}

/// Sends `sig` to `pid` if it names a process (pid > 0); records a test failure and sends nothing otherwise
/// (a process that failed to start leaves 0 or −1, and kill(0, …) or kill(−1, …) would signal the test's own
/// process group or every process it may signal). Returns kill's result, or −1.
inline int signal_child(pid_t pid, int sig, const std::string& who) {
  if (pid <= 0) {
    ADD_FAILURE() << "no process to signal for " << who << " (pid " << pid << "): it did not start";
    return -1;
  }
  return ::kill(pid, sig);
}

/// SIGKILLs the processes it holds when it goes out of scope, so a test that stops at a failed ASSERT leaves none
/// of its children running (a learner with a run of 10⁹ tokens would train on for ever). kill() signals one now
/// and forgets it; pids ≤ 0 are never held.
class ChildGuard {
 public:
  ChildGuard() = default;
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  ~ChildGuard() {
    for (pid_t pid : pids_) ::kill(pid, SIGKILL);
  }
  /// Holds `pid` (ignored if ≤ 0); returns it.
  pid_t hold(pid_t pid) {
    if (pid > 0) pids_.push_back(pid);
    return pid;
  }
  /// signal_child(pid, sig, who), and forgets pid.
  int kill(pid_t pid, int sig, const std::string& who) {
    pids_.erase(std::remove(pids_.begin(), pids_.end(), pid), pids_.end());
    return signal_child(pid, sig, who);
  }

 private:
  std::vector<pid_t> pids_;
};

/// Runs `<dloco> train --config CFG --plan root/<name>-plan.toml SETS` (output in root/<name>.log) to the end and
/// returns root/<name>/report.json, or null if the run wrote none; an exit status other than `expected_exit` (0: the
/// run finished; 1 failed, 3 incomplete) is a test failure.
inline nlohmann::json train_under_plan(const std::filesystem::path& root, const std::string& dloco,
                                       const std::filesystem::path& cfg, const std::string& plan_toml,
                                       const std::string& name, const std::string& sets = "", int expected_exit = 0) {
  const std::filesystem::path plan = root / (name + "-plan.toml");
  std::ofstream(plan) << plan_toml;
  const std::filesystem::path log = root / (name + ".log");
  const std::string cmd = dloco + " train --config " + cfg.string() + " --plan " + plan.string() + " " + sets +
                          " > " + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == expected_exit) << "status " << rc << ", see " << log;
  const std::filesystem::path report = root / name / "report.json";
  if (!std::filesystem::exists(report)) return nullptr;
  return nlohmann::json::parse(std::ifstream(report));
}

/// The unigram cross-entropy of a prepared corpus, nats per token: token frequencies counted on the train split
/// (add-one smoothed over the vocabulary), scored on the validation split, the split the launcher's final
/// evaluation uses. A model that beats it has learned more than token frequencies. Computed here from the shards,
/// independently of dloco-data's own figure (meta.json's unigram_val_nats_per_token).
inline double unigram_cross_entropy(const std::filesystem::path& data_dir) {
  const TokenSplit train(split_shards(data_dir, "train")), val(split_shards(data_dir, "val"));
  const uint32_t V = train.vocab_size();
  std::vector<double> count(V, 1.0);  // add-one
  for (int64_t i = 0; i < train.size(); ++i) count[static_cast<size_t>(train.token(i))] += 1.0;
  const double total = static_cast<double>(train.size()) + V;
  double nll = 0;
  for (int64_t i = 0; i < val.size(); ++i) nll -= std::log(count[static_cast<size_t>(val.token(i))] / total);
  return nll / static_cast<double>(val.size());
}

}  // namespace dloco::testing_support
