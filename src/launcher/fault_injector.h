// Carries out a fault plan (chaos/fault_plan.h) against a launcher's children: both launchers use it, the
// decoupled one (learners and the syncer) and the baselines' one (dp workers, one per learner slot).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "chaos/fault_plan.h"
#include "chaos/link_proxy.h"
#include "process/children.h"
#include "process/events.h"

namespace dloco {

/// Fires the plan's faults at their time or global step, and ends the lasting ones (pause, slow, cut, delay) after
/// their duration_s or once the global step reaches their until_step, whichever comes first. Every fault it
/// injects, ends or skips is an event in events/launcher.jsonl ("fault", "fault_ended", "fault_skipped"): that
/// log, not this class, is what the chaos report reads. Targets are matched by Child::learner (the slot) or, for kill_syncer, by role "syncer"; link
/// faults act on the slot's LinkProxy (set_links), whether its learner is up or not.
class FaultInjector {
 public:
  FaultInjector(std::vector<FaultEvent> faults, const std::filesystem::path& run_dir, EventLog& events);

  /// Ends lasting faults that are over at `elapsed_s` or `global_step` (every one once `finished`) and, unless
  /// `finished`, fires every fault due at `elapsed_s` since the learners started or at `global_step` (time and
  /// step triggers independently). A fault whose target is not running is skipped ("fault_skipped", the reason);
  /// one whose target this plan has just killed (SIGKILL sent, its restart still to come) waits for the target's
  /// next incarnation: two kills due in one tick (a global step that jumped past both, e.g. after the syncer's
  /// restart) are two kills of two processes, not one process killed twice. (Not a leave_learner: one due while
  /// its learner is down makes it leave for good at once.)
  void tick(double elapsed_s, int64_t global_step, bool finished, std::vector<Child>& children);

  /// The learners' link proxies, indexed by slot (cut_link and delay_link act on them); without them those
  /// faults are skipped.
  void set_links(std::vector<LinkProxy*> links) { links_ = std::move(links); }
  /// Whether the launcher starts learners that join mid-run (decoupled: yes; dp's fixed group: no, add_learner
  /// and leave_learner are skipped there).
  void set_scavenging(bool on) { scavenging_ = on; }
  /// Ids of learners an add_learner fired for since the last call: the launcher starts them.
  std::vector<int> take_joins() { return std::exchange(joins_, {}); }
  /// True if `child` left by a leave_learner fault: it is not restarted.
  bool left(const Child& child) const { return left_.count(child.role) > 0; }

  /// Ends every lasting fault still in force: SIGCONTs every process still paused (the run is stopping: a stopped
  /// process cannot exit cleanly), heals links, ends slowdowns. A fault that was due but waited for its target's
  /// next incarnation and never fired is logged as skipped.
  void release(std::vector<Child>& children, double elapsed_s);

  /// Delay in seconds before restarting `child` after its death: the planned one if this plan killed it, else
  /// `dflt`.
  double restart_delay(const Child& child, double dflt) const;
  /// True if the plan killed `child` and its restart is still to come.
  bool planned_kill(const Child& child) const { return planned_restart_.count(child.role) > 0; }
  /// False while the plan's kill of `child` has a restart_at_step the global step has not reached yet; true
  /// otherwise (no kill planned, or none bounded in steps).
  bool restart_step_reached(const Child& child, int64_t global_step) const {
    auto it = planned_restart_step_.find(child.role);
    return it == planned_restart_step_.end() || global_step >= it->second;
  }
  /// The restart_at_step of the plan's pending kill of `child`; -1 when none.
  int64_t restart_step(const Child& child) const {
    auto it = planned_restart_step_.find(child.role);
    return it == planned_restart_step_.end() ? -1 : it->second;
  }
  /// Forget the planned restart of `child` (it has been restarted).
  void restarted(const Child& child) {
    planned_restart_.erase(child.role);
    planned_restart_step_.erase(child.role);
    killed_.erase(child.role);
  }
  /// True while `child` is SIGSTOPped by a pause_learner fault.
  bool paused(const Child& child) const {
    for (const auto& l : lasting_) {
      if (l.fault.action == FaultAction::kPauseLearner && l.role == child.role) return true;
    }
    return false;
  }
  /// True while the syncer is down because the plan killed it and will restart it.
  bool syncer_restart_pending() const { return planned_restart_.count("syncer") > 0; }
  int injected() const { return injected_; }

 private:
  // A fault that lasts, in force from started_s until end_s (elapsed seconds; infinity: until_step alone) or
  // until the global step reaches fault.until_step.
  struct Lasting {
    FaultEvent fault;
    std::string role;  // pause_learner: the stopped child's role
    double started_s = 0;
    double end_s = 0;
  };
  // The child a learner or syncer fault acts on (null: none, or a link or add_learner fault, which need none).
  static Child* target_of(const FaultEvent& f, std::vector<Child>& children);
  void fire(const FaultEvent& f, double elapsed_s, int64_t global_step, std::vector<Child>& children);
  void end(const Lasting& l, double elapsed_s, int64_t global_step, const char* reason, std::vector<Child>& children);

  std::vector<FaultEvent> faults_;
  std::vector<LinkProxy*> links_;
  std::vector<bool> fired_;
  std::filesystem::path run_dir_;
  EventLog& events_;
  std::vector<Lasting> lasting_;                   // pauses, slowdowns, cut and delayed links in force
  std::map<std::string, double> planned_restart_;  // role -> restart delay of a process the plan killed
  std::map<std::string, int64_t> planned_restart_step_;  // role -> its restart_at_step, where the plan gave one
  bool scavenging_ = false;
  std::vector<int> joins_;                         // add_learner ids not yet started
  std::set<std::string> left_;                     // roles that left (leave_learner)
  std::map<std::string, pid_t> killed_;            // role -> the process of it this plan SIGKILLed, until restarted
  std::set<size_t> deferred_;                      // faults that waited for their target's next incarnation
  int injected_ = 0;
};

}  // namespace dloco
