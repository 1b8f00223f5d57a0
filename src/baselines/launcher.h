// `dloco train` for the baselines (dp, diloco, streaming) on one machine: M workers in one Gloo group, with fault
// plans for chaos runs. The decoupled launcher is launcher/launcher.h.
#pragma once

#include <nlohmann/json.hpp>

#include "chaos/fault_plan.h"
#include "core/config.h"

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

}  // namespace dloco
