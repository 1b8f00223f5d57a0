// The chaos report of a baselines run (dp under run.recovery = restart | elastic): what chaos/chaos_report.h's
// analysis is for the decoupled mode, read from the launcher's and the workers' events. Torch-free.
#pragma once

#include <filesystem>

#include "chaos/chaos_report.h"

namespace dloco {

/// The same measures for a dp run under a plan (run.recovery = restart | elastic), from events/launcher.jsonl
/// ("group_formed" with each generation's checkpoint step) and events/worker_<slot>.jsonl ("joined", "step"):
///   window        launcher "started" -> the last step of any worker
///   nominal step  trimmed mean of step intervals within generations of all M workers
///   kept steps    a slot's step n of generation g is kept unless a later generation resumed from a checkpoint
///                 before n (the work was rolled back); goodput = Σ kept · nominal step / (M · window)
///   uptime        fraction of 5 s bins in which kept group steps reach half of bin / nominal step
///   recovery      a kill -> the slot's next "joined" (back) -> its first step after that (contributing)
///   pauses        GroupPause per stop of the group
/// Exact-data and fragment checks do not apply (rolled-back batches are trained again by design).
/// Throws InputError if the launcher's log or its "started" event is missing.
ChaosAnalysis analyze_dp_chaos_run(const std::filesystem::path& run_dir, const ChaosRunShape& shape);

}  // namespace dloco
