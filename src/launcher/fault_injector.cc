#include "launcher/fault_injector.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <limits>

#include <spdlog/spdlog.h>

#include "process/atomic_file.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What a fault bounded by until_step alone is given as its duration where a duration is needed (the proxy's cut,
// the learner's control file): longer than any run, so only the injector's end (at the step, or when the run
// stops) ends it.
constexpr double kUntilEnded_s = 1e7;
constexpr double kNever = std::numeric_limits<double>::infinity();

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
  for (auto it = lasting_.begin(); it != lasting_.end();) {  // end the lasting faults that are over
    const bool by_step = it->fault.until_step >= 0 && global_step >= it->fault.until_step;
    if (!finished && !by_step && elapsed_s < it->end_s) {
      ++it;
      continue;
    }
    end(*it, elapsed_s, global_step, by_step ? "until_step" : finished ? "run finished" : "duration", children);
    it = lasting_.erase(it);
  }
  if (finished) return;
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultEvent& f = faults_[i];
    if (fired_[i] || (f.at_s >= 0 ? elapsed_s < f.at_s : global_step < f.at_step)) continue;
    if (const Child* t = target_of(f, children); t != nullptr && f.action != FaultAction::kLeaveLearner) {
      if (auto k = killed_.find(t->role); k != killed_.end() && k->second == t->pid) {
        deferred_.insert(i);
        continue;  // the plan killed this process already: the fault is for its next incarnation
      }
    }
    fired_[i] = true;
    fire(f, elapsed_s, global_step, children);
  }
}

void FaultInjector::release(std::vector<Child>& children, double elapsed_s) {
  for (const auto& l : lasting_) end(l, elapsed_s, -1, "run stopped", children);
  lasting_.clear();
  for (size_t i : deferred_) {
    if (fired_[i]) continue;
    nlohmann::json fields = faults_[i].to_json();
    fields["at_s"] = elapsed_s;
    fields["description"] = faults_[i].describe();
    fields["reason"] = "due while its target was down after an earlier kill; the run ended before it was back";
    events_.emit("fault_skipped", fields);
  }
}

Child* FaultInjector::target_of(const FaultEvent& f, std::vector<Child>& children) {
  if (f.action == FaultAction::kCutLink || f.action == FaultAction::kDelayLink ||
      f.action == FaultAction::kAddLearner) {
    return nullptr;
  }
  Child* target = nullptr;
  for (auto& c : children) {
    if (f.action == FaultAction::kKillSyncer ? c.role == "syncer" : c.learner == f.learner) target = &c;
  }
  return target;
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
      spdlog::info("[chaos] skipped: {} (no link proxy)", f.describe());
      return;
    }
    const double lasts_s = f.duration_s > 0 ? f.duration_s : kUntilEnded_s;
    if (f.action == FaultAction::kCutLink) {
      links_[f.learner]->cut(lasts_s);
    } else {
      links_[f.learner]->delay(f.delay_ms, lasts_s);
    }
    lasting_.push_back({f, "", elapsed_s, f.duration_s > 0 ? elapsed_s + f.duration_s : kNever});
    ++injected_;
    events_.emit("fault", fields);
    spdlog::info("[chaos] {}", f.describe());
    return;
  }
  if ((f.action == FaultAction::kAddLearner || f.action == FaultAction::kLeaveLearner) && !scavenging_) {
    fields["reason"] = "the group of M workers is fixed (learners join and leave decoupled runs only)";
    events_.emit("fault_skipped", fields);
    spdlog::info("[chaos] skipped: {} (a fixed group)", f.describe());
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
    spdlog::info("[chaos] {}", f.describe());
    return;
  }
  Child* target = target_of(f, children);
  if (f.action == FaultAction::kLeaveLearner && target != nullptr && (target->exited || target->pid <= 0)) {
    left_.insert(target->role);  // down (killed, crashed): it leaves for good, the launcher does not restart it
    fields["note"] = "the learner was down: it is not restarted";
    ++injected_;
    events_.emit("fault", fields);
    spdlog::info("[chaos] {} (it was down: not restarted)", f.describe());
    return;
  }
  if (target == nullptr || target->exited || target->pid <= 0) {
    fields["reason"] = target == nullptr ? "no such process in this run (e.g. no syncer in the baselines)"
                                         : "the process is not running (already down)";
    events_.emit("fault_skipped", fields);
    spdlog::info("[chaos] skipped: {} ({})", f.describe(), fields["reason"].get<std::string>());
    return;
  }
  fields["pid"] = target->pid;
  switch (f.action) {
    case FaultAction::kKillLearner:
    case FaultAction::kKillSyncer:
      // The process group: a learner with the ranks of its group (learner/group_ranks.h), like a machine that dies.
      ::kill(-target->pid, SIGCONT);  // a paused process dies as well, and its pause ends with it
      ::kill(-target->pid, SIGKILL);
      killed_[target->role] = target->pid;
      planned_restart_[target->role] = f.restart_after_s;
      if (f.restart_at_step >= 0) planned_restart_step_[target->role] = f.restart_at_step;
      break;
    case FaultAction::kPauseLearner:
      ::kill(-target->pid, SIGSTOP);  // the learner and its group's ranks: their deadlines pause with them
      lasting_.push_back({f, target->role, elapsed_s, f.duration_s > 0 ? elapsed_s + f.duration_s : kNever});
      break;
    case FaultAction::kSlowLearner: {
      fs::create_directories(run_dir_ / "control");
      const double lasts_s = f.duration_s > 0 ? f.duration_s : kUntilEnded_s;
      const nlohmann::json control = {{"factor", f.factor}, {"until_unix", unix_now() + lasts_s}};
      write_file_atomically(run_dir_ / "control" / ("learner_" + std::to_string(f.learner) + ".json"),
                            control.dump() + "\n");
      lasting_.push_back({f, target->role, elapsed_s, f.duration_s > 0 ? elapsed_s + f.duration_s : kNever});
      break;
    }
    case FaultAction::kLeaveLearner:
      ::kill(-target->pid, SIGCONT);  // a paused learner could not leave
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
  spdlog::info("[chaos] {}", f.describe());
}

void FaultInjector::end(const Lasting& l, double elapsed_s, int64_t global_step, const char* reason,
                        std::vector<Child>& children) {
  const FaultEvent& f = l.fault;
  switch (f.action) {
    case FaultAction::kPauseLearner:
      if (Child* c = find_role(children, l.role); c != nullptr && !c->exited && c->pid > 0) ::kill(-c->pid, SIGCONT);
      break;
    case FaultAction::kSlowLearner:  // the learner reads its control file every step: factor 1 from now on
      write_file_atomically(run_dir_ / "control" / ("learner_" + std::to_string(f.learner) + ".json"),
                            nlohmann::json{{"factor", 1.0}, {"until_unix", unix_now()}}.dump() + "\n");
      break;
    case FaultAction::kCutLink: links_[f.learner]->end_cut(); break;
    case FaultAction::kDelayLink: links_[f.learner]->end_delay(); break;
    default: break;
  }
  nlohmann::json fields = {{"action", to_string(f.action)}, {"learner", f.learner}, {"at_s", elapsed_s},
                           {"started_s", l.started_s}, {"lasted_s", elapsed_s - l.started_s}, {"reason", reason}};
  if (global_step >= 0) fields["global_step"] = global_step;
  if (f.until_step >= 0) fields["until_step"] = f.until_step;
  events_.emit("fault_ended", fields);
  spdlog::info("[chaos] ended: {} after {:.1f} s ({})", f.describe(), elapsed_s - l.started_s, reason);
}

}  // namespace dloco
