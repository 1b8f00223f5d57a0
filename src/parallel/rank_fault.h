// A chaos hook for learner groups (docs/parallel.md "Failures"): a rank that dies at a chosen point of a step, to
// measure how fast the rest of its group notices. The fault plans (docs/chaos.md) kill processes from outside at a
// step; a point inside a step (a forward, a backward, the gradient reduction, the optimizer step) can only be hit
// from inside. Off unless the environment sets it:
//   DLOCO_RANK_FAULT="RANK:POINT:STEP:FILE[:stop]"
// makes group rank RANK SIGKILL itself (with ":stop", SIGSTOP: a rank that hangs) when it reaches POINT (forward |
// backward | reduce | optimizer) during its STEP-th engine step (counted from 1 in this process), once per FILE: it
// first writes the wall-clock time (Unix seconds) to FILE, and never fires while FILE exists, so the restarted group
// trains on. A malformed value is reported on stderr once and ignored (a chaos hook never stops a run by itself).
// Only pipeline and TP × DP groups (parallel/pipeline_engine.cc) have the points.
// Deliberately not here: deciding what the survivors do (the group's collectives fail; learner/group_inner_job.h).
#pragma once

namespace dloco {

/// An engine step of group rank `rank` begins (the STEP count of DLOCO_RANK_FAULT).
void rank_fault_step(int rank);
/// POINT of the current step: kills this process if DLOCO_RANK_FAULT names it (see above); otherwise returns.
void rank_fault_point(const char* point);

}  // namespace dloco
