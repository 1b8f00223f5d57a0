// The scheduler's entry points (scheduler.h): the collision-aware SkipPipe search over every feasible route grouping,
// the network-oblivious baseline, the rule check of a finished schedule and the schedule's JSON.
// Deliberately not here: the constructions and moves (route_plan.cc, local_search.cc), the placement search and the
// full pipeline (placement.cc).
#include "skippipe/scheduler.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/check.h"
#include "skippipe/route_plan.h"

namespace dloco::skippipe {

namespace {

constexpr double kStartTemperatureS = 0.3;   // annealing in the exact model starts here (s of makespan)
constexpr double kPolishTemperatureS = 0.2;  // the reference-mode polish starts cooler: it refines, not explores

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string describe(const Problem& p, const SchedulerOptions& o, const std::string& what) {
  return what + ": " + std::to_string(p.stages) + " stages, " + std::to_string(p.per_path + 1) +
         " per path (stage 0 included), " + std::to_string(p.data_nodes.size()) + " data nodes x " +
         std::to_string(p.per_data_node) + " micro-batches, " + std::to_string(p.groups) +
         " routes per data node, C = " +
         std::to_string(p.memory) + ", swaps <= " + std::to_string(p.max_swaps) + ", seed " + std::to_string(o.seed);
}

}  // namespace

// Both simulators on the finished schedule; the exact one must finish it (a deadlocked result is a bug upstream).
SchedulerResult finish_result(const Problem& p, const Plan& plan, const std::string& method,
                              const std::string& description, std::chrono::steady_clock::time_point t0) {
  SchedulerResult r;
  r.schedule = to_schedule(p, plan, method, description);
  r.groups_per_data_node = p.groups;
  r.exact_s = simulate_exact(p.setting, r.schedule).iteration_time_s;
  const SimResult ref = simulate_reference(p.setting, r.schedule);
  r.reference_s = ref.stranded > 0 ? std::numeric_limits<double>::infinity() : ref.iteration_time_s;
  r.wall_s = seconds_since(t0);
  return r;
}

void check_scheduler_options(const SchedulerOptions& o) {
  auto at_least = [](int64_t value, int64_t low, const char* flag) {
    if (value < low) throw InputError(std::string(flag) + " " + std::to_string(value) + ": expected >= " + std::to_string(low));
  };
  at_least(o.iterations, 0, "--iterations");
  at_least(o.memory, 0, "--memory");
  if (o.memory > kMaxMemoryCapacity) {
    throw InputError("--memory " + std::to_string(o.memory) + ": expected at most " +
                     std::to_string(kMaxMemoryCapacity) + " (as a setting's memory_capacity; 0 = the setting's)");
  }
  at_least(o.max_swaps, 0, "--swaps");
  at_least(o.data_nodes, 0, "--data-nodes");
  at_least(o.placement_iterations, 0, "--placement-iterations");
  at_least(o.micro_batches_per_data_node, 1, "--micro-batches-per-data-node");
  if (!(o.budget_s >= 0)) throw InputError("--budget-s " + std::to_string(o.budget_s) + ": expected >= 0 (0 = no cap)");
  if (o.placement && o.stages != 0 && o.stages != static_cast<int>(o.placement->size())) {
    throw InputError("--stages " + std::to_string(o.stages) + " with a placement of " +
                     std::to_string(o.placement->size()) + " stages: give one or the other");
  }
}

SchedulerResult schedule_skippipe(const Setting& setting, const SchedulerOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  check_scheduler_options(o);
  // --budget-s caps the whole search: half for the placement when one is searched, the rest shared over the route
  // groupings still to try (what one leaves goes to the next).
  const std::vector<std::vector<int>> placement =
      o.placement ? *o.placement : search_placement(setting, o, o.budget_s / 2);
  const std::vector<int64_t> group_counts = feasible_group_counts(setting, o, placement);
  std::mt19937_64 rng(o.seed);
  const int64_t share = o.iterations / static_cast<int64_t>(group_counts.size());
  std::optional<Problem> best_p;
  Plan best_plan;
  Score best{std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  int64_t moves = 0, improvements = 0;
  for (size_t i = 0; i < group_counts.size(); ++i) {
    Problem p = make_problem(setting, o, placement, group_counts[i]);
    const int64_t its = share + (i == 0 ? o.iterations % static_cast<int64_t>(group_counts.size()) : 0);
    // The exact model searches; with --score reference, the second half polishes in the reference model from the
    // exact model's best, at a lower temperature.
    const bool polish = o.score_mode == SimMode::kReference;
    const double budget =
        o.budget_s > 0 ? std::max(1e-3, (o.budget_s - seconds_since(t0)) / static_cast<double>(group_counts.size() - i))
                       : 0.0;
    p.score_mode = SimMode::kExact;
    Plan plan = local_search(p, greedy_plan(p), rng, polish ? its / 2 : its, polish ? budget / 2 : budget,
                             kStartTemperatureS, moves, improvements);
    p.score_mode = o.score_mode;
    if (polish) {
      plan = local_search(p, plan, rng, its - its / 2, budget / 2, kPolishTemperatureS, moves, improvements);
    }
    const Score s = score_plan(p, plan);
    if (!best_p || s.better_than(best)) best_p = std::move(p), best_plan = std::move(plan), best = s;
  }
  if (!std::isfinite(best.makespan_s)) {
    throw InputError("no deadlock-free schedule found in " + std::to_string(o.iterations) +
                     " moves (raise --memory or --iterations)");
  }
  SchedulerResult r = finish_result(*best_p, best_plan, "skippipe",
                                    describe(*best_p, o, "dloco SkipPipe scheduler (collision-aware, " +
                                                             std::string(to_string(o.score_mode)) + "-scored)"),
                                    t0);
  r.iterations_run = moves;
  r.improvements = improvements;
  return r;
}

SchedulerResult schedule_oblivious(const Setting& setting, const SchedulerOptions& o) {
  check_scheduler_options(o);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::vector<int>> placement =
      o.placement ? *o.placement : search_placement(setting, o, o.budget_s);
  const std::vector<int64_t> group_counts = feasible_group_counts(setting, o, placement);
  const Problem p = make_problem(setting, o, placement, group_counts.front());
  std::mt19937_64 rng(o.seed);
  // The first random plan that does not deadlock: drawing the best of several would consult the simulator.
  for (int attempt = 0; attempt < 64; ++attempt) {
    const Plan plan = random_plan(p, rng);
    Problem exact = p;
    exact.score_mode = SimMode::kExact;
    if (!std::isfinite(score_plan(exact, plan).makespan_s)) continue;
    return finish_result(p, plan, "oblivious", describe(p, o, "network-oblivious skip baseline (random subsets and "
                                                               "replicas, equal visits)"), t0);
  }
  throw InputError("64 random skip schedules all deadlock in the exact model (raise --memory)");
}

std::string check_schedule_rules(const Schedule& schedule, const Setting& setting, const SchedulerOptions& o) {
  const int64_t s_count = static_cast<int64_t>(schedule.placement.size());
  const int64_t m = path_stage_count(s_count, o.skip) - 1;
  const int64_t c = o.memory > 0 ? o.memory : setting.memory_capacity;
  std::map<int, std::set<std::vector<int>>> routes;  // node -> the distinct routes (data node, path) through it
  for (const MicroBatch& mb : schedule.micro_batches) {
    const std::string who = "micro-batch " + std::to_string(mb.id);
    if (schedule.stage_of_node[mb.data_node] != 0) return who + " starts outside stage 0";
    if (static_cast<int64_t>(mb.path.size()) != m) {
      return who + " visits " + std::to_string(mb.path.size()) + " non-zero stages, expected " + std::to_string(m);
    }
    std::vector<int> stages, route{mb.data_node};
    for (int node : mb.path) stages.push_back(schedule.stage_of_node[node]), route.push_back(node);
    if (std::set<int>(stages.begin(), stages.end()).size() != stages.size()) return who + " repeats a stage";
    for (int st : stages) {
      if (st <= 0) return who + " visits stage " + std::to_string(st) + " on its path";
    }
    if (inversions(stages) > o.max_swaps) {
      return who + " has " + std::to_string(inversions(stages)) + " stage inversions, allowed " +
             std::to_string(o.max_swaps);
    }
    for (int node : route) routes[node].insert(route);
  }
  const std::vector<int64_t> visits = visits_per_stage(schedule);
  for (int64_t st = 2; st < s_count; ++st) {
    if (visits[st] != visits[1]) {
      return "stage " + std::to_string(st) + " gets " + std::to_string(visits[st]) + " visits, stage 1 gets " +
             std::to_string(visits[1]);
    }
  }
  for (const auto& [node, set] : routes) {
    if (static_cast<int64_t>(set.size()) > c) {
      return "node " + std::to_string(node) + " lies on " + std::to_string(set.size()) + " routes, C = " +
             std::to_string(c);
    }
  }
  return "";
}

nlohmann::json schedule_to_json(const Schedule& schedule, const std::vector<std::string>& notes) {
  nlohmann::json mbs = nlohmann::json::array();
  for (const MicroBatch& mb : schedule.micro_batches) {
    mbs.push_back({{"id", mb.id}, {"data_node", mb.data_node}, {"path", mb.path}, {"inject_s", mb.inject_s}});
  }
  nlohmann::json j = {{"format", "dloco-skippipe-schedule"}, {"version", 1}, {"source", schedule.source},
                      {"method", schedule.method}};
  if (!schedule.description.empty()) j["description"] = schedule.description;
  if (!notes.empty()) j["notes"] = notes;
  if (schedule.reference_iteration_time_s) j["reference_iteration_time_s"] = *schedule.reference_iteration_time_s;
  j["placement"] = schedule.placement;
  j["micro_batches"] = mbs;
  return j;
}

}  // namespace dloco::skippipe
