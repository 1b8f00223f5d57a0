// The launcher of the baselines (diloco.mode = dp | diloco | streaming): M worker processes in one Gloo group,
// progress rows from rank 0's status.json, and the same report as the decoupled launcher. Synchronous training
// cannot continue without every worker: what happens when one dies is run.recovery (stop the run; restart all
// from the newest checkpoint once it is back; or elastic: re-form without it at once, and again with it).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "baselines/launcher.h"
#include "baselines/worker_state.h"
#include "baselines/worker_status.h"
#include "core/check.h"
#include "launcher/fault_injector.h"
#include "launcher/run_report.h"
#include "process/atomic_file.h"
#include "process/children.h"
#include "process/console.h"
#include "process/events.h"
#include "process/json_file.h"
#include "process/stop_signals.h"
#include "train/checkpoint.h"

namespace dloco {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {


}  // namespace

namespace {

bool exited_cleanly(const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }

std::string describe_exit(const Child& c) { return exit_text(c.status); }

std::string join_slots(const std::vector<int>& slots) {
  std::string out;
  for (int s : slots) out += (out.empty() ? "" : ",") + std::to_string(s);
  return out;
}

// What one step of a supervision pass decided: go on to the next step, start the next pass, or leave the loop.
enum class Next { kGoOn, kNextPass, kStop };

// Removes run_dir/gloo (the stores of an earlier run) and resolves the fault plan, writing run_dir/plan.json.
std::vector<FaultEvent> reset_gloo_and_resolve_plan(const fs::path& run_dir, const FaultPlan* plan, int M,
                                                    RecoveryPolicy recovery) {
  if (plan != nullptr && recovery == RecoveryPolicy::kRestart) {
    for (const auto& f : plan->events) {
      if (f.restart_at_step < 0) continue;
      throw InputError("plan '" + plan->name + "': " + f.describe() + ": with run.recovery = \"restart\" the " +
                       "group waits for the dead worker, so the global step cannot reach restart_at_step (use " +
                       "restart_after_s, or run.recovery = \"elastic\")");
    }
  }
  std::error_code ec;
  fs::remove_all(run_dir / "gloo", ec);
  fs::create_directories(run_dir / "gloo");
  std::vector<FaultEvent> faults;
  if (plan != nullptr) {
    faults = plan->resolve(M);
    write_file_atomically(run_dir / "plan.json", plan->to_json(M).dump(2) + "\n");
  }
  return faults;
}

// The state the launcher's steps share: the worker slots, the running group, rank 0's last status.json and how
// the run ended. Its methods are the steps of run_collective_launcher, in the order they run.
class CollectiveRun {
 public:
  CollectiveRun(const Config& config, const RunFolder& folder, const FaultPlan* plan, Clock::time_point started,
                bool resume, nlohmann::json prior)
      : config_(config),
        started_(started),
        resume_(resume),
        prior_(std::move(prior)),
        run_dir_(config.run_dir()),
        M_(folder.learners),
        worker_threads_(folder.child_threads),
        recovery_(config.run.recovery),
        cfg_(folder.config_path),
        events_(run_dir_ / "events" / "launcher.jsonl", Role::kLauncher, 0),
        faults_(reset_gloo_and_resolve_plan(run_dir_, plan, M_, recovery_)),
        injector_(faults_, run_dir_, events_),
        down_(M_, false),
        back_at_(M_, Clock::time_point::max()) {
    for (int s = 0; s < M_; ++s) children_.push_back({"worker " + std::to_string(s), s, -1, true, 0, Clock::now(), 0});
    plan_started_ = Clock::now();
  }

  void start();
  void supervise();
  void stop_workers();
  nlohmann::json report(int cores);

 private:
  double elapsed_s() const { return std::chrono::duration<double>(Clock::now() - plan_started_).count(); }
  int64_t global_step() const { return last_.is_object() ? last_.value("global_step", int64_t{0}) : 0; }
  bool poll_status();
  void form(const std::string& reason);
  void wait_group(std::chrono::seconds grace);
  void hold_out(int s);
  void hold_out_planned_kills(const std::vector<int>& members);
  void bring_back(const std::vector<int>& returning);
  Next supervise_once();
  Next handle_deaths();
  Next stop_failed_group(const std::vector<int>& dead);
  Next regroup();
  Next form_when_allowed(const std::vector<int>& returning);
  Next grow(const std::vector<int>& returning);
  void progress_row();

  const Config& config_;
  const Clock::time_point started_;  // the run's start, for wall times
  const bool resume_;                 // --resume: the first group starts from the newest checkpoint (dp)
  const nlohmann::json prior_;        // a resumed run: the report of the parts before (wall time, syncs, waits)
  const fs::path run_dir_;
  const int M_, worker_threads_;
  const RecoveryPolicy recovery_;
  const std::string cfg_;
  EventLog events_;
  const std::vector<FaultEvent> faults_;
  FaultInjector injector_;
  std::vector<Child> children_;                 // one per slot; a slot outside the current group has exited = true
  std::vector<bool> down_;                      // dead and not yet due back
  std::vector<Clock::time_point> back_at_;
  std::vector<int> group_;                      // slots of the running group, rank order
  int64_t generation_ = -1;
  Clock::time_point plan_started_;              // a fault plan's clock: seconds since the first group was started
  // Rank 0's status.json (baselines/worker_status.h). One of another format version ends the run with its
  // message: the fields it holds may not mean what this launcher reads.
  nlohmann::json last_;
  std::string status_error_;
  std::string failure_;
  int failures_ = 0;
  bool run_finished_ = false;
  static constexpr int kMaxFailuresFromOneCheckpoint = 10;
  int same_checkpoint_failures_ = 0;
  int64_t last_failed_from_ = -1;
  Clock::time_point last_row_ = Clock::now() - std::chrono::hours(1);
  int64_t last_eval_printed_ = -1;
};

bool CollectiveRun::poll_status() {
  try {
    if (auto status = read_worker_status(run_dir_ / "status.json"); !status.is_null()) last_ = status;
  } catch (const InputError& e) {
    if (status_error_.empty()) status_error_ = e.what();
  }
  return status_error_.empty();
}

// Spawns one worker per slot that is not down, as generation + 1 (from the newest checkpoint after the first).
void CollectiveRun::form(const std::string& reason) {
  group_.clear();
  for (int s = 0; s < M_; ++s) {
    if (!down_[s]) group_.push_back(s);
  }
  ++generation_;
  const fs::path store = run_dir_ / "gloo" / ("store_" + std::to_string(generation_));
  const auto checkpoint = generation_ > 0   ? latest_checkpoint(run_dir_)
                          : resume_         ? resumable_checkpoint(config_)
                                            : std::nullopt;
  if (resume_ && generation_ == 0 && checkpoint && config_.diloco.mode != Mode::kDp) {
    discard_states_after(run_dir_, checkpoint->step);
  }
  for (size_t rank = 0; rank < group_.size(); ++rank) {
    const int s = group_[rank];
    std::vector<std::string> args{"worker", "--config", cfg_, "--rank", std::to_string(rank), "--run-dir",
                                  run_dir_.string(), "--store", store.string(), "--set",
                                  "run.threads=" + std::to_string(worker_threads_)};
    if (recovery_ != RecoveryPolicy::kStop) {
      args.insert(args.end(), {"--slots", join_slots(group_), "--generation", std::to_string(generation_)});
    }
    if (checkpoint && (recovery_ != RecoveryPolicy::kStop || resume_)) {
      args.insert(args.end(), {"--resume-from", checkpoint->dir.string()});
    }
    Child& c = children_[s];
    c.pid = spawn(args, run_dir_ / "logs" / ("worker_" + std::to_string(s) + ".log"), worker_threads_);
    c.exited = false;
    c.status = 0;
    if (generation_ > 0) ++c.restarts;
  }
  events_.emit("group_formed", {{"generation", generation_}, {"slots", group_}, {"world", group_.size()},
                                {"from_step", checkpoint ? checkpoint->step : 0}, {"reason", reason},
                                {"at_s", elapsed_s()}});
  spdlog::info("[launcher] generation {}: {} workers (slots {}) from step {} ({})",
               static_cast<long long>(generation_), group_.size(), join_slots(group_),
               static_cast<long long>(checkpoint ? checkpoint->step : 0), reason);
}

// Every group member exits (SIGKILL after `grace`).
void CollectiveRun::wait_group(std::chrono::seconds grace) {
  std::vector<Child> members;
  for (int s : group_) members.push_back(children_[s]);
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline && StopSignals::first() == 0 &&
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
  for (const auto& c : members) children_[c.learner] = c;
  group_.clear();
}

// Slot s died: out of the group until its restart delay has passed.
void CollectiveRun::hold_out(int s) {
  down_[s] = true;
  const double delay = injector_.restart_delay(children_[s], config_.run.restart_delay_s);
  back_at_[s] = delay < 0 ? Clock::time_point::max()
                          : children_[s].died_at + std::chrono::duration_cast<Clock::duration>(
                                                       std::chrono::duration<double>(std::min(delay, 1e7)));
}

// A plan kill that landed while the launcher was stopping the group was reaped as one of the launcher's own
// stops: it still holds its slot out for the plan's delay.
void CollectiveRun::hold_out_planned_kills(const std::vector<int>& members) {
  for (int s : members) {
    if (down_[s] || !injector_.planned_kill(children_[s])) continue;
    events_.emit("worker_failed", {{"slot", s}, {"exit", describe_exit(children_[s])}, {"planned", true},
                                   {"generation", generation_}, {"at_s", elapsed_s()}});
    ++failures_;
    hold_out(s);
  }
}

void CollectiveRun::bring_back(const std::vector<int>& returning) {
  for (int s : returning) {
    down_[s] = false;
    injector_.restarted(children_[s]);
  }
}

void CollectiveRun::start() {
  form("start");
  events_.emit("started", {{"mode", config_.diloco.mode}, {"workers", M_}, {"worker_threads", worker_threads_},
                           {"recovery", recovery_}, {"faults_planned", faults_.size()}});
  spdlog::info("[launcher] run {}: {} with {} workers × {} BLAS threads (Gloo), recovery \"{}\"; logs in {}",
               config_.run.name, to_string(config_.diloco.mode), M_, worker_threads_, to_string(recovery_),
               (run_dir_ / "logs").string());
}

// Until a signal, the run's end or a failure the policy cannot recover from.
void CollectiveRun::supervise() {
  while (StopSignals::first() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (supervise_once() == Next::kStop) break;
  }
}

Next CollectiveRun::supervise_once() {
  reap(children_);
  if (!poll_status()) {
    failure_ = status_error_;
    return Next::kStop;
  }
  run_finished_ = last_.is_object() && last_.value("finished", false);
  injector_.tick(elapsed_s(), global_step(), run_finished_, children_);
  if (const Next next = handle_deaths(); next != Next::kGoOn) return next;
  if (run_finished_) return Next::kNextPass;
  if (const Next next = regroup(); next != Next::kGoOn) return next;
  progress_row();
  return Next::kGoOn;
}

// A member that died (not by a clean exit) takes the group down with it.
// Casualties (kPeerFailedExit: their collective failed because of another) re-form at once; the others are
// the failure, held out until their restart delay has passed.
Next CollectiveRun::handle_deaths() {
  std::vector<int> dead;
  bool all_exited = !group_.empty(), casualties = false;
  for (int s : group_) {
    all_exited &= children_[s].exited;
    if (!children_[s].exited || exited_cleanly(children_[s])) continue;
    const bool casualty = WIFEXITED(children_[s].status) && WEXITSTATUS(children_[s].status) == kPeerFailedExit;
    casualties |= casualty;
    if (!casualty) dead.push_back(s);
  }
  if (!group_.empty() && all_exited && dead.empty() && !casualties) return Next::kStop;  // finished (or every rank voted to stop)
  if (dead.empty() && !casualties) return Next::kGoOn;
  if (run_finished_) return Next::kStop;  // a worker died after the run finished: nothing to recover
  return stop_failed_group(dead);
}

Next CollectiveRun::stop_failed_group(const std::vector<int>& dead) {
  for (int s : dead) {
    events_.emit("worker_failed", {{"slot", s}, {"exit", describe_exit(children_[s])},
                                   {"planned", injector_.planned_kill(children_[s])}, {"generation", generation_},
                                   {"at_s", elapsed_s()}});
  }
  const int64_t at_step = global_step();
  const std::vector<int> members_before = group_;
  for (int s : group_) {
    if (!children_[s].exited) ::kill(children_[s].pid, SIGKILL);  // Gloo groups do not recover: stop them all
  }
  wait_group(std::chrono::seconds(10));
  events_.emit("group_stopped", {{"generation", generation_}, {"reason", "failure"}, {"at_step", at_step},
                                 {"at_s", elapsed_s()}});
  failures_ += static_cast<int>(dead.size());
  if (recovery_ == RecoveryPolicy::kStop) {
    const int s = dead.empty() ? 0 : dead[0];
    const std::string log = "logs/worker_" + std::to_string(s) + ".log";
    const std::string error = dead.empty() ? "" : last_error_line(run_dir_ / log);
    failure_ = dead.empty() ? std::string("a collective failed (a worker hung or passed run.collective_timeout_s)")
                            : children_[s].role + " " + describe_exit(children_[s]) +
                                  (error.empty() ? " (see " + log + ")" : ": " + error);
    return Next::kStop;
  }
  for (int s : dead) {
    hold_out(s);
    const std::string error = failed_by_itself(children_[s].status)
                                  ? last_error_line(run_dir_ / "logs" / ("worker_" + std::to_string(s) + ".log"))
                                  : "";
    spdlog::info("[launcher] worker {} died ({}{}{}) at step {}: {}", s, describe_exit(children_[s]),
                 error.empty() ? "" : ": ", error, static_cast<long long>(at_step),
                 recovery_ == RecoveryPolicy::kElastic ? "the others re-form without it from the newest checkpoint"
                 : "every worker waits for it, then all restart from the newest checkpoint");
  }
  hold_out_planned_kills(members_before);
  return Next::kGoOn;
}

// Slots due back: a new group when none runs, or (elastic) a grown one.
Next CollectiveRun::regroup() {
  std::vector<int> returning;
  for (int s = 0; s < M_; ++s) {
    if (down_[s] && Clock::now() >= back_at_[s] && injector_.restart_step_reached(children_[s], global_step())) {
      returning.push_back(s);
    }
  }
  if (group_.empty()) return form_when_allowed(returning);  // no group runs: form one when the policy allows
  if (recovery_ == RecoveryPolicy::kElastic && !returning.empty() &&
      std::none_of(group_.begin(), group_.end(), [&](int s) { return injector_.paused(children_[s]); })) {
    return grow(returning);
  }
  return Next::kGoOn;
}

Next CollectiveRun::form_when_allowed(const std::vector<int>& returning) {
  const bool any_down = std::count(down_.begin(), down_.end(), true) > static_cast<long>(returning.size());
  // Slots that will never be back (restart delay < 0): restart cannot go on without them, elastic without
  // any slot.
  // A plan's restart_at_step is reached only while a group trains: never while restart waits for every worker,
  // nor when every slot is down.
  int never = 0, up = 0, on_step = 0;
  for (int s = 0; s < M_; ++s) {
    never += down_[s] && back_at_[s] == Clock::time_point::max() ? 1 : 0;
    on_step += down_[s] && back_at_[s] != Clock::time_point::max() &&
                       !injector_.restart_step_reached(children_[s], global_step())
                   ? 1
                   : 0;
    up += down_[s] ? 0 : 1;
  }
  if (recovery_ == RecoveryPolicy::kRestart || (up == 0 && returning.empty())) never += on_step;
  if ((recovery_ == RecoveryPolicy::kRestart && never > 0) || (recovery_ == RecoveryPolicy::kElastic && never == M_)) {
    failure_ = std::to_string(never) + " worker(s) died and will not be restarted (restart delay < 0" +
               (on_step > 0 ? std::string(", or a plan's restart_at_step the global step cannot reach while no group "
                                          "trains")
                            : std::string()) +
               "): " +
               (recovery_ == RecoveryPolicy::kRestart ? "run.recovery = restart needs every worker" : "no worker is left");
    return Next::kStop;
  }
  const bool ready = recovery_ == RecoveryPolicy::kElastic ? (up > 0 || !returning.empty()) : !any_down;
  if (!ready) return Next::kNextPass;
  bring_back(returning);
  if (std::count(down_.begin(), down_.end(), false) == 0) return Next::kNextPass;
  // A group that keeps failing from the same checkpoint (a worker that crashes the same way every time, a
  // collective that always times out) is not re-formed forever.
  const auto newest = latest_checkpoint(run_dir_);
  const int64_t from = newest ? newest->step : 0;
  same_checkpoint_failures_ = from == last_failed_from_ ? same_checkpoint_failures_ + 1 : 1;
  last_failed_from_ = from;
  if (same_checkpoint_failures_ > kMaxFailuresFromOneCheckpoint) {
    failure_ = "the group failed " + std::to_string(kMaxFailuresFromOneCheckpoint) +
               " times in a row from the checkpoint at step " + std::to_string(from) + " (see logs/worker_*.log)";
    return Next::kStop;
  }
  form(returning.empty() ? "failure" : "rejoin");
  return Next::kGoOn;
}

// Grow (not while a member is paused: it could not vote): the group stops after a step all ranks voted
// for, rank 0 checkpoints it, and it re-forms with the returning slots.
Next CollectiveRun::grow(const std::vector<int>& returning) {
  const int64_t at_step = global_step();
  const std::vector<int> members_before = group_;
  for (int s : group_) {
    if (!children_[s].exited) ::kill(children_[s].pid, SIGTERM);
  }
  wait_group(std::chrono::seconds(static_cast<int64_t>(config_.run.collective_timeout_s) + 30));
  events_.emit("group_stopped", {{"generation", generation_}, {"reason", "grow"}, {"at_step", at_step},
                                 {"at_s", elapsed_s()}});
  hold_out_planned_kills(members_before);  // a plan kill that landed while the group was stopping
  if (!poll_status()) {
    failure_ = status_error_;
    return Next::kStop;
  }
  if (last_.is_object() && last_.value("finished", false)) return Next::kStop;
  bring_back(returning);
  form("rejoin");
  return Next::kGoOn;
}

// One console row and one progress event per report interval, and after each new evaluation.
void CollectiveRun::progress_row() {
  if (last_.is_null()) return;
  const int64_t eval_step = last_.value("last_eval_step", int64_t{-1});
  if (Clock::now() - last_row_ <= std::chrono::duration<double>(config_.run.report_interval_s) &&
      eval_step <= last_eval_printed_) {
    return;
  }
  last_row_ = Clock::now();
  last_eval_printed_ = eval_step;
  const double frac = last_.value("tokens_trained", 0.0) / std::max(1.0, last_.value("tokens_budget", 1.0));
  char val[32] = "  -  ";
  if (last_["val_loss"].is_number()) std::snprintf(val, sizeof(val), "%.3f", last_["val_loss"].get<double>());
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  spdlog::info("{} {:3.0f}% t {:5} | val {} | syncs {:5} | waiting {:5.1f}s | workers {}/{} | tok/s per worker {:.0f} | {:4.0f}s",
               progress_bar(frac), 100 * frac, static_cast<long long>(last_.value("global_step", 0)), val,
               static_cast<long long>(last_.value("syncs", 0)), last_.value("wait_s", 0.0), group_.size(), M_,
               last_.value("tokens_per_s", 0.0), elapsed);
  events_.emit("progress", {{"global_step", last_.value("global_step", 0)}, {"tokens", last_.value("tokens_trained", 0)},
                            {"syncs", last_.value("syncs", 0)}, {"val_loss", last_["val_loss"]},
                            {"world", group_.size()}});
}

// Says why the run is ending, waits for the workers (a minute when they finish on their own), then stops them.
void CollectiveRun::stop_workers() {
  injector_.release(children_, elapsed_s());
  if (!failure_.empty() && !status_error_.empty()) {
    spdlog::info("[launcher] {}: stopping the workers", failure_);
  } else if (!failure_.empty()) {
    spdlog::info("[launcher] {}: stopped the other workers (synchronous training needs all {}; run.recovery = "
                 "\"restart\" or \"elastic\" re-forms the group)", failure_, M_);
  }
  if (StopSignals::first() != 0) {
    spdlog::info("[launcher] signal {}: stopping every worker; rank 0 writes a checkpoint (a second Ctrl-C stops at "
                 "once)", StopSignals::first());
  }
  const auto wait_until = Clock::now() + std::chrono::seconds(failure_.empty() && StopSignals::first() == 0 ? 60 : 1);
  while (Clock::now() < wait_until && !StopSignals::hurry()) {
    reap(children_);
    if (std::all_of(children_.begin(), children_.end(), [](const Child& c) { return c.exited; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop_children(children_, std::chrono::seconds(30), [] { return StopSignals::hurry(); });
}

// The report's fields that do not depend on who started the workers: from rank 0's last status (`status`, null if
// none), the workers' event logs and the final evaluation (skipped for `skip_reason`).
nlohmann::json common_report(const Config& config, const fs::path& run_dir, int M, const nlohmann::json& status,
                             const std::string& failure, double wall, int cores, const std::string& skip_reason) {
  const bool finished = status.is_object() && status.value("finished", false) && failure.empty();
  const nlohmann::json final_eval = final_evaluation(config, cores, skip_reason);
  const nlohmann::json last = status.is_object() ? status : nlohmann::json::object();
  const auto workers = worker_summaries(run_dir, M);
  nlohmann::json bytes = nlohmann::json::object();
  for (const auto& w : workers) {
    const int64_t sent = w.value("bytes_sent", int64_t{0});
    bytes["worker_" + std::to_string(w["rank"].get<int>())] = {{"sent", sent}, {"received", sent}};  // ring: symmetric
  }
  const int64_t tokens = last.value("tokens_trained", int64_t{0});
  nlohmann::json report = {
      {"run", config.run.name}, {"mode", config.diloco.mode},
      {"status", run_status(config, !finished, failure, tokens)},
      {"final_val_loss", final_eval["val_loss"]}, {"final_val_perplexity", final_eval["val_perplexity"]},
      {"global_step", last.value("global_step", 0)}, {"steps", last.value("global_step", 0)},
      {"syncs", last.value("syncs", 0)}, {"wait_seconds_rank0", last.value("wait_s", 0.0)},
      {"eval_seconds", last.value("eval_s", 0.0)}, {"tokens_trained", tokens},
      {"tokens_budget", config.train.total_tokens}, {"tokens_complete", config.complete_tokens()},
      {"wall_seconds", wall}, {"tokens_per_second", tokens / std::max(wall, 1e-9)},
      {"workers", workers}, {"checkpoint", final_eval["checkpoint"]}, {"sample", final_eval["sample"]},
      {"bytes", bytes},
      {"signal", finished ? 0 : StopSignals::first()},  // a signal after the last step stopped nothing
  };
  if (!failure.empty()) report["failure"] = failure;
  if (final_eval.contains("skipped")) report["final_eval_skipped"] = final_eval["skipped"];
  return report;
}

// The final evaluation (none when no checkpoint was written or a second signal asked to hurry) and
// run_dir/report.json. Throws InputError for a status.json of another version.
nlohmann::json CollectiveRun::report(int cores) {
  poll_status();
  if (!status_error_.empty()) throw InputError(status_error_);
  // A resumed run's report covers the whole run: the wall time of the parts before is added (the workers carry
  // the syncs and waits on in their checkpoints).
  const nlohmann::json w0 = prior_.is_object() ? prior_.value("wall_seconds", nlohmann::json()) : nlohmann::json();
  const double before_s = w0.is_number() ? std::max(0.0, w0.get<double>()) : 0.0;
  const double wall = before_s + std::chrono::duration<double>(Clock::now() - started_).count();
  nlohmann::json report = common_report(config_, run_dir_, M_, last_, failure_, wall, cores,
                                        final_eval_skip_reason(StopSignals::hurry(), failure_));
  report["recovery"] = recovery_;
  report["generations"] = generation_ + 1;
  report["worker_failures"] = failures_;
  report["faults_injected"] = injector_.injected();
  int restarts = 0;
  for (const auto& c : children_) restarts += c.restarts;
  report["worker_restarts"] = restarts;
  write_file_atomically(run_dir_ / "report.json", report.dump(2) + "\n");
  events_.emit("finished", {{"status", report["status"]}, {"val_loss", report["final_val_loss"]}});
  return report;
}

void check_collective_run(const Config& config, bool resume, const FaultPlan* plan) {
  const fs::path run_dir = config.run_dir();
  if (resume && !resumable_checkpoint(config)) {
    throw InputError("cannot resume: '" + run_dir.string() + "' has no checkpoint" +
                     (config.diloco.mode == Mode::kDp ? "" : " with every worker's state") +
                     " (one is written when the run is stopped with Ctrl-C, and every train.checkpoint_interval "
                     "steps; a second Ctrl-C or a kill writes none)");
  }
  if (!resume && (latest_checkpoint(run_dir) || fs::exists(run_dir / "status.json"))) {
    throw InputError("run folder '" + run_dir.string() + "' already holds a run: continue it with --resume " +
                     run_dir.string() + ", or pick another run.name");
  }
  if (plan != nullptr && config.diloco.mode != Mode::kDp) {
    throw InputError(std::string("a fault plan needs diloco.mode = \"dp\" among the baselines (got \"") + to_string(config.diloco.mode) + "\")");
  }
}

}  // namespace

nlohmann::json write_worker_report(const Config& config, const fs::path& run_dir, int world, double wall_s, int cores) {
  try {
    Config c = config;  // the final evaluation reads the newest checkpoint of c.run_dir()
    c.run.out_dir = run_dir.parent_path().string();
    c.run.name = run_dir.filename().string();
    const nlohmann::json status = read_worker_status(run_dir / "status.json");
    nlohmann::json report = common_report(c, run_dir, world, status, "", wall_s, cores, "");
    report["run"] = config.run.name;
    report["written_by"] = "worker 0";
    report["recovery"] = "none (started by hand)";
    report["generations"] = 1;
    nlohmann::json unreported = nlohmann::json::array();  // workers whose "stopped" rank 0 cannot read
    for (const auto& w : report["workers"]) {
      if (!w.contains("steps")) unreported.push_back(w["rank"]);
    }
    if (!unreported.empty()) {
      report["workers_unreported"] = unreported;
      spdlog::warn("[worker 0] the report lacks workers {}: no \"stopped\" record in {} (each worker writes its events "
                   "into its own run folder: put run.out_dir on a filesystem every machine sees)",
                   unreported.dump(), (run_dir / "events").string());
    }
    write_file_atomically(run_dir / "report.json", report.dump(2) + "\n");
    return report;
  } catch (const std::exception& e) {
    throw InputError("training finished and rank 0 saved its checkpoint, but the report could not be written: " +
                     std::string(e.what()));
  }
}

nlohmann::json run_collective_launcher(const Config& config, bool resume, const FaultPlan* plan) {
  const auto started = Clock::now();
  check_collective_run(config, resume, plan);
  nlohmann::json prior;
  if (resume) {  // a finished run stays as it is; a stopped one goes on from its newest checkpoint
    auto previous = try_read_json_file(config.run_dir() / "report.json").value_or(nullptr);
    if (previous.is_object() && previous.contains("status") && previous["status"] == "finished") {
      spdlog::info("[launcher] run {} already finished (report {}): nothing to resume, nothing changed",
                   config.run.name, (config.run_dir() / "report.json").string());
      previous["already_finished"] = true;
      return previous;
    }
    prior = std::move(previous);
  }
  const RunFolder folder = prepare_run_folder(config);
  const StopSignals signals;
  CollectiveRun run(config, folder, plan, started, resume, std::move(prior));
  run.start();
  run.supervise();
  run.stop_workers();
  return run.report(folder.cores);
}

}  // namespace dloco
