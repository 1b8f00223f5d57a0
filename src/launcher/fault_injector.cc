#include "launcher/fault_injector.h"

#include <signal.h>

#include <chrono>
#include <cstdio>

#include "core/atomic_file.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Child* find_role(std::vector<Child>& children, const std::string& role) {
  for (auto& c : children) {
    if (c.role == role) return &c;
  }
  return nullptr;
}

}  // namespace

FaultInjector::FaultInjector(std::vector<FaultEvent> faults, const fs::path& run_dir, EventLog& events)
    : faults_(std::move(faults)), fired_(faults_.size(), false), run_dir_(run_dir), events_(events) {}

void FaultInjector::tick(double elapsed_s, int64_t global_step, bool finished, std::vector<Child>& children) {
  for (auto it = ends_.begin(); it != ends_.end();) {  // SIGCONT paused processes whose pause is over
    if (elapsed_s < it->first) {
      ++it;
      continue;
    }
    if (Child* c = find_role(children, it->second)) resume(*c, elapsed_s);
    it = ends_.erase(it);
  }
  if (finished) return;
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultEvent& f = faults_[i];
    if (fired_[i] || (f.at_s >= 0 ? elapsed_s < f.at_s : global_step < f.at_step)) continue;
    fired_[i] = true;
    fire(f, elapsed_s, global_step, children);
  }
}

void FaultInjector::release(std::vector<Child>& children, double elapsed_s) {
  for (const auto& [end, role] : ends_) {
    if (Child* c = find_role(children, role)) resume(*c, elapsed_s);
  }
  ends_.clear();
}

double FaultInjector::restart_delay(const Child& child, double dflt) const {
  auto it = planned_restart_.find(child.role);
  return it == planned_restart_.end() ? dflt : it->second;
}

// "fault_skipped" with `reason`; on the console with `note` unless it is empty.
void FaultInjector::skip(const FaultEvent& f, nlohmann::json& fields, const std::string& reason, const char* note) {
  fields["reason"] = reason;
  events_.emit("fault_skipped", fields);
  if (note == nullptr) return;
  std::printf("[chaos] skipped: %s (%s)\n", f.describe().c_str(), note);
  std::fflush(stdout);
}

// Counts an injected fault: event "fault" and the console line `line`.
void FaultInjector::count_injected(const nlohmann::json& fields, const std::string& line) {
  ++injected_;
  events_.emit("fault", fields);
  std::printf("[chaos] %s\n", line.c_str());
  std::fflush(stdout);
}

// cut_link / delay_link: on the slot's proxy, whether its learner is up or not.
void FaultInjector::fire_link_fault(const FaultEvent& f, nlohmann::json& fields) {
  if (f.learner < 0 || f.learner >= static_cast<int>(links_.size()) || links_[f.learner] == nullptr) {
    skip(f, fields, "no link proxy for this learner (only decoupled runs route learners through proxies)",
         "no link proxy");
    return;
  }
  if (f.action == FaultAction::kCutLink) {
    links_[f.learner]->cut(f.duration_s);
  } else {
    links_[f.learner]->delay(f.delay_ms, f.duration_s);
  }
  count_injected(fields, f.describe());
}

// add_learner: the launcher starts it (take_joins), unless a learner with this id exists.
void FaultInjector::fire_add_learner(const FaultEvent& f, nlohmann::json& fields, const std::vector<Child>& children) {
  for (const auto& c : children) {
    if (c.learner == f.learner) {
      skip(f, fields, "a learner with this id already exists in the run", nullptr);
      return;
    }
  }
  joins_.push_back(f.learner);
  count_injected(fields, f.describe());
}

// kill_learner, kill_syncer, pause_learner, slow_learner, leave_learner on a running `target`.
void FaultInjector::act_on_process(const FaultEvent& f, Child& target, double elapsed_s) {
  switch (f.action) {
    case FaultAction::kKillLearner:
    case FaultAction::kKillSyncer:
      ::kill(target.pid, SIGCONT);  // a paused process dies as well, and its pause ends with it
      ::kill(target.pid, SIGKILL);
      planned_restart_[target.role] = f.restart_after_s;
      break;
    case FaultAction::kPauseLearner:
      ::kill(target.pid, SIGSTOP);
      ends_.emplace(elapsed_s + f.duration_s, target.role);
      break;
    case FaultAction::kSlowLearner: {
      fs::create_directories(run_dir_ / "control");
      const nlohmann::json control = {{"factor", f.factor}, {"until_unix", unix_now() + f.duration_s}};
      write_file_atomically(run_dir_ / "control" / ("learner_" + std::to_string(f.learner) + ".json"),
                            control.dump() + "\n");
      break;
    }
    case FaultAction::kLeaveLearner:
      ::kill(target.pid, SIGCONT);  // a paused learner could not leave
      ::kill(target.pid, SIGTERM);  // it tells the syncer it leaves, then exits
      left_.insert(target.role);
      break;
    case FaultAction::kCutLink:
    case FaultAction::kDelayLink:
    case FaultAction::kAddLearner:
      break;  // handled by fire
  }
}

void FaultInjector::fire(const FaultEvent& f, double elapsed_s, int64_t global_step, std::vector<Child>& children) {
  nlohmann::json fields = f.to_json();
  fields["at_s"] = elapsed_s;
  fields["planned_at_s"] = f.at_s;
  fields["global_step"] = global_step;
  fields["description"] = f.describe();
  if (f.action == FaultAction::kCutLink || f.action == FaultAction::kDelayLink) {
    fire_link_fault(f, fields);
    return;
  }
  if ((f.action == FaultAction::kAddLearner || f.action == FaultAction::kLeaveLearner) && !scavenging_) {
    skip(f, fields, "the group of M workers is fixed (learners join and leave decoupled runs only)", "a fixed group");
    return;
  }
  if (f.action == FaultAction::kAddLearner) {
    fire_add_learner(f, fields, children);
    return;
  }
  Child* target = nullptr;
  for (auto& c : children) {
    if (f.action == FaultAction::kKillSyncer ? c.role == "syncer" : c.learner == f.learner) target = &c;
  }
  if (f.action == FaultAction::kLeaveLearner && target != nullptr && (target->exited || target->pid <= 0)) {
    left_.insert(target->role);  // down (killed, crashed): it leaves for good, the launcher does not restart it
    fields["note"] = "the learner was down: it is not restarted";
    count_injected(fields, f.describe() + " (it was down: not restarted)");
    return;
  }
  if (target == nullptr || target->exited || target->pid <= 0) {
    const std::string reason = target == nullptr ? "no such process in this run (e.g. no syncer in the baselines)"
                                                 : "the process is not running (already down)";
    skip(f, fields, reason, reason.c_str());
    return;
  }
  fields["pid"] = target->pid;
  act_on_process(f, *target, elapsed_s);
  count_injected(fields, f.describe());
}

void FaultInjector::resume(Child& c, double elapsed_s) {
  if (!c.exited && c.pid > 0) ::kill(c.pid, SIGCONT);
  events_.emit("fault_ended", {{"action", "pause_learner"}, {"learner", c.learner}, {"at_s", elapsed_s}});
}

}  // namespace dloco
