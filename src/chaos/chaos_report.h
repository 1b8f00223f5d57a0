// What a chaos run measured (docs/protocol.md §7, "Goodput of a real run"), computed after the run from
// the run folder alone: the processes' event logs (events/*.jsonl), the data streams' logs (streams/*.jsonl) and
// the launcher's report. Nothing here trusts a process's own summary: a SIGKILLed learner writes none.
//
// Definitions (times are wall seconds; t = 0 when the launcher started the learners):
//   window W        from the launcher's "started" to the syncer's "final_flush" (every slot spent its tokens)
//                   or, failing that, its "finished".
//   nominal step    the mean interval between two consecutive steps of one learner process, over all
//                   learners, leaving out intervals longer than 3× the median (those hold a pause or a wait).
//   kept steps      a learner's step earns 1/P for each fragment p whose next answered pull from that learner
//                   was merged: Σ over the learner's "kept" events of steps / P.
//   goodput         Σ_m kept_m · nominal step / allocated slot-seconds: slot-seconds of kept training over
//                   slot-seconds allocated (dead, paused and restarting time included). Allocated = M · W, plus
//                   for each learner the plan added (add_learner) the time from its join to the end of W, minus
//                   for each graceful leave (leave_learner) the time from the leave to the end of W.
//   uptime          fraction of W, in bins of `bin_s`, whose merges reach half the expected rate
//                   P / (H · nominal step) merges per second (one fragment due every H/P global steps).
//   recovery time   a kill of a learner -> the first "kept" event of its next incarnation (contributing again).
//   syncer downtime a kill of the syncer -> its first "merged" event afterwards.
//   final copies    every learner whose last incarnation ran to the end (not killed for good, not left) reports
//                   the version and FNV-1a hash of each of its P fragments in its "stopped" event; each must equal
//                   the syncer's "final_state". All P of every such learner are compared, and a learner without
//                   a final report fails the check; learners killed for good or gone are counted apart.
//   link faults     from the launcher's "fault" to its "fault_ended" (a fault bounded by until_step ends there;
//                   without that event, after duration_s).
// Deliberately not here: running anything (the launcher, `dloco chaos`), the simulator.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco {

/// What the analysis needs to know about the run (from its resolved config).
struct ChaosRunShape {
  int learners = 1;              // M
  int fragments = 1;             // P
  int64_t inner_steps = 1;       // H
  int64_t tokens_per_batch = 1;  // B·T·grad_accum: how far a stream's cursor moves per step (one log record)
  double bin_s = 5.0;            // uptime bin width
};

struct LearnerTally {
  int id = 0;
  int64_t steps_trained = 0;   // "step" events of every incarnation
  double steps_kept = 0;       // Σ kept / P
  double steps_lost = 0;       // trained − kept
  int incarnations = 0;        // "bootstrapped" events
  int kills = 0;               // plan kills of this slot
  double joined_at_s = -1;     // added by the plan (scavenging): when; -1 = one of the M slots
  double left_at_s = -1;       // left gracefully (leave_learner): when; -1 = never
  std::string end = "finished";  // "finished" (its final copy is compared) | "killed" (for good) | "left"
};

struct Recovery {
  int learner = -1;            // -1: the syncer
  double killed_at_s = 0;
  double restart_after_s = 0;  // the plan's delay before the restart
  double back_s = -1;          // learner: bootstrapped again; syncer: listening again (-1 = never)
  double contributing_s = -1;  // learner: first kept answer; syncer: first merge (-1 = never)
};

/// A cut or delayed link (cut_link, delay_link): did the learner keep training, and when did its work count again.
struct LinkFault {
  int learner = 0;
  std::string action;          // "cut_link" | "delay_link"
  double at_s = 0;             // seconds since the start
  double duration_s = 0;
  int64_t steps_during = 0;    // the learner's steps while the fault lasted (it never waits on the network)
  double contributing_s = -1;  // the end of the fault -> the learner's first kept answer after it (-1 = never)
};

/// One stop of a synchronous dp group (run.recovery = restart | elastic) and how long training stood still.
struct GroupPause {
  int64_t generation = 0;         // the generation that stopped
  std::string reason;             // "failure" (a worker died) | "grow" (a worker came back)
  double stopped_at_s = 0;        // its last step, seconds since the start
  double pause_s = -1;            // its last step -> the next generation's first step (-1 = never resumed)
  int64_t rolled_back_steps = 0;  // its last step − the checkpoint step the next generation resumed from
  int world_after = 0;            // workers in the next generation
};

struct ChaosAnalysis {
  std::string mode = "decoupled";  // "decoupled" (analyze_chaos_run) | "dp" (analyze_dp_chaos_run)
  double window_s = 0;
  double nominal_step_s = 0;
  double goodput = 0;
  double uptime = 0;
  double slot_seconds = 0;               // allocated learner-seconds (goodput's denominator)
  int learners_added = 0;                // add_learner faults carried out
  int learners_left = 0;                 // leave_learner faults carried out
  std::vector<LearnerTally> learners;
  std::vector<Recovery> recoveries;      // learner kills, in time order
  std::vector<Recovery> syncer_downtime; // syncer kills
  std::vector<LinkFault> link_faults;    // cut and delayed links, in time order
  nlohmann::json faults = nlohmann::json::array();  // the launcher's "fault" events
  // Exact data
  int64_t batches = 0, duplicate_batches = 0, gaps = 0, skipped_tokens = 0;
  // Consistency
  bool nan_free = true;                  // no skipped (non-finite) step, finite final loss
  int64_t version_regressions = 0;       // an applied/bootstrapped version below one the slot already held
  int learners_finished = 0;             // learners whose last incarnation ran to the end: final copies expected
  int learners_gone = 0;                 // killed for good or left: no final copy to compare
  int fragments_expected = 0;            // learners_finished × P
  int fragments_checked = 0;             // (learner, fragment) pairs compared with the syncer's final_state
  int fragments_equal = 0;               // ... whose version and hash both equal the syncer's Θ_p
  std::vector<std::string> copy_mismatches;  // each pair that differs or was not compared, and why
  double final_val_loss = 0;
  int64_t torn_event_lines = 0;          // event-log lines cut off by a SIGKILL (skipped)
  // dp only
  int generations = 0;                   // times the group was formed
  std::vector<GroupPause> pauses;        // every stop of the group, in order
  bool lineage_ok = true;                // every generation resumed from a step already reached and then counted
                                         // its steps up from there one by one on every slot
  /// Every check passed: decoupled, every fragment of every finishing learner (at least one) compared and equal
  /// to Θ; dp, no NaN and a sound lineage.
  bool consistent() const {
    if (mode == "dp") return nan_free && lineage_ok;
    return nan_free && version_regressions == 0 && duplicate_batches == 0 && gaps == 0 && fragments_expected > 0 &&
           fragments_checked == fragments_expected && fragments_equal == fragments_checked;
  }
  nlohmann::json to_json() const;
};

/// Analyses the finished run in `run_dir`. Throws InputError if the folder lacks the launcher's or the syncer's
/// event log, or a log line is not JSON.
ChaosAnalysis analyze_chaos_run(const std::filesystem::path& run_dir, const ChaosRunShape& shape);


}  // namespace dloco
