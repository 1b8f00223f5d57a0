// Nelder–Mead with the standard coefficients (reflection 1, expansion 2, contraction 1/2, shrink 1/2).
#include "sim/optimize.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace dloco::sim {

MinimizeResult nelder_mead(const std::function<double(const std::vector<double>&)>& f, std::vector<double> x0,
                           const std::vector<double>& step, int max_evaluations, double tolerance) {
  const size_t n = x0.size();
  DLOCO_CHECK_EQ(step.size(), n);
  DLOCO_CHECK_GE(n, size_t{1});
  int evals = 0;
  auto eval = [&](const std::vector<double>& x) {
    ++evals;
    return f(x);
  };
  std::vector<std::vector<double>> pts(n + 1, x0);
  for (size_t i = 0; i < n; ++i) pts[i + 1][i] += step[i];
  std::vector<double> vals(n + 1);
  for (size_t i = 0; i <= n; ++i) vals[i] = eval(pts[i]);

  std::vector<size_t> order(n + 1);
  while (evals < max_evaluations) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return vals[a] < vals[b]; });
    const size_t best = order.front(), worst = order.back(), second = order[n - 1];
    if (vals[worst] - vals[best] < tolerance) break;
    std::vector<double> centroid(n, 0.0);
    for (size_t i : order) {
      if (i == worst) continue;
      for (size_t d = 0; d < n; ++d) centroid[d] += pts[i][d] / static_cast<double>(n);
    }
    auto along = [&](double t) {
      std::vector<double> x(n);
      for (size_t d = 0; d < n; ++d) x[d] = centroid[d] + t * (pts[worst][d] - centroid[d]);
      return x;
    };
    const std::vector<double> xr = along(-1.0);
    const double fr = eval(xr);
    if (fr < vals[best]) {
      const std::vector<double> xe = along(-2.0);
      const double fe = eval(xe);
      if (fe < fr) {
        pts[worst] = xe, vals[worst] = fe;
      } else {
        pts[worst] = xr, vals[worst] = fr;
      }
      continue;
    }
    if (fr < vals[second]) {
      pts[worst] = xr, vals[worst] = fr;
      continue;
    }
    const bool outside = fr < vals[worst];
    const std::vector<double> xc = along(outside ? -0.5 : 0.5);
    const double fc = eval(xc);
    if (fc < std::min(fr, vals[worst])) {
      pts[worst] = xc, vals[worst] = fc;
      continue;
    }
    for (size_t i : order) {  // shrink towards the best point
      if (i == best) continue;
      for (size_t d = 0; d < n; ++d) pts[i][d] = pts[best][d] + 0.5 * (pts[i][d] - pts[best][d]);
      vals[i] = eval(pts[i]);
    }
  }
  const size_t best = static_cast<size_t>(std::min_element(vals.begin(), vals.end()) - vals.begin());
  return {pts[best], vals[best], evals};
}

}  // namespace dloco::sim
