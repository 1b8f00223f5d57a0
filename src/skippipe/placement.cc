// Placement search and the full-pipeline baseline (scheduler.h).
// Placement: stage 0 gets n − (S − 1)·⌊n/S⌋ nodes and every other stage ⌊n/S⌋ (the reference's [5, 3, 3, 3, 3, 3]
// for 20 nodes and 6 stages). The search starts from the nodes in id order and swaps two nodes of different stages,
// keeping a swap when the exact time of the greedy schedule on the new placement (the best over the feasible route
// groupings) is no worse — the simulator scores
// placements as it scores paths, instead of DT-FM's proxy (intra-stage cost + tour over stages).
// Full pipeline: r = the smallest replica count of the non-zero stages; pipeline p is node p of every non-zero
// stage; data node i sends its micro-batches down pipeline i mod r, injected 0.1 s apart.
// Deliberately not here: the path search itself (scheduler.cc, local_search.cc).
#include <algorithm>
#include <chrono>
#include <limits>

#include "core/check.h"
#include "skippipe/route_plan.h"

namespace dloco::skippipe {

std::vector<std::vector<int>> search_placement(const Setting& setting, const SchedulerOptions& o, double budget_s) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = setting.node_count(), s_count = o.stages;
  if (s_count < 2) throw InputError("--stages " + std::to_string(s_count) + ": expected at least 2 (or --placement)");
  const int64_t per = n / s_count;
  if (per == 0) {
    throw InputError("--stages " + std::to_string(s_count) + ": more stages than the setting's " + std::to_string(n) +
                     " nodes");
  }
  std::vector<std::vector<int>> placement(s_count);
  for (int node = 0; node < n; ++node) {
    const int64_t inner = (n - 1 - node) / per;  // the last (S − 1)·per nodes fill stages S − 1 … 1 from the end
    const int64_t stage = node < n - (s_count - 1) * per ? 0 : s_count - 1 - inner;
    placement[stage].push_back(node);
  }
  const std::vector<int64_t> groups = feasible_group_counts(setting, o, placement);
  auto score = [&](const std::vector<std::vector<int>>& pl) {  // the best greedy schedule over the groupings
    Score best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    for (int64_t g : groups) {
      Problem p = make_problem(setting, o, pl, g);
      p.score_mode = SimMode::kExact;
      const Score s = score_plan(p, greedy_plan(p));
      if (s.better_than(best)) best = s;
    }
    return best;
  };
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ULL);  // its own stream: the path search's draws stay the same
  Score current = score(placement);
  for (int64_t it = 0; it < o.placement_iterations; ++it) {
    if (budget_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > budget_s) {
      break;  // a wall-clock cap only: which swaps are tried never depends on the clock
    }
    const size_t s1 = draw_below(rng, placement.size()), s2 = draw_below(rng, placement.size());
    if (s1 == s2) continue;
    std::vector<std::vector<int>> candidate = placement;
    std::swap(candidate[s1][draw_below(rng, candidate[s1].size())],
              candidate[s2][draw_below(rng, candidate[s2].size())]);
    const Score s = score(candidate);
    if (s.no_worse_than(current)) placement = std::move(candidate), current = s;
  }
  return placement;
}

SchedulerResult schedule_full_pipeline(const Setting& setting, const SchedulerOptions& o) {
  check_scheduler_options(o);
  const auto t0 = std::chrono::steady_clock::now();
  if (!o.placement) throw InputError("--method full needs --placement (the full pipeline's stages and replicas)");
  SchedulerOptions full = o;
  full.skip = 0.0;  // every stage
  const Problem p = make_problem(setting, full, *o.placement, 1);
  size_t pipelines = std::numeric_limits<size_t>::max();
  for (int s = 1; s < p.stages; ++s) pipelines = std::min(pipelines, p.placement[s].size());
  Plan plan;
  for (size_t di = 0; di < p.data_nodes.size(); ++di) {
    Route r;
    r.data_node = p.data_nodes[di];
    for (int s = 1; s < p.stages; ++s) r.stages.push_back(s), r.nodes.push_back(p.placement[s][di % pipelines]);
    plan.routes.push_back(r);
    for (int64_t j = 0; j < p.per_data_node; ++j) {
      plan.group_of.push_back(static_cast<int>(di));
      plan.inject_s.push_back(static_cast<double>(j) / 10.0);
    }
  }
  return finish_result(p, plan, "full",
                       "full pipeline baseline: " + std::to_string(pipelines) + " pipelines, " +
                           std::to_string(p.data_nodes.size()) + " data nodes x " + std::to_string(p.per_data_node) +
                           " micro-batches, every stage in order",
                       t0);
}

}  // namespace dloco::skippipe
