// `dloco train` on one machine for a decoupled run (syncer, evaluator, learners), with fault plans for chaos runs.
// The baselines' launcher is baselines/launcher.h; SkipPipe's, skippipe/launcher.h.
#pragma once

#include <nlohmann/json.hpp>

#include "chaos/fault_plan.h"
#include "core/check.h"
#include "core/config.h"
#include "transport/transport.h"

namespace dloco {

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
