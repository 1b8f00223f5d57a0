// The launcher: `dloco train` with diloco.mode = "decoupled". Starts the syncer, the evaluator and M learners
// as child processes of this binary (posix_spawn: no fork handlers run, so it is safe with gRPC objects in the
// process), gives each its share of the cores through its environment before exec, shows progress from the
// syncer's Status, restarts learners that die, carries out a fault plan if given (chaos runs: kill, pause or slow
// learners, kill and restart the syncer), and ends with the report.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <csignal>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include "core/atomic_file.h"
#include "core/console.h"
#include "core/events.h"
#include "chaos/fault_plan.h"
#include "launcher/children.h"
#include "launcher/fault_injector.h"
#include "launcher/launcher.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_launcher_signal{0};
extern "C" void on_launcher_signal(int sig) { g_launcher_signal.store(sig); }

std::string read_address(const fs::path& file, Child& syncer, std::vector<Child>& children) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    std::ifstream in(file);
    std::string address;
    if (in >> address && !address.empty()) return address;
    reap(children);
    if (syncer.exited) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw InputError("the syncer did not start (see " + (file.parent_path() / "logs" / "syncer.log").string() + ")");
}

}  // namespace

nlohmann::json run_launcher(const Config& config, bool resume, wire::Transport& transport, const FaultPlan* plan) {
  const auto started = Clock::now();
  const fs::path run_dir = config.run_dir();
  if (!resume && (fs::exists(run_dir / "syncer") || latest_checkpoint(run_dir))) {
    throw InputError("run folder '" + run_dir.string() + "' already holds a trained run: continue it with --resume " +
                     run_dir.string() + ", or pick another run.name");
  }
  if (resume && !fs::exists(run_dir / "syncer")) {
    throw InputError("cannot resume: '" + run_dir.string() + "' has no syncer state");
  }
  const RunFolder folder = prepare_run_folder(config);
  const int M = folder.learners, cores = folder.cores, learner_threads = folder.child_threads;
  EventLog events(run_dir / "events" / "launcher.jsonl", Role::kLauncher, 0);
  const fs::path address_file = run_dir / "syncer.addr";
  std::error_code ec;
  fs::remove(address_file, ec);

  const std::string& cfg = folder.config_path;
  std::vector<FaultEvent> faults;
  if (plan != nullptr) {
    faults = plan->resolve(M);
    write_file_atomically(run_dir / "plan.json", plan->to_json(M).dump(2) + "\n");
  }
  FaultInjector injector(faults, run_dir, events);
  injector.set_scavenging(true);  // add_learner / leave_learner: learners join and leave the running job
  auto syncer_args = [&](const std::string& listen) {
    return std::vector<std::string>{"syncer", "--config", cfg, "--run-dir", run_dir.string(), "--listen", listen,
                                    "--address-file", address_file.string()};
  };
  std::vector<Child> children;
  children.push_back({"syncer", -1, spawn(syncer_args(config.run.syncer_address), run_dir / "logs" / "syncer.log", 1)});
  const std::string address = read_address(address_file, children[0], children);
  // Link faults in the plan: every learner dials the syncer through its own fault-injecting proxy.
  std::vector<std::unique_ptr<LinkProxy>> links;
  if (std::any_of(faults.begin(), faults.end(), [](const FaultEvent& f) {
        return f.action == FaultAction::kCutLink || f.action == FaultAction::kDelayLink;
      })) {
    std::vector<LinkProxy*> raw;
    for (int id = 0; id < M; ++id) {
      links.push_back(std::make_unique<LinkProxy>(address));
      raw.push_back(links.back().get());
    }
    injector.set_links(raw);
  }
  auto learner_args = [&](int id) {
    // Learners added by the plan (ids ≥ M) dial the syncer directly: link faults name the M slots.
    const std::string& syncer = id < static_cast<int>(links.size()) ? links[static_cast<size_t>(id)]->address() : address;
    return std::vector<std::string>{"learner", "--config", cfg, "--syncer", syncer, "--id", std::to_string(id),
                                    "--run-dir", run_dir.string(), "--set",
                                    "run.threads=" + std::to_string(learner_threads)};
  };
  for (int id = 0; id < M; ++id) {
    children.push_back({"learner " + std::to_string(id), id,
                        spawn(learner_args(id), run_dir / "logs" / ("learner_" + std::to_string(id) + ".log"),
                              learner_threads)});
  }
  children.push_back({"evaluator", -1, spawn({"evaluator", "--config", cfg, "--syncer", address, "--run-dir",
                                              run_dir.string()},
                                             run_dir / "logs" / "evaluator.log", 1)});
  const auto plan_started = Clock::now();  // a fault plan's clock: seconds since the learners were started
  events.emit("started", {{"syncer", address}, {"learners", M}, {"learner_threads", learner_threads},
                          {"faults_planned", faults.size()}});
  std::printf("[launcher] run %s: syncer %s, %d learners × %d BLAS threads, evaluator; logs in %s\n",
              config.run.name.c_str(), address.c_str(), M, learner_threads, (run_dir / "logs").c_str());
  std::fflush(stdout);

  // Status comes from the syncer (it needs no handshake); a client created after the children exist.
  std::unique_ptr<wire::SyncerClient> syncer_client = transport.connect_syncer(address);
  std::signal(SIGINT, on_launcher_signal);
  std::signal(SIGTERM, on_launcher_signal);
  wire::StatusReply last;
  auto last_row = Clock::now() - std::chrono::hours(1);
  int64_t last_eval_printed = -1;
  bool finished = false;
  while (g_launcher_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    reap(children);
    const double elapsed = std::chrono::duration<double>(Clock::now() - plan_started).count();
    injector.tick(elapsed, last.global_step, finished, children);
    for (int id : injector.take_joins()) {  // scavenging: a learner with a new id joins the running job
      children.push_back({"learner " + std::to_string(id), id,
                          spawn(learner_args(id), run_dir / "logs" / ("learner_" + std::to_string(id) + ".log"),
                                learner_threads)});
      events.emit("learner_added", {{"learner", id}, {"at_s", elapsed}, {"pid", children.back().pid}});
      std::printf("[launcher] learner %d joins the run\n", id);
      std::fflush(stdout);
    }
    Child& syncer = children[0];
    if (syncer.exited && !injector.syncer_restart_pending()) break;  // the syncer is gone (finished or failed)
    if (syncer.exited) {  // killed by the plan: restart it on the same address, from its persisted state
      const double delay = injector.restart_delay(syncer, 0);
      if (delay >= 0 && Clock::now() - syncer.died_at >= std::chrono::duration<double>(delay)) {
        syncer.pid = spawn(syncer_args(address), run_dir / "logs" / "syncer.log", 1);
        syncer.exited = false;
        ++syncer.restarts;
        injector.restarted(syncer);
        events.emit("syncer_restarted", {{"restarts", syncer.restarts}, {"at_s", elapsed}, {"address", address}});
        std::printf("[launcher] syncer restarted on %s from its persisted state\n", address.c_str());
      }
    }
    for (auto& c : children) {  // a learner that died is restarted: it rejoins from the syncer's Θ
      if (c.learner < 0 || !c.exited || finished || injector.left(c)) continue;  // a learner that left stays out
      const double delay = injector.restart_delay(c, config.run.restart_delay_s);
      if (delay < 0 || Clock::now() - c.died_at < std::chrono::duration<double>(delay)) continue;
      events.emit("learner_restarted", {{"learner", c.learner}, {"exit_status", c.status}, {"restarts", c.restarts + 1},
                                        {"at_s", elapsed}});
      std::printf("[launcher] learner %d exited (status %d): restarting it\n", c.learner, c.status);
      c.pid = spawn(learner_args(c.learner), run_dir / "logs" / ("learner_" + std::to_string(c.learner) + ".log"),
                    learner_threads);
      c.exited = false;
      ++c.restarts;
      injector.restarted(c);
    }
    auto status = syncer_client->status(std::chrono::seconds(5));
    if (!status.ok()) continue;
    last = std::move(status.value);
    finished = last.finished;
    const bool new_eval = last.last_eval_step > last_eval_printed;
    if (Clock::now() - last_row > std::chrono::duration<double>(config.run.report_interval_s) || new_eval) {
      last_row = Clock::now();
      last_eval_printed = last.last_eval_step;
      const double frac = static_cast<double>(last.tokens_trained) / std::max<int64_t>(1, last.tokens_budget);
      std::string tps;
      int live = 0;
      for (const auto& l : last.learners) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%s%.0f", tps.empty() ? "" : " ", l.live ? l.tokens_per_s : 0.0);
        tps += buf;
        live += l.live ? 1 : 0;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
      char val[32] = "  -  ";
      if (last.last_eval_step >= 0) std::snprintf(val, sizeof(val), "%.3f", last.last_val_loss);
      std::printf("%s %3.0f%% t %5lld | val %s | merges %5lld | quorum %lld | live %d/%d | tok/s %s | %4.0fs\n",
                  progress_bar(frac).c_str(), 100 * frac, static_cast<long long>(last.global_step), val,
                  static_cast<long long>(last.merges), static_cast<long long>(last.last_quorum), live,
                  std::max(M, static_cast<int>(last.learners.size())),
                  tps.c_str(), elapsed);
      std::fflush(stdout);
      events.emit("progress", {{"global_step", last.global_step}, {"tokens", last.tokens_trained},
                               {"merges", last.merges}, {"val_loss", last.last_val_loss}, {"live", live}});
    }
  }
  const bool interrupted = g_launcher_signal.load() != 0 || !finished;
  if (g_launcher_signal.load() != 0) {
    std::printf("[launcher] signal %d: stopping every child; the syncer persists and checkpoints Θ (resume with "
                "--resume %s)\n", g_launcher_signal.load(), run_dir.c_str());
    std::fflush(stdout);
  }
  syncer_client.reset();
  injector.release(children, std::chrono::duration<double>(Clock::now() - plan_started).count());
  // Children: learners and the evaluator exit on the syncer's stop; anything left gets SIGTERM, then SIGKILL.
  const auto wait_until = Clock::now() + std::chrono::seconds(interrupted ? 1 : 20);
  while (Clock::now() < wait_until) {
    reap(children);
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_children(children, std::chrono::seconds(30));
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);

  // Tokens: the launcher's last Status poll can predate the learners' last metadata (the final flush can finish
  // within one poll interval); the syncer's state.json, written when the run finished, has the final count.
  int64_t tokens_trained = last.tokens_trained;
  {
    const auto state = nlohmann::json::parse(std::ifstream(run_dir / "syncer" / "state.json"), nullptr, false);
    if (state.is_object()) tokens_trained = std::max(tokens_trained, state.value("tokens_trained", int64_t{0}));
  }
  // The report: the global model's final checkpoint, evaluated on the whole validation split.
  const nlohmann::json final_eval = evaluate_final_checkpoint(config, cores);
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  nlohmann::json bytes = {{"syncer", {{"sent", last.bytes_sent}, {"received", last.bytes_received}}}};
  nlohmann::json learners = nlohmann::json::array();
  for (const auto& l : last.learners) {
    bytes["learner_" + std::to_string(l.id)] = {{"sent", l.bytes_sent}, {"received", l.bytes_received}};
    learners.push_back({{"id", l.id}, {"tokens_trained", l.tokens_trained}, {"steps", l.step}});
  }
  int restarts = 0;
  for (const auto& c : children) restarts += c.learner >= 0 ? c.restarts : 0;
  nlohmann::json report = {
      {"run", config.run.name},
      {"mode", "decoupled"},
      {"status", interrupted ? "stopped" : "finished"},
      {"final_val_loss", final_eval["val_loss"]},
      {"final_val_perplexity", final_eval["val_perplexity"]},
      {"global_step", last.global_step},
      {"steps", last.global_step},
      {"steps_skipped", 0},
      {"merges", last.merges},
      {"tokens_trained", tokens_trained},
      {"wall_seconds", wall},
      {"tokens_per_second", tokens_trained / std::max(wall, 1e-9)},
      {"learners", learners},
      {"learner_restarts", restarts},
      {"syncer_restarts", children[0].restarts},
      {"faults_injected", injector.injected()},
      {"answers_dropped", last.answers_dropped},
      {"answers_refused", last.answers_refused},
      {"checkpoint", final_eval["checkpoint"]},
      {"sample", final_eval["sample"]},
      {"bytes", bytes},
      {"signal", g_launcher_signal.load()},
  };
  write_file_atomically(run_dir / "report.json", report.dump(2) + "\n");
  events.emit("finished", {{"status", report["status"]}, {"val_loss", report["final_val_loss"]}});
  return report;
}

}  // namespace dloco
