// Entry points of the distributed roles, each run as its own process (torch-free header for src/apps):
// the syncer, a learner, the evaluator, and the launcher that starts them all on one machine.
#pragma once

#include <filesystem>
#include <string>

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
  std::filesystem::path run_dir;     // events/worker_<rank>.jsonl; rank 0 also status.json and checkpoints
  int rank = 0;                      // 0 ≤ rank < M
  std::filesystem::path store_file;  // c10d FileStore rendezvous file, the same for every rank of the group
  std::string hostname = "127.0.0.1";  // address Gloo binds (loopback on one machine)
};

/// Runs one worker of a baseline (diloco.mode = "dp", "diloco" or "streaming"; spec §11): joins the Gloo group
/// (deadline run.collective_timeout_s), trains its share of the token budget in lock-step with the others and
/// returns 0. Throws InputError on bad set-up, CollectiveError when a peer dies or a collective passes its
/// deadline (synchronous training cannot go on without every worker).
int run_worker(const Config& config, const WorkerOptions& options);

/// `dloco train` for the baselines: starts M workers as child processes on this machine, shows progress from
/// rank 0's status file, stops every worker when one fails (what synchronous training does), and ends with the
/// same report as the decoupled launcher (console and run_dir/report.json).
nlohmann::json run_collective_launcher(const Config& config, bool resume);

/// `dloco train` for diloco.mode = "decoupled": starts the syncer, the evaluator and M learners as child
/// processes on this machine, shows progress, restarts learners that die (after run.restart_delay_s), and ends
/// with the report (console and run_dir/report.json). SIGTERM/SIGINT stop every child cleanly.
/// With a fault `plan` (chaos runs), carries it out: times count from the moment the learners are started;
/// killed processes are restarted after the fault's restart_after_s (the syncer on the same address, from its
/// persisted state); every fault is an event in run_dir/events/launcher.jsonl, and run_dir/plan.json holds the
/// resolved plan. Throws InputError if the plan names a learner slot ≥ M.
nlohmann::json run_launcher(const Config& config, bool resume, const FaultPlan* plan = nullptr);

}  // namespace dloco
