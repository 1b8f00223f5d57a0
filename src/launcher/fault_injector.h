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
#include "core/events.h"
#include "launcher/children.h"

namespace dloco {

/// Fires the plan's faults at their time or global step. Every fault it injects, ends or skips is an event in
/// events/launcher.jsonl ("fault", "fault_ended", "fault_skipped"): that log, not this class, is what the chaos
/// report reads. Targets are matched by Child::learner (the slot) or, for kill_syncer, by role "syncer"; link
/// faults act on the slot's LinkProxy (set_links), whether its learner is up or not.
class FaultInjector {
 public:
  FaultInjector(std::vector<FaultEvent> faults, const std::filesystem::path& run_dir, EventLog& events);

  /// Ends pauses that are over (always, also once training is done) and, unless `finished`, fires every fault
  /// due at `elapsed_s` since the learners started or at `global_step` (time and step triggers independently).
  /// A fault whose target is not running is skipped (event "fault_skipped" with the reason).
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

  /// SIGCONTs every process still paused (the run is stopping: a stopped process cannot exit cleanly).
  void release(std::vector<Child>& children, double elapsed_s);

  /// Delay in seconds before restarting `child` after its death: the planned one if this plan killed it, else
  /// `dflt`.
  double restart_delay(const Child& child, double dflt) const;
  /// True if the plan killed `child` and its restart is still to come.
  bool planned_kill(const Child& child) const { return planned_restart_.count(child.role) > 0; }
  /// Forget the planned restart of `child` (it has been restarted).
  void restarted(const Child& child) { planned_restart_.erase(child.role); }
  /// True while `child` is SIGSTOPped by a pause_learner fault.
  bool paused(const Child& child) const {
    for (const auto& [end, role] : ends_) {
      if (role == child.role) return true;
    }
    return false;
  }
  /// True while the syncer is down because the plan killed it and will restart it.
  bool syncer_restart_pending() const { return planned_restart_.count("syncer") > 0; }
  int injected() const { return injected_; }

 private:
  void fire(const FaultEvent& f, double elapsed_s, int64_t global_step, std::vector<Child>& children);
  void fire_link_fault(const FaultEvent& f, nlohmann::json& fields);
  void fire_add_learner(const FaultEvent& f, nlohmann::json& fields, const std::vector<Child>& children);
  void act_on_process(const FaultEvent& f, Child& target, double elapsed_s);
  void skip(const FaultEvent& f, nlohmann::json& fields, const std::string& reason, const char* note);
  void count_injected(const nlohmann::json& fields, const std::string& line);
  void resume(Child& c, double elapsed_s);

  std::vector<FaultEvent> faults_;
  std::vector<LinkProxy*> links_;
  std::vector<bool> fired_;
  std::filesystem::path run_dir_;
  EventLog& events_;
  std::multimap<double, std::string> ends_;        // elapsed_s at which to SIGCONT -> role of the paused child
  std::map<std::string, double> planned_restart_;  // role -> restart delay of a process the plan killed
  bool scavenging_ = false;
  std::vector<int> joins_;                         // add_learner ids not yet started
  std::set<std::string> left_;                     // roles that left (leave_learner)
  int injected_ = 0;
};

}  // namespace dloco
