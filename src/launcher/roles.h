// Entry points of the distributed roles, each run as its own process (torch-free header for src/apps):
// the syncer, a learner, the evaluator, and the launcher that starts them all on one machine.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/config.h"
#include "chaos/fault_plan.h"

namespace dloco {

struct SyncerOptions {
  std::filesystem::path run_dir;       // run folder: events, syncer/ persistence, checkpoints
  std::string address;                 // listen address, e.g. "0.0.0.0:7070"; port 0 picks a free port
  std::filesystem::path address_file;  // if set, the bound "host:port" is written here (atomically)
};

/// Runs the syncer until the run is finished (then writes the final checkpoint) or SIGTERM/SIGINT (then
/// persists and checkpoints). Returns the process exit code. Throws InputError on bad set-up (cannot listen,
/// missing tokenizer).
int run_syncer(const Config& config, const SyncerOptions& options);

struct LearnerOptions {
  std::string syncer;                  // "host:port"
  int id = 0;                          // learner slot, 0 ≤ id < M
  std::filesystem::path run_dir;       // where its events go (run_dir/events/learner_<id>.jsonl)
  double bootstrap_timeout_s = 120;    // how long to try to reach the syncer before giving up
};

/// Runs one learner: bootstrap from the syncer (blocking, with a deadline), then train without ever waiting on
/// the network until the syncer says stop. Returns the exit code; a refused handshake throws InputError with
/// the syncer's reason.
int run_learner(const Config& config, const LearnerOptions& options);

/// Runs the evaluator: evaluates consistent snapshots of the global model every train.eval_interval global
/// steps at low priority and reports them to the syncer, until the run is finished.
int run_evaluator(const Config& config, const LearnerOptions& options);

struct WorkerOptions {
  std::filesystem::path run_dir;     // events/worker_<slot>.jsonl; rank 0 also status.json and checkpoints
  int rank = 0;                      // 0 ≤ rank < world
  std::filesystem::path store_file;  // c10d FileStore rendezvous file, the same for every rank of the group
  std::string hostname = "127.0.0.1";  // address Gloo binds (loopback on one machine)
  // dp with run.recovery = restart | elastic: the group of one generation (the launcher re-forms it after a failure).
  std::vector<int> slots;            // learner slot (data stream) of each rank; world = slots.size(); empty = 0…M−1
  int64_t generation = 0;            // how many times the group was formed before this one
  std::filesystem::path resume_from; // checkpoint (model, AdamW, every slot's cursor) to start from; empty = Θ0
};

/// Runs one worker of a baseline (diloco.mode = "dp", "diloco" or "streaming"; spec §11): joins the Gloo group
/// (deadline run.collective_timeout_s), trains its share of the token budget in lock-step with the others and
/// returns 0. Throws InputError on bad set-up; returns kPeerFailedExit when a peer dies or a collective passes its
/// deadline (synchronous training cannot go on without every worker).
/// dp trains until the whole group's tokens reach train.total_tokens (W = world workers add W·B·T·accum tokens
/// per step), starting from `resume_from` if given; rank 0 checkpoints the model, the AdamW state and every
/// slot's data cursor every train.checkpoint_interval steps. SIGTERM on any rank stops every rank after the same
/// step (the stop is voted in that step's all-reduce) and rank 0 checkpoints it: the elastic launcher's way to
/// re-form the group without losing work.
int run_worker(const Config& config, const WorkerOptions& options);

/// Exit status of a worker whose collective failed because a peer died or passed its deadline (the launcher
/// tells these casualties apart from the worker that failed first: only that one is held out of the group).
inline constexpr int kPeerFailedExit = 3;

/// `dloco train` for the baselines: starts M workers as child processes on this machine, shows progress from
/// rank 0's status file, and ends with the same report as the decoupled launcher (console and
/// run_dir/report.json). When a worker dies, run.recovery decides (dp only for the last two):
///   "stop"     every worker is stopped and the run ends (what synchronous training does);
///   "restart"  every worker is stopped; once the dead one's restart delay has passed, all M start again from the
///              newest checkpoint (model, AdamW state, cursors);
///   "elastic"  every worker is stopped and the survivors re-form at once from the newest checkpoint; when the
///              dead worker is back, the group stops after a voted step (rank 0 checkpoints it) and re-forms with
///              it. Every formation and stop is an event in events/launcher.jsonl ("group_formed",
///              "group_stopped", "worker_failed").
/// A fault `plan` is carried out as in run_launcher (kill_syncer is skipped: there is no syncer). The restart
/// delay of a death the plan did not cause is run.restart_delay_s (< 0 = never). Throws InputError on bad set-up.
nlohmann::json run_collective_launcher(const Config& config, bool resume, const FaultPlan* plan = nullptr);

/// `dloco train` for diloco.mode = "decoupled": starts the syncer, the evaluator and M learners as child
/// processes on this machine, shows progress, restarts learners that die (after run.restart_delay_s), and ends
/// with the report (console and run_dir/report.json). SIGTERM/SIGINT stop every child cleanly.
/// With a fault `plan` (chaos runs), carries it out: times count from the moment the learners are started;
/// killed processes are restarted after the fault's restart_after_s (the syncer on the same address, from its
/// persisted state); every fault is an event in run_dir/events/launcher.jsonl, and run_dir/plan.json holds the
/// resolved plan. Throws InputError if the plan names a learner slot ≥ M.
nlohmann::json run_launcher(const Config& config, bool resume, const FaultPlan* plan = nullptr);

}  // namespace dloco
