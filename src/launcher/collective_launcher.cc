// The launcher of the baselines (diloco.mode = dp | diloco | streaming): M worker processes in one Gloo group,
// progress rows from rank 0's status.json, and the same report as the decoupled launcher. Synchronous training
// cannot continue without every worker: what happens when one dies is run.recovery (stop the run; restart all
// from the newest checkpoint once it is back; or elastic: re-form without it at once, and again with it).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include "collective/worker_status.h"
#include "core/atomic_file.h"
#include "core/console.h"
#include "core/events.h"
#include "launcher/children.h"
#include "launcher/fault_injector.h"
#include "collective/worker.h"
#include "launcher/launcher.h"
#include "train/checkpoint.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_collective_signal{0};
extern "C" void on_collective_signal(int sig) { g_collective_signal.store(sig); }

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

namespace {

bool exited_cleanly(const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

std::string describe_exit(const Child& c) {
  if (WIFSIGNALED(c.status)) return "killed by signal " + std::to_string(WTERMSIG(c.status));
  if (WIFEXITED(c.status)) return "exit status " + std::to_string(WEXITSTATUS(c.status));
  return "status " + std::to_string(c.status);
}

std::string join_slots(const std::vector<int>& slots) {
  std::string out;
  for (int s : slots) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

}  // namespace

nlohmann::json run_collective_launcher(const Config& config, bool resume, const FaultPlan* plan) {
  const auto started = Clock::now();
  const fs::path run_dir = config.run_dir();
  if (resume) {
    throw InputError(std::string("--resume is not supported for diloco.mode = \"") + to_string(config.diloco.mode) +
                     "\" yet (the baselines restart from scratch); it is for decoupled and local runs");
  }
  if (latest_checkpoint(run_dir) || fs::exists(run_dir / "status.json")) {
    throw InputError("run folder '" + run_dir.string() + "' already holds a run: pick another run.name");
  }
  if (plan != nullptr && config.diloco.mode != Mode::kDp) {
    throw InputError(std::string("a fault plan needs diloco.mode = \"dp\" among the baselines (got \"") + to_string(config.diloco.mode) + "\")");
  }
  const RunFolder folder = prepare_run_folder(config);
  const int M = folder.learners, cores = folder.cores, worker_threads = folder.child_threads;
  const RecoveryPolicy recovery = config.run.recovery;
  EventLog events(run_dir / "events" / "launcher.jsonl", Role::kLauncher, 0);
  std::error_code ec;
  fs::remove_all(run_dir / "gloo", ec);
  fs::create_directories(run_dir / "gloo");
  std::vector<FaultEvent> faults;
  if (plan != nullptr) {
    faults = plan->resolve(M);
    write_file_atomically(run_dir / "plan.json", plan->to_json(M).dump(2) + "\n");
  }
  FaultInjector injector(faults, run_dir, events);

  const std::string& cfg = folder.config_path;
  std::vector<Child> children;  // one per slot; a slot outside the current group has exited = true
  for (int s = 0; s < M; ++s) children.push_back({"worker " + std::to_string(s), s, -1, true, 0, Clock::now(), 0});
  std::vector<bool> down(M, false);                 // dead and not yet due back
  std::vector<Clock::time_point> back_at(M, Clock::time_point::max());
  std::vector<int> group;                            // slots of the running group, rank order
  int64_t generation = -1;
  const auto plan_started = Clock::now();  // a fault plan's clock: seconds since the first group was started
  auto elapsed_s = [&] { return std::chrono::duration<double>(Clock::now() - plan_started).count(); };
  nlohmann::json last;
  // Rank 0's status.json (collective/worker_status.h). One of another format version ends the run with its
  // message: the fields it holds may not mean what this launcher reads.
  std::string status_error;
  auto poll_status = [&] {
    try {
      if (auto status = read_worker_status(run_dir / "status.json"); !status.is_null()) last = status;
    } catch (const InputError& e) {
      if (status_error.empty()) status_error = e.what();
    }
    return status_error.empty();
  };
  auto form = [&](const std::string& reason) {
    group.clear();
    for (int s = 0; s < M; ++s) {
      if (!down[s]) group.push_back(s);
    }
    ++generation;
    const fs::path store = run_dir / "gloo" / ("store_" + std::to_string(generation));
    const auto checkpoint = generation > 0 ? latest_checkpoint(run_dir) : std::nullopt;
    for (size_t rank = 0; rank < group.size(); ++rank) {
      const int s = group[rank];
      std::vector<std::string> args{"worker", "--config", cfg, "--rank", std::to_string(rank), "--run-dir",
                                    run_dir.string(), "--store", store.string(), "--set",
                                    "run.threads=" + std::to_string(worker_threads)};
      if (recovery != RecoveryPolicy::kStop) {
        args.insert(args.end(), {"--slots", join_slots(group), "--generation", std::to_string(generation)});
        if (checkpoint) args.insert(args.end(), {"--resume-from", checkpoint->dir.string()});
      }
      Child& c = children[s];
      c.pid = spawn(args, run_dir / "logs" / ("worker_" + std::to_string(s) + ".log"), worker_threads);
      c.exited = false;
      c.status = 0;
      if (generation > 0) ++c.restarts;
    }
    events.emit("group_formed", {{"generation", generation}, {"slots", group}, {"world", group.size()},
                                 {"from_step", checkpoint ? checkpoint->step : 0}, {"reason", reason},
                                 {"at_s", elapsed_s()}});
    std::printf("[launcher] generation %lld: %zu workers (slots %s) from step %lld (%s)\n",
                static_cast<long long>(generation), group.size(), join_slots(group).c_str(),
                static_cast<long long>(checkpoint ? checkpoint->step : 0), reason.c_str());
    std::fflush(stdout);
  };
  auto wait_group = [&](std::chrono::seconds grace) {  // every group member exits (SIGKILL after `grace`)
    std::vector<Child> members;
    for (int s : group) members.push_back(children[s]);
    const auto deadline = Clock::now() + grace;
    while (Clock::now() < deadline && g_collective_signal.load() == 0 &&
           !std::all_of(members.begin(), members.end(), [](const Child& c) { return c.exited; })) {
      reap(members);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (auto& c : members) {
      if (!c.exited && c.pid > 0) {
        ::kill(c.pid, SIGCONT);
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &c.status, 0);
        c.exited = true;
        c.died_at = Clock::now();
      }
    }
    for (const auto& c : members) children[c.learner] = c;
    group.clear();
  };

  form("start");
  events.emit("started", {{"mode", config.diloco.mode}, {"workers", M}, {"worker_threads", worker_threads},
                          {"recovery", recovery}, {"faults_planned", faults.size()}});
  std::printf("[launcher] run %s: %s with %d workers × %d BLAS threads (Gloo), recovery \"%s\"; logs in %s\n",
              config.run.name.c_str(), to_string(config.diloco.mode), M, worker_threads, to_string(recovery),
              (run_dir / "logs").c_str());
  std::fflush(stdout);

  std::signal(SIGINT, on_collective_signal);
  std::signal(SIGTERM, on_collective_signal);
  auto last_row = Clock::now() - std::chrono::hours(1);
  int64_t last_eval_printed = -1;
  std::string failure;
  int failures = 0;
  bool run_finished = false;
  constexpr int kMaxFailuresFromOneCheckpoint = 10;
  int same_checkpoint_failures = 0;
  int64_t last_failed_from = -1;
  auto hold_out = [&](int s) {  // slot s died: out of the group until its restart delay has passed
    down[s] = true;
    const double delay = injector.restart_delay(children[s], config.run.restart_delay_s);
    back_at[s] = delay < 0 ? Clock::time_point::max()
                           : children[s].died_at + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(std::min(delay, 1e7)));
  };
  // A plan kill that landed while the launcher was stopping the group was reaped as one of the launcher's own
  // stops: it still holds its slot out for the plan's delay.
  auto hold_out_planned_kills = [&](const std::vector<int>& members) {
    for (int s : members) {
      if (down[s] || !injector.planned_kill(children[s])) continue;
      events.emit("worker_failed", {{"slot", s}, {"exit", describe_exit(children[s])}, {"planned", true},
                                    {"generation", generation}, {"at_s", elapsed_s()}});
      ++failures;
      hold_out(s);
    }
  };
  while (g_collective_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    reap(children);
    if (!poll_status()) {
      failure = status_error;
      break;
    }
    run_finished = last.is_object() && last.value("finished", false);
    injector.tick(elapsed_s(), last.is_object() ? last.value("global_step", int64_t{0}) : 0, run_finished, children);
    // A member that died (not by a clean exit) takes the group down with it.
    // Casualties (kPeerFailedExit: their collective failed because of another) re-form at once; the others are
    // the failure, held out until their restart delay has passed.
    std::vector<int> dead;
    bool all_exited = !group.empty(), casualties = false;
    for (int s : group) {
      all_exited &= children[s].exited;
      if (!children[s].exited || exited_cleanly(children[s])) continue;
      const bool casualty = WIFEXITED(children[s].status) && WEXITSTATUS(children[s].status) == kPeerFailedExit;
      casualties |= casualty;
      if (!casualty) dead.push_back(s);
    }
    if (!group.empty() && all_exited && dead.empty() && !casualties) break;  // finished (or every rank voted to stop)
    if ((!dead.empty() || casualties) && !run_finished) {
      for (int s : dead) {
        events.emit("worker_failed", {{"slot", s}, {"exit", describe_exit(children[s])},
                                      {"planned", injector.planned_kill(children[s])}, {"generation", generation},
                                      {"at_s", elapsed_s()}});
      }
      const int64_t at_step = last.is_object() ? last.value("global_step", int64_t{0}) : 0;
      const std::vector<int> members_before = group;
      for (int s : group) {
        if (!children[s].exited) ::kill(children[s].pid, SIGKILL);  // Gloo groups do not recover: stop them all
      }
      wait_group(std::chrono::seconds(10));
      events.emit("group_stopped", {{"generation", generation}, {"reason", "failure"}, {"at_step", at_step},
                                    {"at_s", elapsed_s()}});
      failures += static_cast<int>(dead.size());
      if (recovery == RecoveryPolicy::kStop) {
        const int s = dead.empty() ? 0 : dead[0];
        failure = dead.empty() ? std::string("a collective failed (a worker hung or passed run.collective_timeout_s)")
                               : children[s].role + " " + describe_exit(children[s]) + " (see logs/worker_" +
                                     std::to_string(s) + ".log)";
        break;
      }
      for (int s : dead) {
        hold_out(s);
        std::printf("[launcher] worker %d died (%s) at step %lld: %s\n", s, describe_exit(children[s]).c_str(),
                    static_cast<long long>(at_step),
                    recovery == RecoveryPolicy::kElastic ? "the others re-form without it from the newest checkpoint"
                                          : "every worker waits for it, then all restart from the newest checkpoint");
        std::fflush(stdout);
      }
      hold_out_planned_kills(members_before);
    } else if (!dead.empty() || casualties) {
      break;  // a worker died after the run finished: nothing to recover
    }
    if (run_finished) continue;
    // Slots due back.
    std::vector<int> returning;
    for (int s = 0; s < M; ++s) {
      if (down[s] && Clock::now() >= back_at[s]) returning.push_back(s);
    }
    const bool any_down = std::count(down.begin(), down.end(), true) > static_cast<long>(returning.size());
    if (group.empty()) {  // no group runs: form one when the policy allows
      // Slots that will never be back (restart delay < 0): restart cannot go on without them, elastic without
      // any slot.
      int never = 0, up = 0;
      for (int s = 0; s < M; ++s) {
        never += down[s] && back_at[s] == Clock::time_point::max() ? 1 : 0;
        up += down[s] ? 0 : 1;
      }
      if ((recovery == RecoveryPolicy::kRestart && never > 0) || (recovery == RecoveryPolicy::kElastic && never == M)) {
        failure = std::to_string(never) + " worker(s) died and will not be restarted (restart delay < 0): " +
                  (recovery == RecoveryPolicy::kRestart ? "run.recovery = restart needs every worker" : "no worker is left");
        break;
      }
      const bool ready = recovery == RecoveryPolicy::kElastic ? (up > 0 || !returning.empty()) : !any_down;
      if (!ready) continue;
      for (int s : returning) {
        down[s] = false;
        injector.restarted(children[s]);
      }
      if (std::count(down.begin(), down.end(), false) == 0) continue;
      // A group that keeps failing from the same checkpoint (a worker that crashes the same way every time, a
      // collective that always times out) is not re-formed forever.
      const auto newest = latest_checkpoint(run_dir);
      const int64_t from = newest ? newest->step : 0;
      same_checkpoint_failures = from == last_failed_from ? same_checkpoint_failures + 1 : 1;
      last_failed_from = from;
      if (same_checkpoint_failures > kMaxFailuresFromOneCheckpoint) {
        failure = "the group failed " + std::to_string(kMaxFailuresFromOneCheckpoint) +
                  " times in a row from the checkpoint at step " + std::to_string(from) + " (see logs/worker_*.log)";
        break;
      }
      form(returning.empty() ? "failure" : "rejoin");
    } else if (recovery == RecoveryPolicy::kElastic && !returning.empty() &&
               std::none_of(group.begin(), group.end(), [&](int s) { return injector.paused(children[s]); })) {
      // Grow (not while a member is paused: it could not vote): the group stops after a step all ranks voted
      // for, rank 0 checkpoints it, and it re-forms with the returning slots.
      const int64_t at_step = last.is_object() ? last.value("global_step", int64_t{0}) : 0;
      const std::vector<int> members_before = group;
      for (int s : group) {
        if (!children[s].exited) ::kill(children[s].pid, SIGTERM);
      }
      wait_group(std::chrono::seconds(static_cast<int64_t>(config.run.collective_timeout_s) + 30));
      events.emit("group_stopped", {{"generation", generation}, {"reason", "grow"}, {"at_step", at_step},
                                    {"at_s", elapsed_s()}});
      hold_out_planned_kills(members_before);  // a plan kill that landed while the group was stopping
      if (!poll_status()) {
        failure = status_error;
        break;
      }
      if (last.is_object() && last.value("finished", false)) break;
      for (int s : returning) {
        down[s] = false;
        injector.restarted(children[s]);
      }
      form("rejoin");
    }
    if (last.is_null()) continue;
    const int64_t eval_step = last.value("last_eval_step", int64_t{-1});
    if (Clock::now() - last_row > std::chrono::duration<double>(config.run.report_interval_s) ||
        eval_step > last_eval_printed) {
      last_row = Clock::now();
      last_eval_printed = eval_step;
      const double frac = last.value("tokens_trained", 0.0) / std::max(1.0, last.value("tokens_budget", 1.0));
      char val[32] = "  -  ";
      if (last["val_loss"].is_number()) std::snprintf(val, sizeof(val), "%.3f", last["val_loss"].get<double>());
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      std::printf("%s %3.0f%% t %5lld | val %s | syncs %5lld | waiting %5.1fs | workers %zu/%d | tok/s per worker %.0f | %4.0fs\n",
                  progress_bar(frac).c_str(), 100 * frac, static_cast<long long>(last.value("global_step", 0)), val,
                  static_cast<long long>(last.value("syncs", 0)), last.value("wait_s", 0.0), group.size(), M,
                  last.value("tokens_per_s", 0.0), elapsed);
      std::fflush(stdout);
      events.emit("progress", {{"global_step", last.value("global_step", 0)}, {"tokens", last.value("tokens_trained", 0)},
                               {"syncs", last.value("syncs", 0)}, {"val_loss", last["val_loss"]},
                               {"world", group.size()}});
    }
  }
  injector.release(children, elapsed_s());
  if (!failure.empty() && !status_error.empty()) {
    std::printf("[launcher] %s: stopping the workers\n", failure.c_str());
  } else if (!failure.empty()) {
    std::printf("[launcher] %s: stopped the other workers (synchronous training needs all %d; run.recovery = "
                "\"restart\" or \"elastic\" re-forms the group)\n", failure.c_str(), M);
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
  poll_status();
  if (!status_error.empty()) throw InputError(status_error);
  const bool finished = last.is_object() && last.value("finished", false) && failure.empty();
  if (!latest_checkpoint(run_dir)) {
    throw InputError(std::string("the ") + to_string(config.diloco.mode) + " run stopped before rank 0 wrote a checkpoint" +
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
  report["recovery"] = recovery;
  report["generations"] = generation + 1;
  report["worker_failures"] = failures;
  report["faults_injected"] = injector.injected();
  int restarts = 0;
  for (const auto& c : children) restarts += c.restarts;
  report["worker_restarts"] = restarts;
  write_file_atomically(run_dir / "report.json", report.dump(2) + "\n");
  events.emit("finished", {{"status", report["status"]}, {"val_loss", report["final_val_loss"]}});
  return report;
}

}  // namespace dloco
