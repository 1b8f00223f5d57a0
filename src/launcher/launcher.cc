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

#include <spdlog/spdlog.h>

#include "chaos/fault_plan.h"
#include "core/decisions.h"
#include "launcher/fault_injector.h"
#include "launcher/launcher.h"
#include "launcher/run_report.h"
#include "process/atomic_file.h"
#include "process/children.h"
#include "process/console.h"
#include "process/events.h"
#include "process/json_file.h"
#include "process/stop_signals.h"
#include "train/checkpoint.h"
#include "train/fragment_io.h"
#include "transport/status_json.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_address(const fs::path& file, Child& syncer, std::vector<Child>& children) {
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline && StopSignals::first() == 0) {
    std::ifstream in(file);
    std::string address;
    if (in >> address && !address.empty()) return address;
    reap(children);
    if (syncer.exited) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  stop_children(children, std::chrono::seconds(5));
  if (StopSignals::first() != 0) throw InputError("stopped by signal " + std::to_string(StopSignals::first()) +
                                                  " while the syncer was starting");
  const std::string error = last_error_line(syncer.log);
  throw InputError("the syncer did not start" + (error.empty() ? "" : ": " + error) + " (its log: " +
                   syncer.log.string() + ")");
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
  DecoupledRun(const Config& config, const RunFolder& folder, const FaultPlan* plan, Clock::time_point started,
               double prior_wall_s)
      : config_(config),
        started_(started),
        prior_wall_s_(prior_wall_s),
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
  Child spawn_child(std::string role, int learner, const std::vector<std::string>& args, const std::string& file,
                    int threads) const;
  void respawn(Child& c, const std::vector<std::string>& args, int threads) const;
  bool crash_loop(Child& c);
  void note_other_exits();
  void start_link_proxies();
  bool supervise_once();
  void add_joined_learners(double elapsed);
  void restart_syncer(double elapsed);
  void restart_learners(double elapsed);
  void progress_row();

  const Config& config_;
  const Clock::time_point started_;  // the run's start, for wall times
  const double prior_wall_s_;        // wall time of the run before this resume (0 for a fresh run)
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
  // When the global step last moved (a plan's restart_at_step does not wait on a step that has stopped moving).
  int64_t step_seen_ = -1;
  Clock::time_point step_moved_at_ = Clock::now();
  int64_t last_eval_printed_ = -1;
  bool finished_ = false;
  std::string failure_;        // why the run was stopped without finishing: a crash loop, the syncer failing
  bool evaluator_noted_ = false;
  std::string last_error_printed_;  // a learner's error, said once on the console
};

// A role that fails this many times in a row before its first training step fails the same way on every start
// (a config, data or device error): the run stops with its error instead of restarting it forever.
constexpr int kCrashLoopStarts = 3;

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

// `file`: the role's file name stem, for logs/<file>.log and events/<file>.jsonl.
Child DecoupledRun::spawn_child(std::string role, int learner, const std::vector<std::string>& args,
                                const std::string& file, int threads) const {
  Child c{std::move(role), learner};
  c.log = run_dir_ / "logs" / (file + ".log");
  c.events = run_dir_ / "events" / (file + ".jsonl");
  c.events_offset = file_size_or_zero(c.events);
  c.pid = spawn(args, c.log, threads);
  return c;
}

void DecoupledRun::respawn(Child& c, const std::vector<std::string>& args, int threads) const {
  c.events_offset = file_size_or_zero(c.events);
  c.pid = spawn(args, c.log, threads);
  c.exited = false;
  ++c.restarts;
}

// A learner that exited: counts its failures before progress and says on the console why it exited. Returns true
// when that makes a crash loop (failure_ is then set and the run stops).
bool DecoupledRun::crash_loop(Child& c) {
  const bool planned = injector_.planned_kill(c);
  const bool failed = failed_by_itself(c.status) && !planned;
  if (!failed || stepped_since(c.events, c.events_offset)) {
    c.failures_before_progress = 0;
  } else {
    ++c.failures_before_progress;
  }
  const std::string error = failed ? last_error_line(c.log) : "";
  if (c.failures_before_progress >= kCrashLoopStarts) {
    failure_ = c.role + " failed " + std::to_string(c.failures_before_progress) +
               " times in a row before its first training step (" + exit_text(c.status) + "); its last error: " +
               (error.empty() ? "(none in " + c.log.string() + ")" : error);
    return true;
  }
  if (failed) {  // the error itself once; the same error from another start or learner is only named
    const bool again = !error.empty() && error == last_error_printed_;
    spdlog::info("[launcher] {} exited ({}){}: {}", c.role, exit_text(c.status),
                 c.failures_before_progress > 0 ? " before its first step" : "",
                 again ? "the same error" : error.empty() ? ("see " + c.log.string()) : error);
    if (!error.empty()) last_error_printed_ = error;
  }
  return false;
}

// The syncer or the evaluator exited on its own: a failing syncer ends the run with its error; a failing evaluator
// is said once (training goes on without periodic evaluations).
void DecoupledRun::note_other_exits() {
  Child& syncer = children_[0];
  if (syncer.exited && !finished_ && failure_.empty() && failed_by_itself(syncer.status) &&
      !injector_.planned_kill(syncer)) {
    const std::string error = last_error_line(syncer.log);
    failure_ = "the syncer failed (" + exit_text(syncer.status) + "); its last error: " +
               (error.empty() ? "(none in " + syncer.log.string() + ")" : error);
  }
  for (const auto& c : children_) {
    if (c.role != "evaluator" || !c.exited || evaluator_noted_ || !failed_by_itself(c.status)) continue;
    evaluator_noted_ = true;
    const std::string error = last_error_line(c.log);
    spdlog::info("[launcher] the evaluator exited ({}): {}; training goes on without periodic evaluations",
                 exit_text(c.status), error.empty() ? ("see " + c.log.string()) : error);
  }
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
  children_.push_back(spawn_child("syncer", -1, syncer_args(config_.run.syncer_address), "syncer", 1));
  address_ = read_address(address_file_, children_[0], children_);
  start_link_proxies();
  for (int id = 0; id < M_; ++id) {
    children_.push_back(spawn_child("learner " + std::to_string(id), id, learner_args(id),
                                    "learner_" + std::to_string(id), learner_threads_));
  }
  children_.push_back(spawn_child("evaluator", -1,
                                  {"evaluator", "--config", cfg_, "--syncer", address_, "--run-dir", run_dir_.string()},
                                  "evaluator", 1));
  plan_started_ = Clock::now();
  events_.emit("started", {{"syncer", address_}, {"learners", M_}, {"learner_threads", learner_threads_},
                           {"faults_planned", faults_.size()}});
  spdlog::info("[launcher] run {}: syncer {}, {} learners × {} BLAS threads, evaluator; logs in {}",
               config_.run.name, address_, M_, learner_threads_, (run_dir_ / "logs").string());
  if (std::string url; std::ifstream(run_dir_ / "monitor.url") >> url) {
    spdlog::info("[launcher] dashboard {} (Prometheus metrics: {}metrics)", url, url);
  }
}

// Until a signal, or the syncer is gone (finished or failed) with no restart pending.
void DecoupledRun::supervise() {
  while (StopSignals::first() == 0 && failure_.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!supervise_once()) break;
  }
}

bool DecoupledRun::supervise_once() {
  reap(children_);
  const double elapsed = elapsed_s();
  injector_.tick(elapsed, last_.global_step, finished_, children_);
  add_joined_learners(elapsed);
  note_other_exits();
  if (!failure_.empty()) return false;
  if (children_[0].exited && !injector_.syncer_restart_pending()) return false;
  restart_syncer(elapsed);
  restart_learners(elapsed);
  if (!failure_.empty()) return false;
  progress_row();
  return true;
}

// Scavenging: a learner with a new id joins the running job.
void DecoupledRun::add_joined_learners(double elapsed) {
  for (int id : injector_.take_joins()) {
    children_.push_back(spawn_child("learner " + std::to_string(id), id, learner_args(id),
                                    "learner_" + std::to_string(id), learner_threads_));
    events_.emit("learner_added", {{"learner", id}, {"at_s", elapsed}, {"pid", children_.back().pid}});
    spdlog::info("[launcher] learner {} joins the run", id);
  }
}

// A syncer killed by the plan restarts on the same address, from its persisted state, once its delay is over.
void DecoupledRun::restart_syncer(double elapsed) {
  Child& syncer = children_[0];
  if (!syncer.exited) return;
  const double delay = injector_.restart_delay(syncer, 0);
  if (delay >= 0 && Clock::now() - syncer.died_at >= std::chrono::duration<double>(delay)) {
    respawn(syncer, syncer_args(address_), 1);
    injector_.restarted(syncer);
    events_.emit("syncer_restarted", {{"restarts", syncer.restarts}, {"at_s", elapsed}, {"address", address_}});
    spdlog::info("[launcher] syncer restarted on {} from its persisted state", address_);
  }
}

// A learner that died is restarted after its delay: it rejoins from the syncer's Θ. One that left stays out.
void DecoupledRun::restart_learners(double elapsed) {
  // A plan's restart_at_step waits for the others to move the global step. Once the step has not moved for one
  // lease (all others down, paused, finished, or fewer than K live) nobody will move it: it no longer holds the
  // restart back.
  if (last_.global_step != step_seen_) {
    step_seen_ = last_.global_step;
    step_moved_at_ = Clock::now();
  }
  const bool step_stalled = Clock::now() - step_moved_at_ > std::chrono::duration<double>(LeaseConfig{}.min_lease_s);
  for (auto& c : children_) {
    if (c.learner < 0 || !c.exited || finished_ || injector_.left(c)) continue;
    // Exit status 0: the learner stopped as told (the syncer's stop once its share or the run was done, or a
    // SIGTERM: it left). Not a failure, whether or not the launcher has seen the syncer's "finished" yet (the
    // syncer may have stopped answering Status first): restarting it would bootstrap a learner into a run that is
    // over.
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) continue;
    const double delay = injector_.restart_delay(c, config_.run.restart_delay_s);
    if (delay < 0 || Clock::now() - c.died_at < std::chrono::duration<double>(delay)) continue;
    if (!step_stalled && !injector_.restart_step_reached(c, last_.global_step)) continue;  // restart_at_step
    if (crash_loop(c)) return;
    events_.emit("learner_restarted", {{"learner", c.learner}, {"exit_status", c.status}, {"restarts", c.restarts + 1},
                                       {"at_s", elapsed}, {"failures_before_progress", c.failures_before_progress}});
    spdlog::info("[launcher] restarting {} (restart {})", c.role, c.restarts + 1);
    respawn(c, learner_args(c.learner), learner_threads_);
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
  double loss_sum = 0;
  for (const auto& l : last_.learners) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.0f", tps.empty() ? "" : " ", l.live ? l.tokens_per_s : 0.0);
    tps += buf;
    live += l.live ? 1 : 0;
    loss_sum += l.live && std::isfinite(l.loss) ? l.loss : 0.0;
  }
  if (live == 0 && last_.global_step == 0 && !new_eval) return;  // nobody trains yet: no row of zeros
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  char val[32] = "  -  ", train[32] = "  -  ";
  if (last_.last_eval_step >= 0) std::snprintf(val, sizeof(val), "%.3f", last_.last_val_loss);
  if (live > 0) std::snprintf(train, sizeof(train), "%.3f", loss_sum / live);
  spdlog::info("{} {:3.0f}% t {:5} | loss {} | val {} | merges {:5} | quorum {} | live {}/{} | tok/s {} | {:4.0f}s",
               progress_bar(frac), 100 * frac, static_cast<long long>(last_.global_step), train, val,
               static_cast<long long>(last_.merges), static_cast<long long>(last_.last_quorum), live,
               std::max(M_, static_cast<int>(last_.learners.size())),
               tps, elapsed);
  events_.emit("progress", {{"global_step", last_.global_step}, {"tokens", last_.tokens_trained},
                            {"merges", last_.merges}, {"val_loss", last_.last_val_loss}, {"live", live}});
}

// Learners and the evaluator exit on the syncer's stop; anything left gets SIGTERM, then SIGKILL (at once when a
// second signal asks to hurry). Returns whether the run was interrupted (a signal, a failure, or it did not finish).
bool DecoupledRun::stop_children_and_syncer_client() {
  const int sig = StopSignals::first();
  const bool interrupted = sig != 0 || !finished_ || !failure_.empty();
  if (!failure_.empty()) {
    spdlog::info("[launcher] {}: stopping the run", failure_);
  } else if (sig != 0) {
    spdlog::info("[launcher] signal {}: stopping every child; the syncer persists and checkpoints Θ (resume with "
                 "--resume {}; a second Ctrl-C stops at once)", sig, run_dir_.string());
  }
  syncer_client_.reset();
  injector_.release(children_, elapsed_s());
  const auto wait_until = Clock::now() + std::chrono::seconds(interrupted ? 1 : 20);
  while (Clock::now() < wait_until && !StopSignals::hurry()) {
    reap(children_);
    if (std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.exited; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_children(children_, std::chrono::seconds(30), [] { return StopSignals::hurry(); });
  return interrupted;
}

// The report: the global model's final checkpoint, evaluated on the whole validation split; run_dir/report.json.
nlohmann::json DecoupledRun::report(bool interrupted, int cores) {
  // Tokens: the launcher's last Status poll can predate the learners' last metadata (the final flush can finish
  // within one poll interval); the syncer's state.json, written when the run finished, has the final count.
  // The syncer's state.json, written once more after its merger stopped, is the one source of the global step,
  // tokens and merges (the final checkpoint names the same step); the last poll only stands in when it is missing.
  int64_t tokens_trained = last_.tokens_trained, global_step = last_.global_step, merges = last_.merges;
  nlohmann::json goodput = nullptr;  // 1 − tokens lost / (P · tokens trained), as the dashboard's (docs/monitoring.md)
  {
    const auto state = try_read_json_file(run_dir_ / "syncer" / "state.json").value_or(nullptr);
    if (state.is_object()) {
      tokens_trained = state.value("tokens_trained", tokens_trained);
      global_step = state.value("global_step", global_step);
      merges = state.value("merges", merges);
      const double P = state.contains("versions") && state["versions"].is_array() ? state["versions"].size() : 0.0;
      const double lost = state.value("tokens_lost", 0.0);
      if (P > 0 && tokens_trained > 0) goodput = std::clamp(1.0 - lost / (P * tokens_trained), 0.0, 1.0);
      // The syncer merged the whole budget before a signal reached it: the run finished (a resume would say so),
      // whatever came after.
      if (state.value("finished", false) && failure_.empty()) interrupted = false;
    }
  }
  const nlohmann::json final_eval =
      final_evaluation(config_, cores, final_eval_skip_reason(StopSignals::hurry(), failure_));
  // A resumed run's report covers the whole run: the wall time of the parts before is added.
  const double wall = prior_wall_s_ + std::chrono::duration<double>(Clock::now() - started_).count();
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
      {"status", run_status(config_, interrupted, failure_, tokens_trained)},
      {"final_val_loss", final_eval["val_loss"]},
      {"final_val_perplexity", final_eval["val_perplexity"]},
      {"global_step", global_step},
      {"steps", global_step},
      {"steps_skipped", 0},
      {"merges", merges},
      {"goodput", goodput},
      {"tokens_trained", tokens_trained},
      {"tokens_budget", config_.train.total_tokens},
      {"tokens_complete", config_.complete_tokens()},
      {"wall_seconds", wall},
      {"tokens_per_second", tokens_trained / std::max(wall, 1e-9)},
      {"learners", learners},
      {"learner_restarts", restarts},
      {"syncer_restarts", children_[0].restarts},
      {"faults_injected", injector_.injected()},
      {"answers_dropped", last_.answers_dropped},
      {"answers_refused", last_.answers_refused},
      {"screening", wire::screening_json(last_)},
      {"checkpoint", final_eval["checkpoint"]},
      {"sample", final_eval["sample"]},
      {"bytes", bytes},
      {"signal", interrupted ? StopSignals::first() : 0},
  };
  if (!failure_.empty()) report["failure"] = failure_;
  if (final_eval.contains("skipped")) report["final_eval_skipped"] = final_eval["skipped"];
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
  double prior_wall_s = 0;
  if (resume) {  // a finished run stays as it is: its report, checkpoints and state are not touched
    const auto state = try_read_json_file(run_dir / "syncer" / "state.json").value_or(nullptr);
    auto previous = try_read_json_file(run_dir / "report.json").value_or(nullptr);
    if (state.is_object() && state.value("finished", false)) {
      spdlog::info("[launcher] run {} already finished (report {}): nothing to resume, nothing changed",
                   config.run.name, (run_dir / "report.json").string());
      if (!previous.is_object()) throw InputError("run '" + run_dir.string() + "' finished but has no report.json");
      previous["already_finished"] = true;
      return previous;
    }
    if (previous.is_object()) prior_wall_s = previous.value("wall_seconds", 0.0);
  }
  const RunFolder folder = prepare_run_folder(config);
  const StopSignals signals;  // from before the first child: a signal during start-up stops the run cleanly too
  DecoupledRun run(config, folder, plan, started, prior_wall_s);
  run.start();
  run.connect(transport);
  run.supervise();
  const bool interrupted = run.stop_children_and_syncer_client();
  return run.report(interrupted, folder.cores);
}

}  // namespace dloco
