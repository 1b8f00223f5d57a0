// Text output of the simulators: console tables, CSV and JSON of goodput runs, the calibration grid and the
// bandwidth tables. Pure formatting (strings in, strings out); the only I/O here is plot(), which writes a data
// file and a gnuplot script and runs gnuplot.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/advise.h"
#include "sim/bandwidth.h"
#include "sim/calibration.h"
#include "sim/goodput_sim.h"

namespace dloco::sim {

/// One simulated run and the config it ran with.
struct GoodputRun {
  GoodputConfig config;
  GoodputResult result;
};

/// Output formats of `dloco sim goodput`.
enum class Format { kTable, kCsv, kJson };
Format parse_format(std::string_view name);  // "table" | "csv" | "json"; InputError otherwise

/// Runs as a console table (method, M, K, chips, goodput %, uptime %, failures, pauses, lost chip-hours),
/// CSV with a header row, or JSON: one object for one run, an array for several.
std::string format_runs(const std::vector<GoodputRun>& runs, Format format);

/// The calibration grid: one line per row, "predicted (paper, ±diff)" per cell, rows used in the fit marked,
/// and the largest |difference| over the Decoupled cells.
std::string format_grid(const std::vector<GridCell>& cells);
/// The grid as CSV: row,method,learners,chips,paper_pct,predicted_pct,diff_pts,uptime_pct,fit_row.
std::string format_grid_csv(const std::vector<GridCell>& cells);

/// The fit: each knob, the row it was fitted on, and the residuals.
std::string format_fit(const DpFit& fit);

/// Table 4 reproduction: per row and CU target, our bandwidth, its value on the paper's grid, the paper's,
/// and the difference in %; then a summary count.
std::string format_table4();
/// A codec's measured size on the wire for the reference points: `bytes` that encode `values` values.
struct CodecSize {
  std::string name;  // as the config names it ("q8", "q4")
  int64_t values = 0;
  int64_t bytes = 0;
};
/// The spec's reference points (5B, 1 s step): DP at 90% CU, Decoupled bf16 and int4; then, for each of `codecs`
/// (dloco's own codecs, sized by transport/codec.h for one fragment of the reference's P = 24), the bandwidth that
/// hides that fragment's transfer behind τ = 2 steps.
std::string format_reference_points(const std::vector<CodecSize>& codecs = {});

/// `dloco sim advise` answers.
std::string format_learner_advice(const LearnerAdvice& advice, double target_goodput, double target_uptime);
std::string format_link_advice(const std::vector<LinkOption>& options, double link_gbps, double target_cu);

/// A line of a plot: x values, y values (same length), and its title.
struct PlotSeries {
  std::string title;
  std::vector<double> x;
  std::vector<double> y;
  bool points_only = false;  // draw as markers (e.g. the paper's cells), else lines with markers
};

/// Draws the series with gnuplot into `out` (.png or .svg, chosen by extension), x on a log axis.
/// Writes `out` + ".dat" and `out` + ".gp" beside it so the plot can be redrawn by hand. Throws InputError if
/// gnuplot is not on PATH (install Debian's gnuplot-nox) or exits with an error.
void plot(const std::vector<PlotSeries>& series, const std::string& title, const std::string& xlabel,
          const std::string& ylabel, bool log_y, const std::filesystem::path& out);

}  // namespace dloco::sim
