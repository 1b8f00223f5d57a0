// Derivative-free minimisation (Nelder–Mead simplex) for fitting simulator knobs. Deterministic: no random
// restarts, so the same objective gives the same fit.
// Deliberately not here: constraints (fit in log space for positive knobs) and anything gradient-based.
#pragma once

#include <functional>
#include <vector>

namespace dloco::sim {

/// Outcome of a minimisation: the best point, its objective value and how many evaluations it took.
struct MinimizeResult {
  std::vector<double> x;
  double value = 0.0;
  int evaluations = 0;
};

/// Minimises f starting from x0 with initial simplex steps `step` (same length as x0), stopping after
/// `max_evaluations` or when the simplex's values differ by less than `tolerance` (same unit as f).
MinimizeResult nelder_mead(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x0,
                           const std::vector<double>& step, int max_evaluations = 200, double tolerance = 1e-4);

}  // namespace dloco::sim
