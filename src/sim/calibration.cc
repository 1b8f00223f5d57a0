// Fitting the shared knobs on the paper's DP rows, and predicting the whole grid.
#include "sim/calibration.h"

#include <cmath>

#include "sim/goodput_sim.h"
#include "sim/optimize.h"

namespace dloco::sim {

const std::vector<PaperRow>& paper_goodput_rows() {
  static const std::vector<PaperRow> kRows = {
      {"DP, no elasticity", Method::kDp, 1, {72, 57, 38, 27, 18}, true},
      {"DP, elastic", Method::kElasticDp, 1, {88, 80, 69, 58, 40}, true},
      {"Decoupled, M = 2", Method::kDecoupled, 2, {94, 88, 80, 70, 54}, false},
      {"Decoupled, M = 4", Method::kDecoupled, 4, {96, 93, 89, 82, 73}, false},
      {"Decoupled, M = 8", Method::kDecoupled, 8, {98, 96, 94, 88, 80}, false},
      {"Decoupled, M = 16", Method::kDecoupled, 16, {99, 98, 96, 93, 86}, false},
  };
  return kRows;
}

namespace {

// Sum over the row's cells of (simulated − paper)², points².
double row_error(GoodputConfig config, const PaperRow& row) {
  config.method = row.method;
  config.learners = row.learners;
  config.quorum = 1;
  double sum = 0.0;
  for (size_t i = 0; i < kPaperChips.size(); ++i) {
    config.chips = kPaperChips[i];
    const double diff = 100.0 * simulate_goodput(config).goodput - row.goodput_pct[i];
    sum += diff * diff;
  }
  return sum;
}

// Fits the named knobs (in log space, so they stay positive) on one row; returns the rms residual, points.
double fit_row(GoodputConfig& config, const PaperRow& row, const std::vector<std::string>& names,
               const FitOptions& options, int& evaluations) {
  std::vector<double> x0, step;
  for (const std::string& name : names) {
    x0.push_back(std::log(std::max(get_knob(config, name), 1e-3)));
    step.push_back(0.7);
  }
  auto objective = [&](const std::vector<double>& x) {
    GoodputConfig trial = config;
    for (size_t i = 0; i < names.size(); ++i) set_knob(trial, names[i], std::exp(x[i]));
    return row_error(trial, row);
  };
  const MinimizeResult best = nelder_mead(objective, x0, step, options.max_evaluations, 1e-3);
  evaluations += best.evaluations;
  for (size_t i = 0; i < names.size(); ++i) set_knob(config, names[i], std::exp(best.x[i]));
  return std::sqrt(best.value / static_cast<double>(kPaperChips.size()));
}

}  // namespace

DpFit fit_dp_rows(const GoodputConfig& base, const FitOptions& options) {
  GoodputConfig config = base;
  config.horizon_s = options.horizon_s;
  const std::vector<PaperRow>& rows = paper_goodput_rows();
  DpFit fit;
  const std::vector<std::string> dp_knobs = {"restart_s"};
  const std::vector<std::string> elastic_knobs = {"downscale_s", "upscale_s", "upscale_batch_s"};
  fit.dp_rms_pts = fit_row(config, rows[0], dp_knobs, options, fit.evaluations);
  fit.elastic_rms_pts = fit_row(config, rows[1], elastic_knobs, options, fit.evaluations);
  for (const std::string& name : dp_knobs) fit.knobs.push_back({name, get_knob(config, name), rows[0].label});
  for (const std::string& name : elastic_knobs) fit.knobs.push_back({name, get_knob(config, name), rows[1].label});
  return fit;
}

std::vector<GridCell> predict_paper_grid(const GoodputConfig& calibrated, double horizon_s) {
  std::vector<GridCell> cells;
  for (const PaperRow& row : paper_goodput_rows()) {
    GoodputConfig config = calibrated;
    config.horizon_s = horizon_s;
    config.method = row.method;
    config.learners = row.learners;
    config.quorum = 1;
    for (size_t i = 0; i < kPaperChips.size(); ++i) {
      config.chips = kPaperChips[i];
      const GoodputResult r = simulate_goodput(config);
      cells.push_back({row.label, row.method, row.learners, kPaperChips[i], row.goodput_pct[i], 100.0 * r.goodput,
                       100.0 * r.uptime, row.fit_row});
    }
  }
  return cells;
}

}  // namespace dloco::sim
