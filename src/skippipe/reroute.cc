// Routing a schedule around dead nodes; see reroute.h.
#include "skippipe/reroute.h"

#include <algorithm>
#include <map>

#include "core/check.h"
#include "skippipe/scheduler.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {

Schedule reroute_around(const Schedule& schedule, const Setting& setting, const std::set<int>& dead) {
  Schedule out = schedule;
  out.reference_iteration_time_s.reset();
  out.method = schedule.method + "+rerouted";
  std::string names;
  for (int d : dead) names += (names.empty() ? "" : ", ") + std::to_string(d);
  out.description = "re-routed around node(s) " + names;
  for (size_t s = 0; s < out.placement.size(); ++s) {
    auto& nodes = out.placement[s];
    nodes.erase(std::remove_if(nodes.begin(), nodes.end(), [&](int n) { return dead.count(n) > 0; }), nodes.end());
    if (nodes.empty()) {
      throw InputError("stage " + std::to_string(s) + " has no node left after node(s) " + names +
                       " died: its parameters died with it, so no path can be routed around it");
    }
  }
  for (int d : dead) {
    if (d >= 0 && d < static_cast<int>(out.stage_of_node.size())) out.stage_of_node[static_cast<size_t>(d)] = -1;
  }
  std::map<int, int64_t> served;  // node -> micro-batches it serves so far in the new schedule
  auto pick = [&](int stage) {
    const auto& nodes = out.placement[static_cast<size_t>(stage)];
    int best = nodes.front();
    for (int n : nodes) {
      if (served[n] < served[best] || (served[n] == served[best] && n < best)) best = n;
    }
    return best;
  };
  // Survivors keep what they served; dead nodes' micro-batches go, in schedule order, to the least loaded replica.
  for (const auto& m : out.micro_batches) {
    if (!dead.count(m.data_node)) ++served[m.data_node];
    for (int n : m.path) {
      if (!dead.count(n)) ++served[n];
    }
  }
  for (auto& m : out.micro_batches) {
    if (dead.count(m.data_node)) {
      m.data_node = pick(0);
      ++served[m.data_node];
    }
    for (int& n : m.path) {
      if (!dead.count(n)) continue;
      n = pick(schedule.stage_of_node[static_cast<size_t>(n)]);
      ++served[n];
    }
  }
  (void)simulate_exact(setting, out);  // throws InputError when the re-routed schedule deadlocks
  return out;
}

Schedule replan_around(const Schedule& rerouted, const Schedule& before, const Setting& setting, std::string* why) {
  auto keep = [&](const std::string& reason) {
    if (why) *why = "the re-routed paths stay: " + reason;
    return rerouted;
  };
  const int S = static_cast<int>(before.placement.size());
  if (before.micro_batches.empty()) return keep("no micro-batches");
  const size_t L = before.micro_batches.front().path.size();
  int64_t swaps = 0;  // the most stage-order inversions of one path: the old schedule's swap allowance
  for (const auto& m : before.micro_batches) {
    if (m.path.size() != L) return keep("the old schedule's paths have unequal lengths (not one the scheduler makes)");
    int64_t inversions = 0;
    for (size_t i = 0; i < m.path.size(); ++i) {
      for (size_t j = i + 1; j < m.path.size(); ++j) {
        inversions += before.stage_of_node[static_cast<size_t>(m.path[i])] >
                      before.stage_of_node[static_cast<size_t>(m.path[j])];
      }
    }
    swaps = std::max(swaps, inversions);
  }
  if (static_cast<int>(L) >= S - 1) return keep("a full pipeline (every path visits every stage)");
  // The same W micro-batches per iteration (the same tokens per step) over the surviving data nodes when they
  // divide it, else the old count per data node.
  const auto W = static_cast<int64_t>(before.micro_batches.size());
  std::set<int> before_data;
  for (const auto& m : before.micro_batches) before_data.insert(m.data_node);
  if (W % static_cast<int64_t>(before_data.size()) != 0) {
    return keep("data nodes start unequal numbers of micro-batches");
  }
  const auto survivors = static_cast<int64_t>(rerouted.placement.front().size());
  SchedulerOptions o;
  o.skip = 1.0 - static_cast<double>(L + 1) / S;
  o.micro_batches_per_data_node =
      W % survivors == 0 ? W / survivors : W / static_cast<int64_t>(before_data.size());
  o.placement = rerouted.placement;
  o.max_swaps = swaps;
  try {
    check_scheduler_options(o);
    SchedulerResult r = schedule_skippipe(setting, o);
    r.schedule.description = "re-planned by the scheduler for the survivors of " + rerouted.description;
    if (why) {
      *why = "re-planned by the scheduler (skip " + std::to_string(o.skip) + ", " +
             std::to_string(o.micro_batches_per_data_node) + " micro-batches per data node, " +
             std::to_string(o.max_swaps) + " swaps): " + std::to_string(r.exact_s) + " s per iteration (exact), " +
             std::to_string(simulate_exact(setting, rerouted).iteration_time_s) + " s re-routed";
    }
    return r.schedule;
  } catch (const std::exception& e) {
    return keep(std::string("the scheduler found none (") + e.what() + ")");
  }
}

}  // namespace dloco::skippipe
