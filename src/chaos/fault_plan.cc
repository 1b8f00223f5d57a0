// Fault plans; see fault_plan.h.
#include "chaos/fault_plan.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>

#include <toml++/toml.h>

#include "core/check.h"
#include "core/rng.h"
#include "core/whole_number.h"

namespace dloco {

namespace {

constexpr FaultAction kActions[] = {FaultAction::kKillLearner, FaultAction::kPauseLearner, FaultAction::kSlowLearner,
                                    FaultAction::kKillSyncer,  FaultAction::kCutLink,      FaultAction::kDelayLink,
                                    FaultAction::kAddLearner,  FaultAction::kLeaveLearner};

bool targets_learner(FaultAction a) { return a != FaultAction::kKillSyncer; }

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

double number(const toml::node& node, const std::string& where) {
  if (auto v = node.value<double>()) {
    if (std::isfinite(*v)) return *v;
    throw InputError(where + " must be a finite number (got " + fmt(*v) + ")");
  }
  throw InputError(where + " must be a number");
}

// A whole number: an integer, or a float with an integral value in int64's range (toml++'s value<int64_t>() casts a
// float such as 1e20 out of range, which is undefined behaviour: found by fuzz/fault_plan.cc). nullopt otherwise.
std::optional<int64_t> whole(const toml::node& node) {
  if (node.is_integer()) return node.value<int64_t>();
  if (!node.is_floating_point()) return std::nullopt;
  return whole_int64(*node.value<double>());
}

}  // namespace

const char* to_string(FaultAction action) {
  switch (action) {
    case FaultAction::kKillLearner: return "kill_learner";
    case FaultAction::kPauseLearner: return "pause_learner";
    case FaultAction::kSlowLearner: return "slow_learner";
    case FaultAction::kKillSyncer: return "kill_syncer";
    case FaultAction::kCutLink: return "cut_link";
    case FaultAction::kDelayLink: return "delay_link";
    case FaultAction::kAddLearner: return "add_learner";
    case FaultAction::kLeaveLearner: return "leave_learner";
  }
  return "unknown";
}

bool fault_lasts(FaultAction a) {
  return a == FaultAction::kPauseLearner || a == FaultAction::kSlowLearner || a == FaultAction::kCutLink ||
         a == FaultAction::kDelayLink;
}

FaultAction parse_fault_action(std::string_view name) {
  for (FaultAction a : kActions) {
    if (name == to_string(a)) return a;
  }
  throw InputError("unknown fault action '" + std::string(name) +
                   "': expected kill_learner, pause_learner, slow_learner, kill_syncer, cut_link, delay_link, "
                   "add_learner or leave_learner");
}

nlohmann::json FaultEvent::to_json() const {
  nlohmann::json j;
  if (at_s >= 0) j["at_s"] = at_s;
  if (at_step >= 0) j["at_step"] = at_step;
  j["action"] = to_string(action);
  if (targets_learner(action)) j["learner"] = learner;
  if (action == FaultAction::kKillLearner || action == FaultAction::kKillSyncer) j["restart_after_s"] = restart_after_s;
  if (action == FaultAction::kKillLearner && restart_at_step >= 0) j["restart_at_step"] = restart_at_step;
  if (fault_lasts(action)) j["duration_s"] = duration_s;
  if (fault_lasts(action) && until_step >= 0) j["until_step"] = until_step;
  if (action == FaultAction::kSlowLearner) j["factor"] = factor;
  if (action == FaultAction::kDelayLink) j["delay_ms"] = delay_ms;
  if (random) j["random"] = true;
  return j;
}

std::string FaultEvent::describe() const {
  std::string s;
  switch (action) {
    case FaultAction::kKillLearner: s = "kill learner " + std::to_string(learner); break;
    case FaultAction::kPauseLearner: s = "pause learner " + std::to_string(learner); break;
    case FaultAction::kSlowLearner: s = "slow learner " + std::to_string(learner) + " " + fmt(factor) + "×"; break;
    case FaultAction::kKillSyncer: s = "kill the syncer"; break;
    case FaultAction::kCutLink: s = "cut learner " + std::to_string(learner) + "'s link"; break;
    case FaultAction::kDelayLink:
      s = "delay learner " + std::to_string(learner) + "'s link by " + fmt(delay_ms) + " ms";
      break;
    case FaultAction::kAddLearner: s = "add learner " + std::to_string(learner); break;
    case FaultAction::kLeaveLearner: s = "learner " + std::to_string(learner) + " leaves"; break;
  }
  if (fault_lasts(action)) {
    if (until_step >= 0) {
      s += " until global step " + std::to_string(until_step);
      if (duration_s > 0) s += " (at most " + fmt(duration_s) + " s)";
    } else {
      s += " for " + fmt(duration_s) + " s";
    }
  }
  s += at_s >= 0 ? " at " + fmt(at_s) + " s" : " at global step " + std::to_string(at_step);
  if (action == FaultAction::kKillLearner || action == FaultAction::kKillSyncer) {
    if (restart_at_step >= 0) {
      s += " (restart at global step " + std::to_string(restart_at_step) +
           (restart_after_s > 0 ? ", after " + fmt(restart_after_s) + " s at least)" : ")");
    } else {
      s += restart_after_s >= 0 ? " (restart after " + fmt(restart_after_s) + " s)" : " (no restart)";
    }
  }
  return s;
}

void FaultPlan::validate() const {
  for (size_t i = 0; i < events.size(); ++i) {
    const FaultEvent& e = events[i];
    const std::string where = "plan '" + name + "', fault " + std::to_string(i + 1) + " (" + to_string(e.action) + ")";
    if ((e.at_s >= 0) == (e.at_step >= 0)) throw InputError(where + ": give exactly one of at_s and at_step");
    if (targets_learner(e.action) && e.learner < 0) throw InputError(where + ": needs learner = <slot ≥ 0>");
    if (fault_lasts(e.action)) {
      if (!std::isfinite(e.duration_s) || e.duration_s < 0 || (e.duration_s == 0 && e.until_step < 0)) {
        throw InputError(where + ": needs duration_s > 0 or until_step = <global step> (or both: the first ends it)");
      }
      if (e.until_step >= 0 && e.at_step >= 0 && e.until_step <= e.at_step) {
        throw InputError(where + ": until_step = " + std::to_string(e.until_step) + " must be after at_step = " +
                         std::to_string(e.at_step));
      }
    } else if (e.until_step >= 0) {
      throw InputError(where + ": until_step applies only to faults that last (pause_learner, slow_learner, "
                               "cut_link, delay_link)");
    }
    if (e.action == FaultAction::kDelayLink && !(e.delay_ms > 0 && e.delay_ms <= 60'000)) {
      throw InputError(where + ": needs delay_ms in (0, 60000] (the latency added each way)");
    }
    if (e.action == FaultAction::kSlowLearner && !(e.factor > 1.0 && std::isfinite(e.factor))) {
      throw InputError(where + ": factor must be a finite number > 1 (the step-time multiplier)");
    }
    if (!std::isfinite(e.restart_after_s) || e.restart_after_s > 1e7) {
      throw InputError(where + ": restart_after_s must be at most 1e7 s (< 0 = never restart)");
    }
    if (e.duration_s > 1e7 || (e.at_s >= 0 && e.at_s > 1e9)) {
      throw InputError(where + ": duration_s must be at most 1e7 s and at_s at most 1e9 s");
    }
    if (e.restart_at_step >= 0) {
      if (e.action != FaultAction::kKillLearner) {
        throw InputError(where + ": restart_at_step applies only to kill_learner (the global step does not move "
                                 "while the syncer is down)");
      }
      if (e.restart_after_s < 0) throw InputError(where + ": restart_at_step restarts the learner: restart_after_s must be ≥ 0");
      if (e.at_step >= 0 && e.restart_at_step <= e.at_step) {
        throw InputError(where + ": restart_at_step = " + std::to_string(e.restart_at_step) + " must be after at_step = " +
                         std::to_string(e.at_step));
      }
    }
    if (e.action == FaultAction::kKillSyncer && e.restart_after_s < 0) {
      throw InputError(where + ": restart_after_s must be ≥ 0 (a decoupled run cannot finish without its syncer)");
    }
  }
  if (random.mtbf_s < 0 || !std::isfinite(random.mtbf_s)) throw InputError("plan '" + name + "': random.mtbf_s must be ≥ 0");
  if (random.mtbf_s > 0 && !(random.end_s > random.start_s && random.start_s >= 0)) {
    throw InputError("plan '" + name + "': random faults need 0 ≤ start_s < end_s (seconds since the learners started)");
  }
  if (random.mtbf_s > 0 && (random.end_s - random.start_s) / random.mtbf_s > 1e5) {
    throw InputError("plan '" + name + "': random faults would draw ~" + fmt((random.end_s - random.start_s) / random.mtbf_s) +
                     " kills (end_s − start_s)/mtbf_s; at most 100000 are allowed");
  }
}

std::vector<FaultEvent> FaultPlan::resolve(int learners) const {
  validate();
  std::vector<FaultEvent> out = events;
  std::vector<int> added;
  for (const auto& e : out) {
    if (e.action != FaultAction::kAddLearner) continue;
    if (e.learner < learners || e.learner >= 65536 || std::count(added.begin(), added.end(), e.learner) > 0) {
      throw InputError("plan '" + name + "': " + e.describe() + ": a joining learner needs a new id in [M = " +
                       std::to_string(learners) + ", 65536), each added once (0.." + std::to_string(learners - 1) +
                       " are the slots the launcher starts)");
    }
    added.push_back(e.learner);
  }
  for (const auto& e : out) {
    if (targets_learner(e.action) && e.learner >= learners &&
        std::count(added.begin(), added.end(), e.learner) == 0) {
      throw InputError("plan '" + name + "': " + e.describe() + " names learner " + std::to_string(e.learner) +
                       ", but the run has M = " + std::to_string(learners) + " learners (slots 0.." +
                       std::to_string(learners - 1) + ") and the plan adds no learner with that id");
    }
  }
  if (random.mtbf_s > 0) {
    Rng gaps(random.seed, 1), slots(random.seed, 2);
    for (double t = random.start_s + gaps.exponential(random.mtbf_s); t < random.end_s;
         t += gaps.exponential(random.mtbf_s)) {
      FaultEvent e;
      e.at_s = t;
      e.action = FaultAction::kKillLearner;
      e.learner = static_cast<int>(slots.below(static_cast<uint64_t>(learners)));
      e.restart_after_s = random.restart_after_s;
      e.random = true;
      out.push_back(e);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const FaultEvent& a, const FaultEvent& b) {
    const bool at = a.at_s >= 0, bt = b.at_s >= 0;
    if (at != bt) return at;
    return at ? a.at_s < b.at_s : a.at_step < b.at_step;
  });
  return out;
}

nlohmann::json FaultPlan::to_json(int learners) const {
  nlohmann::json faults = nlohmann::json::array();
  for (const auto& e : resolve(learners)) faults.push_back(e.to_json());
  nlohmann::json j = {{"name", name}, {"faults", faults}};
  if (random.mtbf_s > 0) {
    j["random"] = {{"mtbf_s", random.mtbf_s}, {"restart_after_s", random.restart_after_s}, {"start_s", random.start_s},
                   {"end_s", random.end_s}, {"seed", random.seed}};
  }
  return j;
}

FaultPlan parse_fault_plan(std::string_view toml_text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    throw InputError("fault plan " + origin + ": TOML syntax error at line " +
                     std::to_string(e.source().begin.line) + ": " + std::string(e.description()));
  }
  FaultPlan plan;
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    if (k == "plan") {
      const auto* t = node.as_table();
      if (t == nullptr) throw InputError("fault plan " + origin + ": [plan] must be a table");
      for (const auto& [pk, pv] : *t) {
        if (pk.str() != "name" || !pv.is_string()) {
          throw InputError("fault plan " + origin + ": [plan] takes only name = \"...\" (found '" +
                           std::string(pk.str()) + "')");
        }
        plan.name = *pv.value<std::string>();
      }
    } else if (k == "fault") {
      const auto* arr = node.as_array();
      if (arr == nullptr) throw InputError("fault plan " + origin + ": faults are written [[fault]] (an array of tables)");
      for (size_t i = 0; i < arr->size(); ++i) {
        const auto* t = (*arr)[i].as_table();
        const std::string where = "fault plan " + origin + ", fault " + std::to_string(i + 1);
        if (t == nullptr) throw InputError(where + ": must be a table");
        FaultEvent e;
        bool has_action = false, has_restart_after = false;
        for (const auto& [fk, fv] : *t) {
          const std::string f(fk.str());
          const std::string at = where + ": " + f;
          if (f == "action") {
            if (!fv.is_string()) throw InputError(at + " must be a string");
            e.action = parse_fault_action(*fv.value<std::string>());
            has_action = true;
          } else if (f == "at_s") {
            e.at_s = number(fv, at);
            if (e.at_s < 0) throw InputError(at + " must be ≥ 0");
          } else if (f == "at_step") {
            const auto v = whole(fv);
            if (!v || *v < 0) throw InputError(at + " must be a whole number ≥ 0");
            e.at_step = *v;
          } else if (f == "learner") {
            const auto v = whole(fv);
            if (!v || *v < 0 || *v > 1'000'000) throw InputError(at + " must be a learner slot in [0, 1000000]");
            e.learner = static_cast<int>(*v);
          } else if (f == "restart_after_s") {
            e.restart_after_s = number(fv, at);
            has_restart_after = true;
          } else if (f == "restart_at_step") {
            const auto v = whole(fv);
            if (!v || *v < 0) throw InputError(at + " must be a whole number ≥ 0 (a global step)");
            e.restart_at_step = *v;
          } else if (f == "duration_s") {
            e.duration_s = number(fv, at);
          } else if (f == "until_step") {
            const auto v = whole(fv);
            if (!v || *v < 0) throw InputError(at + " must be a whole number ≥ 0 (a global step)");
            e.until_step = *v;
          } else if (f == "factor") {
            e.factor = number(fv, at);
          } else if (f == "delay_ms") {
            e.delay_ms = number(fv, at);
          } else {
            throw InputError(where + ": unknown key '" + f +
                             "' (known: at_s, at_step, action, learner, restart_after_s, restart_at_step, duration_s, until_step, factor, "
                             "delay_ms)");
          }
        }
        if (!has_action) throw InputError(where + ": needs action = \"kill_learner\" (or another action)");
        if (e.restart_at_step >= 0 && !has_restart_after) e.restart_after_s = 0;  // the step alone decides
        plan.events.push_back(e);
      }
    } else if (k == "random") {
      const auto* t = node.as_table();
      if (t == nullptr) throw InputError("fault plan " + origin + ": [random] must be a table");
      for (const auto& [rk, rv] : *t) {
        const std::string r(rk.str());
        const std::string at = "fault plan " + origin + ", random." + r;
        if (r == "mtbf_s") plan.random.mtbf_s = number(rv, at);
        else if (r == "restart_after_s") plan.random.restart_after_s = number(rv, at);
        else if (r == "start_s") plan.random.start_s = number(rv, at);
        else if (r == "end_s") plan.random.end_s = number(rv, at);
        else if (r == "seed") {
          const auto v = whole(rv);
          if (!v || *v < 0) throw InputError(at + " must be a whole number ≥ 0");
          plan.random.seed = static_cast<uint64_t>(*v);
        } else {
          throw InputError("fault plan " + origin + ": unknown key random." + r +
                           " (known: mtbf_s, restart_after_s, start_s, end_s, seed)");
        }
      }
    } else {
      throw InputError("fault plan " + origin + ": unknown section '" + k + "' (known: [plan], [[fault]], [random])");
    }
  }
  plan.validate();
  return plan;
}

FaultPlan load_fault_plan(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw InputError("fault plan " + path.string() + " not found");
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw InputError("cannot read fault plan " + path.string());
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  std::fclose(f);
  return parse_fault_plan(text, path.string());
}

FaultPlanBuilder::FaultPlanBuilder(std::string name) { plan_.name = std::move(name); }

FaultPlanBuilder& FaultPlanBuilder::at_s(double seconds) {
  at_s_ = seconds;
  at_step_ = -1;
  until_step_ = -1;
  return *this;
}

FaultPlanBuilder& FaultPlanBuilder::at_step(int64_t global_step) {
  at_step_ = global_step;
  at_s_ = -1;
  until_step_ = -1;
  return *this;
}

FaultPlanBuilder& FaultPlanBuilder::until_step(int64_t global_step) {
  until_step_ = global_step;
  return *this;
}

FaultPlanBuilder& FaultPlanBuilder::add(FaultEvent event) {
  event.at_s = at_s_;
  event.at_step = at_step_;
  if (fault_lasts(event.action)) event.until_step = until_step_;
  plan_.events.push_back(event);
  return *this;
}

FaultPlanBuilder& FaultPlanBuilder::kill_learner(int learner, double restart_after_s) {
  FaultEvent e;
  e.action = FaultAction::kKillLearner;
  e.learner = learner;
  e.restart_after_s = restart_after_s;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::pause_learner(int learner, double duration_s) {
  FaultEvent e;
  e.action = FaultAction::kPauseLearner;
  e.learner = learner;
  e.duration_s = duration_s;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::slow_learner(int learner, double factor, double duration_s) {
  FaultEvent e;
  e.action = FaultAction::kSlowLearner;
  e.learner = learner;
  e.factor = factor;
  e.duration_s = duration_s;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::cut_link(int learner, double duration_s) {
  FaultEvent e;
  e.action = FaultAction::kCutLink;
  e.learner = learner;
  e.duration_s = duration_s;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::delay_link(int learner, double delay_ms, double duration_s) {
  FaultEvent e;
  e.action = FaultAction::kDelayLink;
  e.learner = learner;
  e.delay_ms = delay_ms;
  e.duration_s = duration_s;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::add_learner(int learner) {
  FaultEvent e;
  e.action = FaultAction::kAddLearner;
  e.learner = learner;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::leave_learner(int learner) {
  FaultEvent e;
  e.action = FaultAction::kLeaveLearner;
  e.learner = learner;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::kill_syncer(double restart_after_s) {
  FaultEvent e;
  e.action = FaultAction::kKillSyncer;
  e.restart_after_s = restart_after_s;
  return add(e);
}

FaultPlanBuilder& FaultPlanBuilder::random_kills(double mtbf_s, double start_s, double end_s, uint64_t seed,
                                                 double restart_after_s) {
  plan_.random = {mtbf_s, restart_after_s, start_s, end_s, seed};
  return *this;
}

FaultPlan FaultPlanBuilder::build() const {
  plan_.validate();
  return plan_;
}

}  // namespace dloco
