// `dloco train` for the baselines (dp, diloco, streaming) on one machine: M workers in one Gloo group, with fault
// plans for chaos runs. The decoupled launcher is launcher/launcher.h.
#pragma once

#include <filesystem>

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

/// The report of a baseline run whose `world` workers were started by hand (`dloco worker`, e.g. under srun; no
/// launcher), written by its rank 0 once every worker has stopped: the launcher's report fields from rank 0's
/// status.json and the workers' event logs in `run_dir`, the newest checkpoint there evaluated on `cores` threads,
/// `wall_s` the run's seconds, "written_by": "worker 0", and "workers_unreported" (warned) for workers whose events
/// it cannot read. Writes run_dir/report.json and returns it. Throws InputError, saying training finished, when the
/// report cannot be made (a status.json of another version, a write error); no valid checkpoint: the evaluation is
/// skipped, with the reason.
nlohmann::json write_worker_report(const Config& config, const std::filesystem::path& run_dir, int world,
                                   double wall_s, int cores);

}  // namespace dloco
