// The scheduler's working state (internal to src/skippipe; scheduler.h is the public face): the problem after its
// arithmetic is checked (stages, path length, groups, quotas) and a plan of routes being searched — one route per
// group of micro-batches, one injection time per micro-batch — with the pieces the scheduler, the baselines and the
// placement search share: the greedy and random constructions, the local search and the conversion to a Schedule.
// Deliberately not here: flag parsing, file formats, wall clocks in decisions.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "skippipe/scheduler.h"

namespace dloco::skippipe {

/// The scheduling problem with its arithmetic checked (see make_problem).
struct Problem {
  Setting setting;                          // the setting, memory_capacity = C (what the search simulates)
  std::vector<std::vector<int>> placement;  // stage -> nodes
  std::vector<int> stage_of_node;           // node -> stage, -1 when unplaced
  std::vector<int> data_nodes;              // the first D nodes of stage 0
  int stages = 0;                           // S
  int per_path = 0;                         // m = P − 1: non-zero stages on every path
  int64_t per_data_node = 0;                // N
  int64_t groups = 0;                       // G: routes per data node; a route carries N / G micro-batches
  int64_t memory = 0;                       // C
  int64_t max_swaps = 0;
  int64_t group_visits = 0;                 // route visits every non-zero stage receives: D·G·m / (S − 1)
  SimMode score_mode = SimMode::kExact;
};

/// One route: its data node and the non-zero stages it visits with the node serving each, in visiting order.
struct Route {
  int data_node = 0;
  std::vector<int> stages;
  std::vector<int> nodes;
};

/// Routes (index = data node index · G + group) plus, per micro-batch (index = data node index · N + j), its group
/// and its injection time.
struct Plan {
  std::vector<Route> routes;
  std::vector<int> group_of;       // micro-batch -> route index
  std::vector<double> inject_s;    // micro-batch -> injection time (s)
};

/// A plan's simulated score: lower is better, compared as (makespan, sum of finish times).
struct Score {
  double makespan_s = 0.0;
  double sum_finish_s = 0.0;
  bool no_worse_than(const Score& o) const;
  bool better_than(const Score& o) const;
};

/// The problem for `placement` and the options, with group count `groups`. InputError for impossible arithmetic.
Problem make_problem(const Setting& setting, const SchedulerOptions& options,
                     const std::vector<std::vector<int>>& placement, int64_t groups);
/// The group counts G that meet the arithmetic (G | N, G ≤ C, D·G·m divisible by S − 1, every stage's route
/// visits within C per replica), largest first; InputError with the reason when there is none.
std::vector<int64_t> feasible_group_counts(const Setting& setting, const SchedulerOptions& options,
                                           const std::vector<std::vector<int>>& placement);

/// Network-aware construction: per route (round robin over data nodes), the cheapest feasible one by dynamic
/// programming over the stages (hop costs there and back, plus a penalty for nodes already loaded).
Plan greedy_plan(const Problem& p);
/// Network-oblivious construction: stage subsets and replicas drawn at random under the same constraints.
Plan random_plan(const Problem& p, std::mt19937_64& rng);

/// The schedule of a plan (micro-batch id = its index, listed in injection order).
Schedule to_schedule(const Problem& p, const Plan& plan, const std::string& method, const std::string& description);
/// The plan's score in the problem's score mode; a deadlocking plan scores +infinity.
Score score_plan(const Problem& p, const Plan& plan);

/// Simulated annealing from `plan` (local_search.cc's moves) in the problem's score mode, the temperature falling
/// from start_temperature_s (s of makespan) to 0.005 s, at most `iterations` moves and, when budget_s > 0, at most
/// that much wall time. Returns the best plan seen; counts moves and strict improvements of the best.
Plan local_search(const Problem& p, Plan plan, std::mt19937_64& rng, int64_t iterations, double budget_s,
                  double start_temperature_s, int64_t& moves, int64_t& improvements);

/// The scheduler's answer for a finished plan: its schedule and both simulators' times; wall_s from `t0`.
SchedulerResult finish_result(const Problem& p, const Plan& plan, const std::string& method,
                              const std::string& description, std::chrono::steady_clock::time_point t0);

/// Inversions of a stage order (adjacent exchanges needed to sort it).
int64_t inversions(const std::vector<int>& stages);

}  // namespace dloco::skippipe
