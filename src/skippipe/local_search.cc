// The scheduler's local search (route_plan.h): from a plan that keeps every rule, propose one move at a time — each
// move keeps the rules by construction — score the candidate in the simulator and keep it when its
// (makespan, sum of finish times) is no worse, or, by simulated annealing, worse with probability exp(−Δ/T) while
// the temperature T falls; the best plan seen is returned. The moves:
//   1. replica    one hop of one route goes to another replica of its stage (with room under C, else the two
//                 routes exchange their nodes there);
//   2. exchange   two routes exchange one stage each (a in the first only, b in the second only), each taking the
//                 other's node there: every stage's and every node's counts stay the same;
//   3. swap       two neighbouring stages of one route change order (only while its inversions stay ≤ max_swaps);
//   4. shift      one micro-batch's injection time moves by ±{0.1, 0.25, 0.5, 1, 2} s (kept ≥ 0, to 0.01 s);
//   5. regroup    two micro-batches of one data node exchange their routes (G > 1).
// Accepting equal scores lets the search walk plateaus of the makespan; the sum of finish times breaks ties.
// std::exp and std::pow are the only floating-point library calls in a decision (same on one platform).
// Deliberately not here: the constructions and the arithmetic (route_plan.cc).
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/check.h"
#include "skippipe/route_plan.h"

namespace dloco::skippipe {

uint64_t draw_below(std::mt19937_64& rng, uint64_t n) {
  DLOCO_CHECK_GT(n, uint64_t{0});
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;  // reject the top partial block: every residue equally likely
  uint64_t x = rng();
  while (x >= limit) x = rng();
  return x % n;
}

namespace {

constexpr double kT1 = 0.005;  // annealing's final temperature (s of makespan)

int64_t routes_through(const Plan& plan, int node) {
  int64_t count = 0;
  for (const Route& r : plan.routes) count += std::count(r.nodes.begin(), r.nodes.end(), node);
  return count;
}

// Keeps a route's order legal: sorted (with its nodes) when it has more inversions than allowed.
void legalise(const Problem& p, Route& r) {
  if (inversions(r.stages) <= p.max_swaps) return;
  std::vector<std::pair<int, int>> pairs;
  for (size_t k = 0; k < r.stages.size(); ++k) pairs.emplace_back(r.stages[k], r.nodes[k]);
  std::sort(pairs.begin(), pairs.end());
  for (size_t k = 0; k < pairs.size(); ++k) r.stages[k] = pairs[k].first, r.nodes[k] = pairs[k].second;
}

bool move_replica(const Problem& p, Plan& plan, std::mt19937_64& rng) {
  const size_t ri = draw_below(rng, plan.routes.size());
  Route& r = plan.routes[ri];
  const size_t k = draw_below(rng, r.stages.size());
  const std::vector<int>& reps = p.placement[r.stages[k]];
  if (reps.size() < 2) return false;
  const int u = reps[draw_below(rng, reps.size())];
  if (u == r.nodes[k]) return false;
  if (routes_through(plan, u) < p.memory) {
    r.nodes[k] = u;
    return true;
  }
  std::vector<std::pair<size_t, size_t>> users;  // (route, position) serving stage r.stages[k] on u
  for (size_t i = 0; i < plan.routes.size(); ++i) {
    const Route& o = plan.routes[i];
    for (size_t q = 0; q < o.nodes.size(); ++q) {
      if (o.nodes[q] == u) users.emplace_back(i, q);
    }
  }
  if (users.empty()) return false;
  const auto [oi, oq] = users[draw_below(rng, users.size())];
  std::swap(r.nodes[k], plan.routes[oi].nodes[oq]);
  return true;
}

bool move_exchange(const Problem& p, Plan& plan, std::mt19937_64& rng) {
  if (plan.routes.size() < 2) return false;
  const size_t i1 = draw_below(rng, plan.routes.size());
  const size_t i2 = draw_below(rng, plan.routes.size());
  if (i1 == i2) return false;
  Route& r1 = plan.routes[i1];
  Route& r2 = plan.routes[i2];
  auto only_in = [](const Route& a, const Route& b) {
    std::vector<size_t> pos;
    for (size_t k = 0; k < a.stages.size(); ++k) {
      if (std::find(b.stages.begin(), b.stages.end(), a.stages[k]) == b.stages.end()) pos.push_back(k);
    }
    return pos;
  };
  const std::vector<size_t> a = only_in(r1, r2), b = only_in(r2, r1);
  if (a.empty() || b.empty()) return false;
  const size_t k1 = a[draw_below(rng, a.size())], k2 = b[draw_below(rng, b.size())];
  std::swap(r1.stages[k1], r2.stages[k2]);
  std::swap(r1.nodes[k1], r2.nodes[k2]);
  legalise(p, r1);
  legalise(p, r2);
  return true;
}

bool move_swap(const Problem& p, Plan& plan, std::mt19937_64& rng) {
  Route& r = plan.routes[draw_below(rng, plan.routes.size())];
  if (r.stages.size() < 2) return false;
  const size_t k = draw_below(rng, r.stages.size() - 1);
  std::swap(r.stages[k], r.stages[k + 1]);
  std::swap(r.nodes[k], r.nodes[k + 1]);
  return inversions(r.stages) <= p.max_swaps;
}

bool move_shift(Plan& plan, std::mt19937_64& rng) {
  static constexpr double kSteps[] = {0.1, 0.25, 0.5, 1.0, 2.0};
  const size_t i = draw_below(rng, plan.inject_s.size());
  const double step = kSteps[draw_below(rng, 5)] * (draw_below(rng, 2) ? 1.0 : -1.0);
  const double next = std::max(0.0, std::round((plan.inject_s[i] + step) * 100.0) / 100.0);
  if (next == plan.inject_s[i]) return false;
  plan.inject_s[i] = next;
  return true;
}

bool move_regroup(const Problem& p, Plan& plan, std::mt19937_64& rng) {
  if (p.groups < 2) return false;
  const size_t di = draw_below(rng, p.data_nodes.size());
  const size_t base = di * static_cast<size_t>(p.per_data_node);
  const size_t j1 = base + draw_below(rng, p.per_data_node), j2 = base + draw_below(rng, p.per_data_node);
  if (plan.group_of[j1] == plan.group_of[j2]) return false;
  std::swap(plan.group_of[j1], plan.group_of[j2]);
  return true;
}

// One random move applied to `plan`; false when the drawn move does not apply (the plan may then be changed and
// must be dropped).
bool propose(const Problem& p, Plan& plan, std::mt19937_64& rng) {
  const uint64_t kinds = p.max_swaps > 0 ? 5 : 4;
  switch (draw_below(rng, kinds)) {
    case 0: return move_replica(p, plan, rng);
    case 1: return move_exchange(p, plan, rng);
    case 2: return move_shift(plan, rng);
    case 3: return move_regroup(p, plan, rng);
    default: return move_swap(p, plan, rng);
  }
}

}  // namespace

Plan local_search(const Problem& p, Plan plan, std::mt19937_64& rng, int64_t iterations, double budget_s,
                  double start_temperature_s, int64_t& moves, int64_t& improvements) {
  const auto start = std::chrono::steady_clock::now();
  Score current = score_plan(p, plan), best = current;
  Plan best_plan = plan;
  for (int64_t it = 0; it < iterations; ++it) {
    if (budget_s > 0 && it % 32 == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > budget_s) {
      break;  // a wall-clock cap only: which moves are tried never depends on the clock
    }
    Plan candidate = plan;
    if (!propose(p, candidate, rng)) continue;
    ++moves;
    const Score s = score_plan(p, candidate);
    // Annealing: T falls geometrically from start_temperature_s to kT1 over the iterations; a worse candidate is
    // taken with probability exp(−Δ/T), Δ = the makespan's increase (s). u is drawn from 53 random bits, by hand.
    const double t0 = std::max(start_temperature_s, kT1);
    const double t = t0 * std::pow(kT1 / t0, static_cast<double>(it) / static_cast<double>(iterations));
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const double delta = s.makespan_s - current.makespan_s;
    if (!s.no_worse_than(current) && !(std::isfinite(delta) && u < std::exp(-delta / t))) continue;
    plan = std::move(candidate);
    current = s;
    if (current.better_than(best)) {
      best = current;
      best_plan = plan;
      ++improvements;
    }
  }
  return best_plan;
}

}  // namespace dloco::skippipe
