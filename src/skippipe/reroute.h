// Routing a SkipPipe schedule around dead nodes (docs/skippipe.md "Re-routing around a dead node"; issue 13 part
// 4, beyond the reference, which has no run-time re-routing). Two steps, both deterministic:
//   reroute_around  the same micro-batches (same ids, same order, so the same data windows) with every dead node
//                   replaced: a dead path node by the surviving replica of its stage that has served the fewest of
//                   the schedule's micro-batches so far (ties: the lowest id), a dead data node by the surviving
//                   stage-0 node that has started the fewest; the placement loses the dead nodes. The iteration
//                   a node died in is re-run on this schedule: the same stages per micro-batch, so the same sums.
//   replan_around   the scheduler's new schedule for the survivors (scheduler.h, schedule_skippipe on the reduced
//                   placement, seed 1, the path length and swaps of the old one, the same micro-batches per iteration
//                   over the surviving data nodes when they divide them, else the old count per data node), for
//                   the iterations after; when the old schedule is not one the scheduler makes (paths of unequal
//                   length, or a full pipeline) or the scheduler finds none, the re-routed one, with the reason.
// Deliberately not here: a stage with no node left (its parameters died with it: refused, see reroute_around),
// nodes joining, when a node counts as dead (skippipe/launcher.h decides).
#pragma once

#include <set>
#include <string>

#include "skippipe/schedule.h"
#include "skippipe/setting.h"

namespace dloco::skippipe {

/// `schedule` with the nodes in `dead` routed around (see the file header); checked by the exact simulator.
/// Throws InputError when a stage has no surviving node (naming it) or the result deadlocks.
Schedule reroute_around(const Schedule& schedule, const Setting& setting, const std::set<int>& dead);

/// The scheduler's re-plan (see the file header) of `rerouted` (reroute_around's result) given the schedule it came
/// from. `why` (optional) says what was done: "re-planned by the scheduler: ..." or why the re-routed paths stay.
Schedule replan_around(const Schedule& rerouted, const Schedule& before, const Setting& setting, std::string* why);

}  // namespace dloco::skippipe
