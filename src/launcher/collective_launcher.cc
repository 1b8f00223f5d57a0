// The launcher of the baselines (diloco.mode = dp | diloco | streaming): M worker processes in one Gloo group,
// progress rows from rank 0's status.json, and the same report as the decoupled launcher. Synchronous training
// cannot continue without every worker: when one dies the others' next collective fails at its deadline, and
// the launcher stops them all (the chaos issue adds elastic restarts on top).
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include "core/atomic_file.h"
#include "core/console.h"
#include "core/events.h"
#include "launcher/children.h"
#include "launcher/roles.h"
#include "train/checkpoint.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_collective_signal{0};
extern "C" void on_collective_signal(int sig) { g_collective_signal.store(sig); }

nlohmann::json read_status(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return nullptr;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return nullptr;  // written atomically, so only a missing file or a foreign one gets here
  }
}

// Sums a numeric field over events/worker_<rank>.jsonl "stopped" records (bytes, syncs, waits per rank).
nlohmann::json worker_summaries(const fs::path& run_dir, int M) {
  nlohmann::json out = nlohmann::json::array();
  for (int rank = 0; rank < M; ++rank) {
    std::ifstream in(run_dir / "events" / ("worker_" + std::to_string(rank) + ".jsonl"));
    nlohmann::json last_stop = {{"rank", rank}};
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("\"stopped\"") == std::string::npos) continue;
      try {
        auto j = nlohmann::json::parse(line);
        last_stop = {{"rank", rank}, {"steps", j.value("step", 0)}, {"syncs", j.value("syncs", 0)},
                     {"wait_s", j.value("wait_s", 0.0)}, {"bytes_sent", j.value("bytes_sent", int64_t{0})}};
      } catch (const nlohmann::json::exception&) {
      }
    }
    out.push_back(last_stop);
  }
  return out;
}

}  // namespace

nlohmann::json run_collective_launcher(const Config& config, bool resume) {
  const auto started = Clock::now();
  const fs::path run_dir = config.run_dir();
  if (resume) {
    throw InputError("--resume is not supported for diloco.mode = \"" + config.diloco.mode +
                     "\" yet (the baselines restart from scratch); it is for decoupled and local runs");
  }
  if (latest_checkpoint(run_dir) || fs::exists(run_dir / "status.json")) {
    throw InputError("run folder '" + run_dir.string() + "' already holds a run: pick another run.name");
  }
  const RunFolder folder = prepare_run_folder(config);
  const int M = folder.learners, cores = folder.cores, worker_threads = folder.child_threads;
  EventLog events(run_dir / "events" / "launcher.jsonl", Role::kLauncher, 0);
  const fs::path store = run_dir / "gloo.store";
  std::error_code ec;
  fs::remove(store, ec);

  const std::string& cfg = folder.config_path;
  std::vector<Child> children;
  for (int rank = 0; rank < M; ++rank) {
    children.push_back({"worker " + std::to_string(rank), rank,
                        spawn({"worker", "--config", cfg, "--rank", std::to_string(rank), "--run-dir", run_dir.string(),
                               "--store", store.string(), "--set", "run.threads=" + std::to_string(worker_threads)},
                              run_dir / "logs" / ("worker_" + std::to_string(rank) + ".log"), worker_threads)});
  }
  events.emit("started", {{"mode", config.diloco.mode}, {"workers", M}, {"worker_threads", worker_threads}});
  std::printf("[launcher] run %s: %s with %d workers × %d BLAS threads (Gloo); logs in %s\n", config.run.name.c_str(),
              config.diloco.mode.c_str(), M, worker_threads, (run_dir / "logs").c_str());
  std::fflush(stdout);

  std::signal(SIGINT, on_collective_signal);
  std::signal(SIGTERM, on_collective_signal);
  nlohmann::json last;
  auto last_row = Clock::now() - std::chrono::hours(1);
  int64_t last_eval_printed = -1;
  std::string failure;
  while (g_collective_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    reap(children);
    bool all_exited = true;
    for (const auto& c : children) {
      all_exited &= c.exited;
      if (c.exited && failure.empty() && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) {
        failure = c.role + " exited with status " + std::to_string(c.status) + " (see logs/worker_" +
                  std::to_string(c.learner) + ".log)";
      }
    }
    if (!failure.empty() || all_exited) break;
    auto status = read_status(run_dir / "status.json");
    if (status.is_null()) continue;
    last = status;
    const int64_t eval_step = last.value("last_eval_step", int64_t{-1});
    if (Clock::now() - last_row > std::chrono::duration<double>(config.run.report_interval_s) ||
        eval_step > last_eval_printed) {
      last_row = Clock::now();
      last_eval_printed = eval_step;
      const double frac = last.value("tokens_trained", 0.0) / std::max(1.0, last.value("tokens_budget", 1.0));
      char val[32] = "  -  ";
      if (last["val_loss"].is_number()) std::snprintf(val, sizeof(val), "%.3f", last["val_loss"].get<double>());
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      std::printf("%s %3.0f%% t %5lld | val %s | syncs %5lld | waiting %5.1fs | tok/s per worker %.0f | %4.0fs\n",
                  progress_bar(frac).c_str(), 100 * frac, static_cast<long long>(last.value("global_step", 0)), val,
                  static_cast<long long>(last.value("syncs", 0)), last.value("wait_s", 0.0),
                  last.value("tokens_per_s", 0.0), elapsed);
      std::fflush(stdout);
      events.emit("progress", {{"global_step", last.value("global_step", 0)}, {"tokens", last.value("tokens_trained", 0)},
                               {"syncs", last.value("syncs", 0)}, {"val_loss", last["val_loss"]}});
    }
  }
  if (!failure.empty()) {
    std::printf("[launcher] %s: stopping the other workers (synchronous training needs all %d)\n", failure.c_str(), M);
    events.emit("worker_failed", {{"reason", failure}});
  }
  if (g_collective_signal.load() != 0) {
    std::printf("[launcher] signal %d: stopping every worker; rank 0 writes a checkpoint\n", g_collective_signal.load());
  }
  std::fflush(stdout);
  const auto wait_until = Clock::now() + std::chrono::seconds(failure.empty() && g_collective_signal.load() == 0 ? 60 : 1);
  while (Clock::now() < wait_until) {
    reap(children);
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_children(children, std::chrono::seconds(30));
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (auto status = read_status(run_dir / "status.json"); !status.is_null()) last = status;
  const bool finished = last.is_object() && last.value("finished", false) && failure.empty();
  if (!latest_checkpoint(run_dir)) {
    throw InputError("the " + config.diloco.mode + " run stopped before rank 0 wrote a checkpoint" +
                     (failure.empty() ? std::string() : ": " + failure));
  }

  const nlohmann::json final_eval = evaluate_final_checkpoint(config, cores);
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  const auto workers = worker_summaries(run_dir, M);
  nlohmann::json bytes = nlohmann::json::object();
  for (const auto& w : workers) {
    const int64_t sent = w.value("bytes_sent", int64_t{0});
    bytes["worker_" + std::to_string(w["rank"].get<int>())] = {{"sent", sent}, {"received", sent}};  // ring: symmetric
  }
  const int64_t tokens = last.is_object() ? last.value("tokens_trained", int64_t{0}) : 0;
  nlohmann::json report = {
      {"run", config.run.name},
      {"mode", config.diloco.mode},
      {"status", finished ? "finished" : "stopped"},
      {"final_val_loss", final_eval["val_loss"]},
      {"final_val_perplexity", final_eval["val_perplexity"]},
      {"global_step", last.value("global_step", 0)},
      {"steps", last.value("global_step", 0)},
      {"syncs", last.value("syncs", 0)},
      {"wait_seconds_rank0", last.value("wait_s", 0.0)},
      {"eval_seconds", last.value("eval_s", 0.0)},
      {"tokens_trained", tokens},
      {"wall_seconds", wall},
      {"tokens_per_second", tokens / std::max(wall, 1e-9)},
      {"workers", workers},
      {"checkpoint", final_eval["checkpoint"]},
      {"sample", final_eval["sample"]},
      {"bytes", bytes},
      {"signal", g_collective_signal.load()},
  };
  if (!failure.empty()) report["failure"] = failure;
  write_file_atomically(run_dir / "report.json", report.dump(2) + "\n");
  events.emit("finished", {{"status", report["status"]}, {"val_loss", report["final_val_loss"]}});
  return report;
}

}  // namespace dloco
