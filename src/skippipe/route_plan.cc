// The scheduler's problem arithmetic and its two constructions (route_plan.h): the checks that make equal visits and
// at most C routes per node possible, the network-aware greedy (cheapest feasible route per group by dynamic
// programming over the stages) and the network-oblivious random construction, and a plan's schedule and score.
// Both constructions keep every stage's remaining route visits feasible: with R routes left, a stage that still
// needs R visits is mandatory for the next route, which is exactly what keeps "every stage the same count" reachable
// (sum of quotas = R·m and no quota above R).
// The greedy serves the data nodes hardest first (the most expensive cheapest route first).
// Deliberately not here: the local search (local_search.cc), placement search and the full pipeline (placement.cc).
#include "skippipe/route_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/stages_per_path.h"

namespace dloco::skippipe {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string str(int64_t v) { return std::to_string(v); }

int64_t memory_of(const Setting& setting, const SchedulerOptions& o) {
  return o.memory > 0 ? o.memory : setting.memory_capacity;
}

int64_t data_node_count(const SchedulerOptions& o, const std::vector<std::vector<int>>& placement) {
  const int64_t avail = static_cast<int64_t>(placement[0].size());
  if (o.data_nodes < 0 || o.data_nodes > avail) {
    throw InputError("--data-nodes " + str(o.data_nodes) + ": stage 0 has " + str(avail) + " nodes");
  }
  return o.data_nodes == 0 ? avail : o.data_nodes;
}

// Why group count G does not fit, or "".
std::string group_count_problem(const Setting& setting, const SchedulerOptions& o,
                                const std::vector<std::vector<int>>& placement, int64_t groups) {
  const int64_t n = o.micro_batches_per_data_node, c = memory_of(setting, o);
  const int64_t s = static_cast<int64_t>(placement.size());
  const int64_t m = path_stage_count(s, o.skip) - 1, d = data_node_count(o, placement);
  if (groups < 1 || n % groups != 0) return "G = " + str(groups) + " does not divide N = " + str(n);
  if (groups > c) return "G = " + str(groups) + " routes per data node exceed C = " + str(c);
  if ((d * groups * m) % (s - 1) != 0) {
    return "G = " + str(groups) + ": D·G·m = " + str(d * groups * m) + " route visits do not split evenly over " +
           str(s - 1) + " stages";
  }
  const int64_t visits = d * groups * m / (s - 1);
  for (int64_t st = 1; st < s; ++st) {
    const int64_t cap = c * static_cast<int64_t>(placement[st].size());
    if (visits > cap) {
      return "G = " + str(groups) + ": stage " + str(st) + " needs " + str(visits) + " route visits but its " +
             str(static_cast<int64_t>(placement[st].size())) + " nodes carry at most C·replicas = " + str(cap);
    }
  }
  return "";
}

void check_placement(const Setting& setting, const std::vector<std::vector<int>>& placement) {
  if (placement.size() < 2) throw InputError("a placement needs stage 0 and at least one other stage");
  std::vector<int> seen(setting.nodes.size(), 0);
  for (size_t s = 0; s < placement.size(); ++s) {
    if (placement[s].empty()) throw InputError("placement: stage " + str(static_cast<int64_t>(s)) + " has no node");
    for (int node : placement[s]) {
      if (node < 0 || node >= setting.node_count()) {
        throw InputError("placement: node " + str(node) + " is not in the setting (" + str(setting.node_count()) +
                         " nodes)");
      }
      if (seen[node]++) throw InputError("placement: node " + str(node) + " is in two stages");
    }
  }
}

}  // namespace

int64_t path_stage_count(int64_t stages, double skip) {
  if (!(skip >= 0.0 && skip < 1.0)) throw InputError("--skip " + std::to_string(skip) + ": expected 0 <= k < 1");
  const int64_t p = stages_per_path(stages, skip);
  if (p < 2) {
    throw InputError("--skip " + std::to_string(skip) + " with " + str(stages) + " stages leaves round(S·(1 − k)) = " +
                     str(p) + " stages per path: no non-zero stage to visit (lower the skip ratio)");
  }
  return std::min(p, stages);
}

bool Score::no_worse_than(const Score& o) const {
  if (makespan_s != o.makespan_s) return makespan_s < o.makespan_s;
  return sum_finish_s <= o.sum_finish_s;
}

bool Score::better_than(const Score& o) const {
  if (makespan_s != o.makespan_s) return makespan_s < o.makespan_s;
  return sum_finish_s < o.sum_finish_s;
}

std::vector<int64_t> feasible_group_counts(const Setting& setting, const SchedulerOptions& o,
                                           const std::vector<std::vector<int>>& placement) {
  check_placement(setting, placement);
  const int64_t s = static_cast<int64_t>(placement.size());
  const int64_t m = path_stage_count(s, o.skip) - 1, d = data_node_count(o, placement);
  const int64_t n = o.micro_batches_per_data_node;
  if (n < 1) throw InputError("--micro-batches-per-data-node " + str(n) + ": expected at least 1");
  if (memory_of(setting, o) < 1) throw InputError("--memory " + str(o.memory) + ": expected C >= 1");
  if ((n * d * m) % (s - 1) != 0) {
    throw InputError("equal visits are impossible: " + str(d) + " data nodes x " + str(n) + " micro-batches x " +
                     str(m) + " stages per path = " + str(n * d * m) + " visits do not divide evenly over the " +
                     str(s - 1) + " non-zero stages (change --micro-batches-per-data-node or --skip)");
  }
  std::vector<int64_t> out;
  std::string reasons;
  for (int64_t g = std::min(n, memory_of(setting, o)); g >= 1; --g) {
    const std::string why = group_count_problem(setting, o, placement, g);
    if (why.empty()) {
      out.push_back(g);
    } else if (n % g == 0) {
      reasons += "; " + why;
    }
  }
  if (out.empty()) {
    throw InputError("no route grouping keeps every node on at most C = " + str(memory_of(setting, o)) +
                     " routes with equal visits" + reasons + " (raise --memory or change the micro-batch count)");
  }
  return out;
}

Problem make_problem(const Setting& setting, const SchedulerOptions& o, const std::vector<std::vector<int>>& placement,
                     int64_t groups) {
  check_placement(setting, placement);
  const std::string why = group_count_problem(setting, o, placement, groups);
  if (!why.empty()) throw InputError("cannot schedule: " + why);
  Problem p;
  p.setting = setting;
  p.memory = memory_of(setting, o);
  p.setting.memory_capacity = p.memory;
  p.placement = placement;
  p.stage_of_node.assign(setting.nodes.size(), -1);
  for (size_t s = 0; s < placement.size(); ++s) {
    for (int node : placement[s]) p.stage_of_node[node] = static_cast<int>(s);
  }
  const int64_t d = data_node_count(o, placement);
  p.data_nodes.assign(placement[0].begin(), placement[0].begin() + d);
  p.stages = static_cast<int>(placement.size());
  p.per_path = static_cast<int>(path_stage_count(p.stages, o.skip) - 1);
  p.per_data_node = o.micro_batches_per_data_node;
  p.groups = groups;
  p.max_swaps = o.max_swaps;
  p.group_visits = d * groups * p.per_path / (p.stages - 1);
  p.score_mode = o.score_mode;
  return p;
}

namespace {

// Construction state shared by the greedy and the random route choice.
struct Build {
  std::vector<int64_t> quota;  // stage -> route visits still owed
  std::vector<int64_t> load;   // node -> routes through it
  int64_t remaining = 0;       // routes still to build
};

// The cheapest feasible route from data node `d` (dynamic programming over stages 1 … S − 1, in order):
// 2·(hops d -> n_1 -> … -> n_m -> d) + compute (1 + backward_factor)·w per node + a load penalty of the work
// already routed through each node (a proxy for the waits the simulator will charge).
Route cheapest_route(const Problem& p, const Build& b, int d) {
  const Setting& st = p.setting;
  const int n = static_cast<int>(st.nodes.size()), m = p.per_path, s_count = p.stages;
  const double per_route = static_cast<double>(p.per_data_node / p.groups);
  auto node_cost = [&](int u) {
    const double work = (1.0 + st.backward_factor) * st.nodes[u].forward_s;
    return work + static_cast<double>(b.load[u]) * per_route * work;
  };
  // f[s][k][v]: the cheapest partial route over stages 1..s with k stages chosen, ending at node v.
  const size_t layer = static_cast<size_t>((m + 1) * n);
  std::vector<double> f(static_cast<size_t>(s_count) * layer, kInf);
  std::vector<int> from(f.size(), -1);  // the previous node (taken) or -2 (stage skipped)
  auto at = [&](int s, int k, int v) { return static_cast<size_t>(s) * layer + static_cast<size_t>(k * n + v); };
  f[at(0, 0, d)] = 0.0;
  for (int s = 1; s < s_count; ++s) {
    const bool mandatory = b.quota[s] == b.remaining, open = b.quota[s] > 0;
    for (int k = 0; k <= m; ++k) {
      for (int v = 0; v < n; ++v) {
        const double base = f[at(s - 1, k, v)];
        if (base == kInf) continue;
        if (!mandatory && base < f[at(s, k, v)]) {
          f[at(s, k, v)] = base;
          from[at(s, k, v)] = -2;
        }
        if (!open || k == m) continue;
        for (int u : p.placement[s]) {
          if (b.load[u] >= p.memory) continue;
          const double c = base + 2.0 * st.hop_s(v, u) + node_cost(u);
          if (c < f[at(s, k + 1, u)]) {
            f[at(s, k + 1, u)] = c;
            from[at(s, k + 1, u)] = v;
          }
        }
      }
    }
  }
  int best = -1;
  double best_c = kInf;
  for (int v = 0; v < n; ++v) {
    const double c = f[at(s_count - 1, m, v)] + 2.0 * st.hop_s(v, d);
    if (c < best_c) best_c = c, best = v;
  }
  DLOCO_CHECK(best >= 0);  // the quotas guarantee a feasible route (file header)
  Route r;
  r.data_node = d;
  for (int s = s_count - 1, k = m, v = best; s >= 1; --s) {
    const int prev = from[at(s, k, v)];
    if (prev == -2) continue;
    r.stages.push_back(s);
    r.nodes.push_back(v);
    v = prev, --k;
  }
  std::reverse(r.stages.begin(), r.stages.end());
  std::reverse(r.nodes.begin(), r.nodes.end());
  return r;
}

// A random feasible route: the mandatory stages plus a random draw of the other owed ones, a random replica with
// room in each.
Route random_route(const Problem& p, const Build& b, int d, std::mt19937_64& rng) {
  std::vector<int> chosen, optional;
  for (int s = 1; s < p.stages; ++s) {
    if (b.quota[s] == b.remaining) {
      chosen.push_back(s);
    } else if (b.quota[s] > 0) {
      optional.push_back(s);
    }
  }
  DLOCO_CHECK_LE(chosen.size(), static_cast<size_t>(p.per_path));
  while (chosen.size() < static_cast<size_t>(p.per_path)) {
    const size_t i = draw_below(rng, optional.size());
    chosen.push_back(optional[i]);
    optional.erase(optional.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::sort(chosen.begin(), chosen.end());
  Route r;
  r.data_node = d;
  r.stages = chosen;
  for (int s : chosen) {
    std::vector<int> room;
    for (int u : p.placement[s]) {
      if (b.load[u] < p.memory) room.push_back(u);
    }
    DLOCO_CHECK(!room.empty());  // a stage's capacity C·replicas covers its quota (make_problem)
    r.nodes.push_back(room[draw_below(rng, room.size())]);
  }
  return r;
}

// The order in which data nodes get their routes: the one whose cheapest route (on an empty network) is the most
// expensive first, so the data node that bounds the makespan is not left with the leftovers (ties: stage-0 order).
std::vector<int64_t> hardest_first(const Problem& p, const Build& empty) {
  std::vector<std::pair<double, int64_t>> cost;
  for (size_t di = 0; di < p.data_nodes.size(); ++di) {
    const Route r = cheapest_route(p, empty, p.data_nodes[di]);
    double c = 0.0;
    int prev = r.data_node;
    for (int u : r.nodes) c += p.setting.hop_s(prev, u), prev = u;
    c += p.setting.hop_s(prev, r.data_node);
    cost.emplace_back(-c, static_cast<int64_t>(di));
  }
  std::stable_sort(cost.begin(), cost.end());
  std::vector<int64_t> order;
  for (const auto& [c, di] : cost) order.push_back(di);
  return order;
}

Plan construct(const Problem& p, std::mt19937_64* rng) {
  const int64_t d_count = static_cast<int64_t>(p.data_nodes.size());
  Build b;
  b.quota.assign(p.stages, p.group_visits);
  b.quota[0] = 0;
  b.load.assign(p.setting.nodes.size(), 0);
  for (int d : p.data_nodes) b.load[d] = p.groups;
  b.remaining = d_count * p.groups;
  std::vector<int64_t> order(static_cast<size_t>(d_count));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!rng) {
    Build empty = b;
    empty.remaining = std::numeric_limits<int64_t>::max();  // nothing mandatory
    order = hardest_first(p, empty);
  }
  Plan plan;
  plan.routes.resize(static_cast<size_t>(b.remaining));
  for (int64_t g = 0; g < p.groups; ++g) {
    for (int64_t di : order) {
      const int d = p.data_nodes[di];
      Route r = rng ? random_route(p, b, d, *rng) : cheapest_route(p, b, d);
      for (size_t k = 0; k < r.stages.size(); ++k) {
        --b.quota[r.stages[k]];
        ++b.load[r.nodes[k]];
      }
      --b.remaining;
      plan.routes[di * p.groups + g] = std::move(r);
    }
  }
  for (int64_t di = 0; di < d_count; ++di) {
    const double w = p.setting.nodes[p.data_nodes[di]].forward_s;
    for (int64_t j = 0; j < p.per_data_node; ++j) {
      plan.group_of.push_back(static_cast<int>(di * p.groups + j % p.groups));
      plan.inject_s.push_back(std::round(static_cast<double>(j) * w * 100.0) / 100.0);
    }
  }
  return plan;
}

}  // namespace

Plan greedy_plan(const Problem& p) { return construct(p, nullptr); }

Plan random_plan(const Problem& p, std::mt19937_64& rng) { return construct(p, &rng); }

Schedule to_schedule(const Problem& p, const Plan& plan, const std::string& method, const std::string& description) {
  Schedule s;
  s.source = "dloco skippipe schedule";
  s.method = method;
  s.description = description;
  s.placement = p.placement;
  s.stage_of_node = p.stage_of_node;
  std::vector<size_t> order(plan.inject_s.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plan.inject_s[a] < plan.inject_s[b]; });
  for (size_t i : order) {
    const Route& r = plan.routes[plan.group_of[i]];
    s.micro_batches.push_back({static_cast<int64_t>(i), r.data_node, r.nodes, plan.inject_s[i]});
  }
  return s;
}

Score score_plan(const Problem& p, const Plan& plan) {
  const Schedule s = to_schedule(p, plan, "candidate", "");
  try {
    const SimResult r = simulate(p.score_mode, p.setting, s);
    if (r.stranded > 0) return {kInf, kInf};
    return {r.iteration_time_s, std::accumulate(r.finish_s.begin(), r.finish_s.end(), 0.0)};
  } catch (const InputError& e) {
    // A deadlock (simulate_exact's only refusal of a well-formed schedule) is never a candidate; anything else is a
    // bug in the plan and must not be hidden as "no deadlock-free schedule found".
    if (std::string(e.what()).find("deadlocks in the exact model") == std::string::npos) throw;
    return {kInf, kInf};
  }
}

int64_t inversions(const std::vector<int>& stages) {
  int64_t count = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    for (size_t j = i + 1; j < stages.size(); ++j) count += stages[i] > stages[j] ? 1 : 0;
  }
  return count;
}

}  // namespace dloco::skippipe
