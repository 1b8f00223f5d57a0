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

// Removes the previous syncer's address file and resolves the fault plan, writing run_dir/plan.json.
std::vector<FaultEvent> remove_address_and_resolve_plan(const fs::path& run_dir, const fs::path& address_file,
                                                        const FaultPlan* plan, int M) {
  std::error_code ec;
  fs::remove(address_file, ec);
  std::vector<FaultEvent> faults;
  if (plan != nullptr) {
    faults = plan->resolve(M);
    write_file_atomically(run_dir / "plan.json", plan->to_json(M).dump(2) + "\n");
  }
  return faults;
}

// The state the steps of run_launcher share: the children (children_[0] is the syncer), the syncer's address,
// the link proxies and the syncer's last status. Its methods are those steps, in the order they run.
class DecoupledRun {
 public:
  DecoupledRun(const Config& config, const RunFolder& folder, const FaultPlan* plan, Clock::time_point started)
      : config_(config),
        started_(started),
        run_dir_(config.run_dir()),
        M_(folder.learners),
        learner_threads_(folder.child_threads),
        cfg_(folder.config_path),
        events_(run_dir_ / "events" / "launcher.jsonl", Role::kLauncher, 0),
        address_file_(run_dir_ / "syncer.addr"),
        faults_(remove_address_and_resolve_plan(run_dir_, address_file_, plan, M_)),
        injector_(faults_, run_dir_, events_) {
    injector_.set_scavenging(true);  // add_learner / leave_learner: learners join and leave the running job
  }

  void start();
  void connect(wire::Transport& transport) { syncer_client_ = transport.connect_syncer(address_); }
  void supervise();
  bool stop_children_and_syncer_client();
  nlohmann::json report(bool interrupted, int cores);

 private:
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - plan_started_).count(); }
  std::vector<std::string> syncer_args(const std::string& listen) const;
  std::vector<std::string> learner_args(int id) const;
  pid_t spawn_learner(int id) const;
  void start_link_proxies();
  bool supervise_once();
  void add_joined_learners(double elapsed);
  void restart_syncer(double elapsed);
  void restart_learners(double elapsed);
  void progress_row();

  const Config& config_;
  const Clock::time_point started_;  // the run's start, for wall times
  const fs::path run_dir_;
  const int M_, learner_threads_;
  const std::string cfg_;
  EventLog events_;
  const fs::path address_file_;
  const std::vector<FaultEvent> faults_;
  FaultInjector injector_;
  std::vector<Child> children_;  // [0]: the syncer
  std::string address_;          // the syncer's
  // Link faults in the plan: every learner dials the syncer through its own fault-injecting proxy.
  std::vector<std::unique_ptr<LinkProxy>> links_;
  Clock::time_point plan_started_;  // a fault plan's clock: seconds since the learners were started
  // Status comes from the syncer (it needs no handshake); a client created after the children exist.
  std::unique_ptr<wire::SyncerClient> syncer_client_;
  wire::StatusReply last_;
  Clock::time_point last_row_ = Clock::now() - std::chrono::hours(1);
  int64_t last_eval_printed_ = -1;
  bool finished_ = false;
};

std::vector<std::string> DecoupledRun::syncer_args(const std::string& listen) const {
  return std::vector<std::string>{"syncer", "--config", cfg_, "--run-dir", run_dir_.string(), "--listen", listen,
                                  "--address-file", address_file_.string()};
}

std::vector<std::string> DecoupledRun::learner_args(int id) const {
  // Learners added by the plan (ids ≥ M) dial the syncer directly: link faults name the M slots.
  const std::string& syncer = id < static_cast<int>(links_.size()) ? links_[static_cast<size_t>(id)]->address() : address_;
  return std::vector<std::string>{"learner", "--config", cfg_, "--syncer", syncer, "--id", std::to_string(id),
                                  "--run-dir", run_dir_.string(), "--set",
                                  "run.threads=" + std::to_string(learner_threads_)};
}

pid_t DecoupledRun::spawn_learner(int id) const {
  return spawn(learner_args(id), run_dir_ / "logs" / ("learner_" + std::to_string(id) + ".log"), learner_threads_);
}

void DecoupledRun::start_link_proxies() {
  if (std::none_of(faults_.begin(), faults_.end(), [](const FaultEvent& f) {
        return f.action == FaultAction::kCutLink || f.action == FaultAction::kDelayLink;
      })) {
    return;
  }
  std::vector<LinkProxy*> raw;
  for (int id = 0; id < M_; ++id) {
    links_.push_back(std::make_unique<LinkProxy>(address_));
    raw.push_back(links_.back().get());
  }
  injector_.set_links(raw);
}

// The syncer (waiting for its address), the link proxies, M learners and the evaluator.
void DecoupledRun::start() {
  children_.push_back({"syncer", -1, spawn(syncer_args(config_.run.syncer_address), run_dir_ / "logs" / "syncer.log", 1)});
  address_ = read_address(address_file_, children_[0], children_);
  start_link_proxies();
  for (int id = 0; id < M_; ++id) children_.push_back({"learner " + std::to_string(id), id, spawn_learner(id)});
  children_.push_back({"evaluator", -1, spawn({"evaluator", "--config", cfg_, "--syncer", address_, "--run-dir",
                                               run_dir_.string()},
                                              run_dir_ / "logs" / "evaluator.log", 1)});
  plan_started_ = Clock::now();
  events_.emit("started", {{"syncer", address_}, {"learners", M_}, {"learner_threads", learner_threads_},
                           {"faults_planned", faults_.size()}});
  std::printf("[launcher] run %s: syncer %s, %d learners × %d BLAS threads, evaluator; logs in %s\n",
              config_.run.name.c_str(), address_.c_str(), M_, learner_threads_, (run_dir_ / "logs").c_str());
  std::fflush(stdout);
}

// Until a signal, or the syncer is gone (finished or failed) with no restart pending.
void DecoupledRun::supervise() {
  while (g_launcher_signal.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!supervise_once()) break;
  }
}

bool DecoupledRun::supervise_once() {
  reap(children_);
  const double elapsed = elapsed_s();
  injector_.tick(elapsed, last_.global_step, finished_, children_);
  add_joined_learners(elapsed);
  if (children_[0].exited && !injector_.syncer_restart_pending()) return false;
  restart_syncer(elapsed);
  restart_learners(elapsed);
  progress_row();
  return true;
}

// Scavenging: a learner with a new id joins the running job.
void DecoupledRun::add_joined_learners(double elapsed) {
  for (int id : injector_.take_joins()) {
    children_.push_back({"learner " + std::to_string(id), id, spawn_learner(id)});
    events_.emit("learner_added", {{"learner", id}, {"at_s", elapsed}, {"pid", children_.back().pid}});
    std::printf("[launcher] learner %d joins the run\n", id);
    std::fflush(stdout);
  }
}

// A syncer killed by the plan restarts on the same address, from its persisted state, once its delay is over.
void DecoupledRun::restart_syncer(double elapsed) {
  Child& syncer = children_[0];
  if (!syncer.exited) return;
  const double delay = injector_.restart_delay(syncer, 0);
  if (delay >= 0 && Clock::now() - syncer.died_at >= std::chrono::duration<double>(delay)) {
    syncer.pid = spawn(syncer_args(address_), run_dir_ / "logs" / "syncer.log", 1);
    syncer.exited = false;
    ++syncer.restarts;
    injector_.restarted(syncer);
    events_.emit("syncer_restarted", {{"restarts", syncer.restarts}, {"at_s", elapsed}, {"address", address_}});
    std::printf("[launcher] syncer restarted on %s from its persisted state\n", address_.c_str());
  }
}

// A learner that died is restarted after its delay: it rejoins from the syncer's Θ. One that left stays out.
void DecoupledRun::restart_learners(double elapsed) {
  for (auto& c : children_) {
    if (c.learner < 0 || !c.exited || finished_ || injector_.left(c)) continue;
    const double delay = injector_.restart_delay(c, config_.run.restart_delay_s);
    if (delay < 0 || Clock::now() - c.died_at < std::chrono::duration<double>(delay)) continue;
    events_.emit("learner_restarted", {{"learner", c.learner}, {"exit_status", c.status}, {"restarts", c.restarts + 1},
                                       {"at_s", elapsed}});
    std::printf("[launcher] learner %d exited (status %d): restarting it\n", c.learner, c.status);
    c.pid = spawn_learner(c.learner);
    c.exited = false;
    ++c.restarts;
    injector_.restarted(c);
  }
}

// Polls the syncer's status; one console row and one progress event per report interval and per evaluation.
void DecoupledRun::progress_row() {
  auto status = syncer_client_->status(std::chrono::seconds(5));
  if (!status.ok()) return;
  last_ = std::move(status.value);
  finished_ = last_.finished;
  const bool new_eval = last_.last_eval_step > last_eval_printed_;
  if (Clock::now() - last_row_ <= std::chrono::duration<double>(config_.run.report_interval_s) && !new_eval) return;
  last_row_ = Clock::now();
  last_eval_printed_ = last_.last_eval_step;
  const double frac = static_cast<double>(last_.tokens_trained) / std::max<int64_t>(1, last_.tokens_budget);
  std::string tps;
  int live = 0;
  for (const auto& l : last_.learners) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.0f", tps.empty() ? "" : " ", l.live ? l.tokens_per_s : 0.0);
    tps += buf;
    live += l.live ? 1 : 0;
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  char val[32] = "  -  ";
  if (last_.last_eval_step >= 0) std::snprintf(val, sizeof(val), "%.3f", last_.last_val_loss);
  std::printf("%s %3.0f%% t %5lld | val %s | merges %5lld | quorum %lld | live %d/%d | tok/s %s | %4.0fs\n",
              progress_bar(frac).c_str(), 100 * frac, static_cast<long long>(last_.global_step), val,
              static_cast<long long>(last_.merges), static_cast<long long>(last_.last_quorum), live,
              std::max(M_, static_cast<int>(last_.learners.size())),
              tps.c_str(), elapsed);
  std::fflush(stdout);
  events_.emit("progress", {{"global_step", last_.global_step}, {"tokens", last_.tokens_trained},
                            {"merges", last_.merges}, {"val_loss", last_.last_val_loss}, {"live", live}});
}

// Learners and the evaluator exit on the syncer's stop; anything left gets SIGTERM, then SIGKILL. Returns
// whether the run was interrupted (a signal, or it did not finish).
bool DecoupledRun::stop_children_and_syncer_client() {
  const bool interrupted = g_launcher_signal.load() != 0 || !finished_;
  if (g_launcher_signal.load() != 0) {
    std::printf("[launcher] signal %d: stopping every child; the syncer persists and checkpoints Θ (resume with "
                "--resume %s)\n", g_launcher_signal.load(), run_dir_.c_str());
    std::fflush(stdout);
  }
  syncer_client_.reset();
  injector_.release(children_, elapsed_s());
  const auto wait_until = Clock::now() + std::chrono::seconds(interrupted ? 1 : 20);
  while (Clock::now() < wait_until) {
    reap(children_);
    if (std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.exited; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_children(children_, std::chrono::seconds(30));
  return interrupted;
}

// The report: the global model's final checkpoint, evaluated on the whole validation split; run_dir/report.json.
nlohmann::json DecoupledRun::report(bool interrupted, int cores) {
  // Tokens: the launcher's last Status poll can predate the learners' last metadata (the final flush can finish
  // within one poll interval); the syncer's state.json, written when the run finished, has the final count.
  int64_t tokens_trained = last_.tokens_trained;
  {
    const auto state = nlohmann::json::parse(std::ifstream(run_dir_ / "syncer" / "state.json"), nullptr, false);
    if (state.is_object()) tokens_trained = std::max(tokens_trained, state.value("tokens_trained", int64_t{0}));
  }
  const nlohmann::json final_eval = evaluate_final_checkpoint(config_, cores);
  const double wall = std::chrono::duration<double>(Clock::now() - started_).count();
  nlohmann::json bytes = {{"syncer", {{"sent", last_.bytes_sent}, {"received", last_.bytes_received}}}};
  nlohmann::json learners = nlohmann::json::array();
  for (const auto& l : last_.learners) {
    bytes["learner_" + std::to_string(l.id)] = {{"sent", l.bytes_sent}, {"received", l.bytes_received}};
    learners.push_back({{"id", l.id}, {"tokens_trained", l.tokens_trained}, {"steps", l.step}});
  }
  int restarts = 0;
  for (const auto& c : children_) restarts += c.learner >= 0 ? c.restarts : 0;
  nlohmann::json report = {
      {"run", config_.run.name},
      {"mode", "decoupled"},
      {"status", interrupted ? "stopped" : "finished"},
      {"final_val_loss", final_eval["val_loss"]},
      {"final_val_perplexity", final_eval["val_perplexity"]},
      {"global_step", last_.global_step},
      {"steps", last_.global_step},
      {"steps_skipped", 0},
      {"merges", last_.merges},
      {"tokens_trained", tokens_trained},
      {"wall_seconds", wall},
      {"tokens_per_second", tokens_trained / std::max(wall, 1e-9)},
      {"learners", learners},
      {"learner_restarts", restarts},
      {"syncer_restarts", children_[0].restarts},
      {"faults_injected", injector_.injected()},
      {"answers_dropped", last_.answers_dropped},
      {"answers_refused", last_.answers_refused},
      {"checkpoint", final_eval["checkpoint"]},
      {"sample", final_eval["sample"]},
      {"bytes", bytes},
      {"signal", g_launcher_signal.load()},
  };
  write_file_atomically(run_dir_ / "report.json", report.dump(2) + "\n");
  events_.emit("finished", {{"status", report["status"]}, {"val_loss", report["final_val_loss"]}});
  return report;
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
  DecoupledRun run(config, folder, plan, started);
  run.start();
  run.connect(transport);
  std::signal(SIGINT, on_launcher_signal);
  std::signal(SIGTERM, on_launcher_signal);
  run.supervise();
  const bool interrupted = run.stop_children_and_syncer_client();
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  return run.report(interrupted, folder.cores);
}

}  // namespace dloco
