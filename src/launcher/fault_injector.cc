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

void FaultInjector::fire(const FaultEvent& f, double elapsed_s, int64_t global_step, std::vector<Child>& children) {
  nlohmann::json fields = f.to_json();
  fields["at_s"] = elapsed_s;
  fields["planned_at_s"] = f.at_s;
  fields["global_step"] = global_step;
  fields["description"] = f.describe();
  if (f.action == FaultAction::kCutLink || f.action == FaultAction::kDelayLink) {
    if (f.learner < 0 || f.learner >= static_cast<int>(links_.size()) || links_[f.learner] == nullptr) {
      fields["reason"] = "no link proxy for this learner (only decoupled runs route learners through proxies)";
      events_.emit("fault_skipped", fields);
      std::printf("[chaos] skipped: %s (no link proxy)\n", f.describe().c_str());
      std::fflush(stdout);
      return;
    }
    if (f.action == FaultAction::kCutLink) {
      links_[f.learner]->cut(f.duration_s);
    } else {
      links_[f.learner]->delay(f.delay_ms, f.duration_s);
    }
    ++injected_;
    events_.emit("fault", fields);
    std::printf("[chaos] %s\n", f.describe().c_str());
    std::fflush(stdout);
    return;
  }
  if ((f.action == FaultAction::kAddLearner || f.action == FaultAction::kLeaveLearner) && !scavenging_) {
    fields["reason"] = "the group of M workers is fixed (learners join and leave decoupled runs only)";
    events_.emit("fault_skipped", fields);
    std::printf("[chaos] skipped: %s (a fixed group)\n", f.describe().c_str());
    std::fflush(stdout);
    return;
  }
  if (f.action == FaultAction::kAddLearner) {  // the launcher starts it (take_joins)
    for (const auto& c : children) {
      if (c.learner == f.learner) {
        fields["reason"] = "a learner with this id already exists in the run";
        events_.emit("fault_skipped", fields);
        return;
      }
    }
    joins_.push_back(f.learner);
    ++injected_;
    events_.emit("fault", fields);
    std::printf("[chaos] %s\n", f.describe().c_str());
    std::fflush(stdout);
    return;
  }
  Child* target = nullptr;
  for (auto& c : children) {
    if (f.action == FaultAction::kKillSyncer ? c.role == "syncer" : c.learner == f.learner) target = &c;
  }
  if (f.action == FaultAction::kLeaveLearner && target != nullptr && (target->exited || target->pid <= 0)) {
    left_.insert(target->role);  // down (killed, crashed): it leaves for good, the launcher does not restart it
    fields["note"] = "the learner was down: it is not restarted";
    ++injected_;
    events_.emit("fault", fields);
    std::printf("[chaos] %s (it was down: not restarted)\n", f.describe().c_str());
    std::fflush(stdout);
    return;
  }
  if (target == nullptr || target->exited || target->pid <= 0) {
    fields["reason"] = target == nullptr ? "no such process in this run (e.g. no syncer in the baselines)"
                                         : "the process is not running (already down)";
    events_.emit("fault_skipped", fields);
    std::printf("[chaos] skipped: %s (%s)\n", f.describe().c_str(), fields["reason"].get<std::string>().c_str());
    std::fflush(stdout);
    return;
  }
  fields["pid"] = target->pid;
  switch (f.action) {
    case FaultAction::kKillLearner:
    case FaultAction::kKillSyncer:
      ::kill(target->pid, SIGCONT);  // a paused process dies as well, and its pause ends with it
      ::kill(target->pid, SIGKILL);
      planned_restart_[target->role] = f.restart_after_s;
      break;
    case FaultAction::kPauseLearner:
      ::kill(target->pid, SIGSTOP);
      ends_.emplace(elapsed_s + f.duration_s, target->role);
      break;
    case FaultAction::kSlowLearner: {
      fs::create_directories(run_dir_ / "control");
      const nlohmann::json control = {{"factor", f.factor}, {"until_unix", unix_now() + f.duration_s}};
      write_file_atomically(run_dir_ / "control" / ("learner_" + std::to_string(f.learner) + ".json"),
                            control.dump() + "\n");
      break;
    }
    case FaultAction::kLeaveLearner:
      ::kill(target->pid, SIGCONT);  // a paused learner could not leave
      ::kill(target->pid, SIGTERM);  // it tells the syncer it leaves, then exits
      left_.insert(target->role);
      break;
    case FaultAction::kCutLink:
    case FaultAction::kDelayLink:
    case FaultAction::kAddLearner:
      break;  // handled above
  }
  ++injected_;
  events_.emit("fault", fields);
  std::printf("[chaos] %s\n", f.describe().c_str());
  std::fflush(stdout);
}

void FaultInjector::resume(Child& c, double elapsed_s) {
  if (!c.exited && c.pid > 0) ::kill(c.pid, SIGCONT);
  events_.emit("fault_ended", {{"action", "pause_learner"}, {"learner", c.learner}, {"at_s", elapsed_s}});
}

}  // namespace dloco
