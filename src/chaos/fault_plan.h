// Fault plans for chaos runs (the chaos issue; docs/protocol.md §7): a list of faults to inject into a
// real run, each at a time (seconds since the learners were started) or at a global step, written as TOML
// (plans/*.toml) or built in C++ with FaultPlanBuilder, plus random learner failures drawn from a mean time
// between failures with a seed. The launcher carries the plan out (launcher.cc); `dloco chaos` reports on it.
// A fault that lasts (pause, slow, cut, delay) ends after duration_s, or when the global step reaches until_step,
// or at whichever of the two comes first when both are given. Tests trigger and end faults at steps: a wall-clock
// plan fires at a different point of a run sized in tokens on every machine (and after its end on a fast one).
//
// A plan file:
//   [plan]
//   name = "mixed"
//   [[fault]]                        # one table per fault, in any order
//   at_s = 60                        # or at_step = 300 (global step); exactly one of the two
//   action = "kill_learner"          # kill_learner | pause_learner | slow_learner | kill_syncer | cut_link |
//                                    # delay_link | add_learner | leave_learner
//   learner = 2                      # kill/pause/slow: the learner slot
//   restart_after_s = 5              # kill_*: restart the process after this delay; < 0 = never
//   [[fault]]
//   at_step = 100
//   action = "kill_learner"          # a kill whose restart is bounded in steps: the learner (or dp worker) comes
//   learner = 1                      # back once the global step, which the others move on, reaches restart_at_step
//   restart_at_step = 160            # (> at_step); not for kill_syncer, nor dp with run.recovery = restart, where
//                                    # the step cannot move while the process is down
//   [[fault]]
//   at_s = 120
//   action = "pause_learner"         # SIGSTOP, then SIGCONT after duration_s: a straggler that stops dead
//   learner = 1
//   duration_s = 20
//   [[fault]]
//   at_step = 100
//   action = "pause_learner"         # a pause bounded in steps: SIGCONT once the global step (the others' progress)
//   learner = 1                      # reaches until_step (> at_step); duration_s, if also given, caps it in
//   until_step = 140                 # seconds (so a run whose step stops advancing is not paused for ever)
//   duration_s = 60
//   [[fault]]
//   at_s = 200
//   action = "slow_learner"          # every step takes `factor` times as long for duration_s
//   learner = 3
//   factor = 2.0
//   duration_s = 60
//   [[fault]]
//   at_s = 300
//   action = "cut_link"              # the learner's link to the syncer carries nothing for duration_s (a partition:
//   learner = 0                      # silence, not a reset; both sides' deadlines fire), then works again
//   duration_s = 10
//   [[fault]]
//   at_s = 400
//   action = "delay_link"            # every byte on the link waits delay_ms more, each way, for duration_s
//   learner = 1
//   delay_ms = 200
//   duration_s = 30
//   [[fault]]
//   at_s = 500
//   action = "add_learner"           # scavenging: a learner with a new id (≥ M) joins the running job; it leases
//   learner = 4                      # a free data stream (data.streams > M, or one a dead learner left)
//   [[fault]]
//   at_s = 600
//   action = "leave_learner"         # SIGTERM: the learner leaves gracefully (the syncer frees its stream and
//   learner = 4                      # quorum at once) and is not restarted
//   [random]                         # optional: learner kills at exponential gaps (a Poisson process)
//   mtbf_s = 60                      # mean time between two learner failures, whole run (cluster MTBF)
//   restart_after_s = 5
//   start_s = 30                     # no random failure before this time ...
//   end_s = 1100                     # ... or after this one
//   seed = 1
// Deliberately not here: signals and processes (the launcher), the analysis (chaos_report.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco {

enum class FaultAction {
  kKillLearner,
  kPauseLearner,
  kSlowLearner,
  kKillSyncer,
  kCutLink,
  kDelayLink,
  kAddLearner,    // scavenging: start a learner with a new id (decoupled runs only)
  kLeaveLearner,  // SIGTERM: a graceful leave, never restarted
};

/// "kill_learner", "pause_learner", "slow_learner", "kill_syncer", "cut_link", "delay_link", "add_learner",
/// "leave_learner".
const char* to_string(FaultAction action);
/// Inverse of to_string; throws InputError listing the valid names.
FaultAction parse_fault_action(std::string_view name);
/// True for the faults that last (pause, slow, cut_link, delay_link): they end after duration_s or at until_step.
bool fault_lasts(FaultAction action);

/// One fault. Exactly one trigger is set: at_s ≥ 0 (seconds since the learners started) or at_step ≥ 0 (the
/// first moment the syncer's global step reaches it).
struct FaultEvent {
  double at_s = -1;
  int64_t at_step = -1;
  FaultAction action = FaultAction::kKillLearner;
  int learner = -1;              // every action but kill_syncer: the learner id, 0 ≤ learner < M or an id an
                                 // add_learner of the plan starts (add_learner: a new id ≥ M)
  double restart_after_s = 5.0;  // kill_*: seconds until the process is started again; < 0 = never
  int64_t restart_at_step = -1;  // kill_learner: start it again once the global step (the others' progress) reaches
                                 // this step (> at_step), and no sooner than restart_after_s (0 unless given)
  double duration_s = 0;         // pause/slow/cut_link/delay_link: seconds the fault lasts (0 = until_step alone)
  int64_t until_step = -1;       // pause/slow/cut_link/delay_link: the fault ends when the global step reaches it
                                 // (-1 = duration_s alone); with both, whichever comes first
  double factor = 1.0;           // slow: step-time multiplier (> 1)
  double delay_ms = 0;           // delay_link: latency added to each direction, milliseconds
  bool random = false;           // drawn from [random] rather than written out

  nlohmann::json to_json() const;
  /// "kill learner 2 at 60 s (restart after 5 s)"
  std::string describe() const;
};

/// Random learner failures: kills at exponential gaps of mean `mtbf_s` in [start_s, end_s), each of a slot drawn
/// uniformly, restarted after restart_after_s. Deterministic for a given seed.
struct RandomFaults {
  double mtbf_s = 0;  // 0 = no random faults
  double restart_after_s = 5.0;
  double start_s = 0;
  double end_s = 0;
  uint64_t seed = 1;
};

struct FaultPlan {
  std::string name = "plan";
  std::vector<FaultEvent> events;  // written-out faults
  RandomFaults random;

  /// Every fault the run will see: the written-out ones plus the random draws for M learners, sorted by time
  /// (time triggers first by at_s, then step triggers by at_step). Throws InputError if a fault names a learner
  /// that is neither one of the M slots nor added by the plan, or an add_learner names one of the M slots or an id
  /// added twice.
  std::vector<FaultEvent> resolve(int learners) const;
  /// The plan as JSON, random faults drawn for M learners (for the run folder and the simulator).
  nlohmann::json to_json(int learners) const;
  /// Throws InputError naming the first bad fault (no trigger or two, missing learner, factor ≤ 1, a lasting fault
  /// with neither duration_s > 0 nor until_step, until_step ≤ at_step or on a fault that does not last, ...).
  void validate() const;
};

/// Reads a plan file (format above). Throws InputError for a missing file, a TOML syntax error, an unknown key
/// or action, or a bad value, naming the file and the fault.
FaultPlan load_fault_plan(const std::filesystem::path& path);
/// Same, from TOML text; `origin` names it in errors.
FaultPlan parse_fault_plan(std::string_view toml_text, const std::string& origin);

/// A plan in C++ (tests, examples):
///   FaultPlan plan = FaultPlanBuilder("kill-twice").at_s(10).kill_learner(1, 2.0).at_step(200).kill_syncer(3.0)
///                        .at_s(30).pause_learner(0, 5.0).at_step(300).until_step(340).pause_learner(1, 60).build();
/// Each action uses the trigger set by the last at_s/at_step, and the end set by the last until_step (at_s and
/// at_step clear it). build() validates (InputError).
class FaultPlanBuilder {
 public:
  explicit FaultPlanBuilder(std::string name = "plan");
  FaultPlanBuilder& at_s(double seconds);
  FaultPlanBuilder& at_step(int64_t global_step);
  /// The next lasting faults end when the global step reaches `global_step` (their duration_s, if > 0, caps it).
  FaultPlanBuilder& until_step(int64_t global_step);
  FaultPlanBuilder& kill_learner(int learner, double restart_after_s = 5.0);
  FaultPlanBuilder& pause_learner(int learner, double duration_s);
  FaultPlanBuilder& slow_learner(int learner, double factor, double duration_s);
  FaultPlanBuilder& kill_syncer(double restart_after_s = 5.0);
  FaultPlanBuilder& cut_link(int learner, double duration_s);
  FaultPlanBuilder& delay_link(int learner, double delay_ms, double duration_s);
  FaultPlanBuilder& add_learner(int learner);
  FaultPlanBuilder& leave_learner(int learner);
  FaultPlanBuilder& random_kills(double mtbf_s, double start_s, double end_s, uint64_t seed,
                                 double restart_after_s = 5.0);
  FaultPlan build() const;

 private:
  FaultPlanBuilder& add(FaultEvent event);
  FaultPlan plan_;
  double at_s_ = -1;
  int64_t at_step_ = -1;
  int64_t until_step_ = -1;
};

}  // namespace dloco
