// `dloco train` on one machine: the launchers of a decoupled run (syncer, evaluator, learners) and of the
// baselines (M workers), with fault plans for chaos runs.
#pragma once

#include <nlohmann/json.hpp>

#include "chaos/fault_plan.h"
#include "core/check.h"
#include "core/config.h"
#include "transport/transport.h"

namespace dloco {

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
nlohmann::json run_launcher(const Config& config, bool resume, wire::Transport& transport,
                            const FaultPlan* plan = nullptr);

}  // namespace dloco
