// Honest calibration of the goodput simulator against the paper's grid (docs/sim.md):
// the knobs shared by all methods are fitted on the two DP rows only; the Decoupled rows are then
// predictions, reported beside the paper's cells with the difference in points.
// Deliberately not here: file I/O (goodput_config.h reads and writes calibration files) and printing.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/goodput_config.h"

namespace dloco::sim {

/// Chip counts of the paper's goodput grid.
inline constexpr std::array<int64_t, 5> kPaperChips = {150'000, 300'000, 600'000, 1'200'000, 2'400'000};

/// One row of the paper's goodput grid (goodput %, 1-year chip MTBF).
struct PaperRow {
  std::string label;      // "DP, no elasticity", "Decoupled, M = 4", ...
  Method method;
  int64_t learners;       // M (1 for the DP rows)
  std::array<double, 5> goodput_pct;  // at kPaperChips
  bool fit_row;           // true for the two DP rows, the only ones the fit may see
};

/// The six rows of the spec's table, DP rows first.
const std::vector<PaperRow>& paper_goodput_rows();

/// Fitting budget. The fit runs the simulator itself (no analytic shortcut), with common random numbers.
struct FitOptions {
  double horizon_s = 10.0 * 86400;  // simulated wall time per evaluation
  int max_evaluations = 150;        // per row
};

/// A fitted knob and the row it was fitted on.
struct FittedKnob {
  std::string name;
  double value = 0.0;
  std::string row;
};

/// The fit: knob values and the residual of each DP row (root mean square over its 5 cells, points).
struct DpFit {
  std::vector<FittedKnob> knobs;
  double dp_rms_pts = 0.0;
  double elastic_rms_pts = 0.0;
  int evaluations = 0;
};

/// Fits restart_s on "DP, no elasticity" (checkpoint_interval_s stays fixed: with no checkpoint cost in the
/// model a free interval runs to 0), and downscale_s, upscale_s and
/// upscale_batch_s on "DP, elastic", minimising the squared difference in points; every other knob comes from
/// `base`. Never looks at a Decoupled row. Takes ~10–30 s on one core.
DpFit fit_dp_rows(const GoodputConfig& base, const FitOptions& options = {});

/// One cell of the grid: the paper's value, the simulator's, and whether the cell was used in the fit.
struct GridCell {
  std::string row;
  Method method = Method::kDp;
  int64_t learners = 1;
  int64_t chips = 0;
  double paper_pct = 0.0;
  double predicted_pct = 0.0;
  double uptime_pct = 0.0;
  bool fit_row = false;
  double diff_pts() const { return predicted_pct - paper_pct; }
};

/// Simulates every cell of the paper's grid with `calibrated` (chips, method and learners set per cell,
/// quorum K = 1) over `horizon_s`.
std::vector<GridCell> predict_paper_grid(const GoodputConfig& calibrated, double horizon_s);

}  // namespace dloco::sim
