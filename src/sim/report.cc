// Formatting of simulator results, and the gnuplot driver.
#include "sim/report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "core/check.h"

namespace dloco::sim {
namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string pad(const std::string& s, size_t width, bool left = false) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return false;
  std::stringstream dirs(path);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (!dir.empty() && ::access((std::filesystem::path(dir) / program).c_str(), X_OK) == 0) return true;
  }
  return false;
}

}  // namespace

Format parse_format(std::string_view name) {
  if (name == "table") return Format::kTable;
  if (name == "csv") return Format::kCsv;
  if (name == "json") return Format::kJson;
  throw InputError("unknown format '" + std::string(name) + "'; use table, csv or json");
}

std::string format_runs(const std::vector<GoodputRun>& runs, Format format) {
  std::ostringstream os;
  if (format == Format::kJson) {
    if (runs.size() == 1) return to_json(runs[0].result, runs[0].config).dump() + "\n";
    nlohmann::json all = nlohmann::json::array();
    for (const GoodputRun& r : runs) all.push_back(to_json(r.result, r.config));
    return all.dump(1) + "\n";
  }
  if (format == Format::kCsv) {
    os << "method,learners,quorum,chips,chip_mtbf_s,goodput,uptime,failures,pauses,lost_chip_s,learner_losses\n";
    for (const GoodputRun& r : runs) {
      os << to_string(r.config.method) << ',' << r.config.learners << ',' << r.config.quorum << ','
         << r.config.chips << ',' << r.config.chip_mtbf_s << ',' << fmt("%.6f", r.result.goodput) << ','
         << fmt("%.6f", r.result.uptime) << ',' << r.result.failures << ',' << r.result.pauses << ','
         << fmt("%.0f", r.result.lost_chip_s) << ',' << r.result.learner_losses << '\n';
    }
    return os.str();
  }
  os << "method       M    K      chips  goodput%  uptime%  failures   pauses  lost chip-h\n";
  for (const GoodputRun& r : runs) {
    os << pad(to_string(r.config.method), 10, true) << pad(std::to_string(r.config.learners), 4)
       << pad(std::to_string(r.config.quorum), 5) << pad(std::to_string(r.config.chips), 11)
       << pad(fmt("%.1f", 100 * r.result.goodput), 10) << pad(fmt("%.1f", 100 * r.result.uptime), 9)
       << pad(std::to_string(r.result.failures), 10) << pad(std::to_string(r.result.pauses), 9)
       << pad(fmt("%.0f", r.result.lost_chip_s / 3600), 13) << '\n';
  }
  return os.str();
}

std::string format_grid(const std::vector<GridCell>& cells) {
  std::ostringstream os;
  os << "Goodput %, 1-year chip MTBF: simulated (paper, simulated - paper in points). [fit] = row used in the fit.\n";
  os << pad("", 24, true);
  for (int64_t chips : kPaperChips) os << pad(std::to_string(chips), 19);
  os << '\n';
  std::string row;
  double worst = 0.0, sum_abs = 0.0;
  int decoupled = 0, within3 = 0;
  for (const GridCell& c : cells) {
    if (c.row != row) {
      if (!row.empty()) os << '\n';
      row = c.row;
      os << pad(c.row + (c.fit_row ? " [fit]" : ""), 24, true);
    }
    os << pad(fmt("%.1f", c.predicted_pct) + " (" + fmt("%.0f", c.paper_pct) + ", " + fmt("%+.1f", c.diff_pts()) + ")",
              19);
    if (!c.fit_row) {
      ++decoupled;
      worst = std::max(worst, std::abs(c.diff_pts()));
      sum_abs += std::abs(c.diff_pts());
      if (std::abs(c.diff_pts()) <= 3.0 + 1e-9) ++within3;
    }
  }
  os << "\n\nDecoupled cells (predictions): " << within3 << "/" << decoupled << " within ±3 points; max |diff| "
     << fmt("%.1f", worst) << ", mean |diff| " << fmt("%.2f", decoupled ? sum_abs / decoupled : 0.0) << " points.\n";
  return os.str();
}

std::string format_grid_csv(const std::vector<GridCell>& cells) {
  std::ostringstream os;
  os << "row,method,learners,chips,paper_pct,predicted_pct,diff_pts,uptime_pct,fit_row\n";
  for (const GridCell& c : cells) {
    os << '"' << c.row << "\"," << to_string(c.method) << ',' << c.learners << ',' << c.chips << ','
       << fmt("%.0f", c.paper_pct) << ',' << fmt("%.2f", c.predicted_pct) << ',' << fmt("%.2f", c.diff_pts()) << ','
       << fmt("%.2f", c.uptime_pct) << ',' << (c.fit_row ? 1 : 0) << '\n';
  }
  return os.str();
}

std::string format_fit(const DpFit& fit) {
  std::ostringstream os;
  os << "Shared knobs fitted on the paper's DP rows only (" << fit.evaluations << " simulations):\n";
  for (const FittedKnob& k : fit.knobs) {
    os << "  " << pad(k.name, 16, true) << " = " << pad(fmt("%.2f", k.value), 8) << " s   (row: " << k.row << ")\n";
  }
  os << "Residual, rms over 5 cells: DP, no elasticity " << fmt("%.2f", fit.dp_rms_pts) << " points; DP, elastic "
     << fmt("%.2f", fit.elastic_rms_pts) << " points.\n";
  return os.str();
}

std::string format_table4() {
  std::ostringstream os;
  os << "Streaming DiLoCo Table 4 (H = 100): Gbit/s needed for CU = 50/80/90/95/99%.\n"
        "Each cell: ours (ours on the paper's log grid | paper, ours vs paper %).\n";
  int cells = 0, within10 = 0, on_grid = 0, within_step = 0;
  std::string model;
  for (const BandwidthReference& r : table4_references()) {
    if (r.model_label != model) {
      model = r.model_label;
      os << model << " (P = " << r.model.fragments << ", tau = " << r.model.overlap_steps << " where used)\n";
    }
    os << "  " << pad(r.method_label, 27, true);
    for (size_t i = 0; i < r.paper_gbps.size(); ++i) {
      const double ours = required_bandwidth(r.method, r.model, reference_cu_targets()[i]);
      const double grid = paper_grid_floor(ours);
      const double diff = 100.0 * (ours / r.paper_gbps[i] - 1.0);
      os << pad(fmt(ours < 10 ? "%.2f" : "%.1f", ours) + " (" + fmt(grid < 10 ? "%.1f" : "%.1f", grid) + " | " +
                    fmt("%.1f", r.paper_gbps[i]) + ", " + fmt("%+.0f%%", diff) + ")",
                29);
      ++cells;
      within10 += std::abs(diff) <= 10.0;
      on_grid += std::abs(grid / r.paper_gbps[i] - 1.0) < 0.05;
      within_step += std::abs(std::log(ours / r.paper_gbps[i])) <= std::log(1.2069) * 1.0001 + 1e-9 ||
                     std::abs(grid / r.paper_gbps[i] - 1.0) < 0.05;
    }
    os << '\n';
  }
  os << "\n" << within10 << "/" << cells << " cells within ±10% of the printed value; " << on_grid << "/" << cells
     << " land on the same point of the paper's grid (10^(-1+4k/49), ratio 1.207 between points); " << within_step
     << "/" << cells << " within one grid step.\n";
  return os.str();
}

std::string format_reference_points(const std::vector<CodecSize>& codecs) {
  BandwidthModel dp;
  dp.params = 5e9;
  dp.layers = 24;
  dp.step_s = 1.0;
  const double dp_gbps = required_bandwidth(SyncMethod::kDp, dp, 0.9);
  const double bf16 = hidden_fragment_bandwidth(5e9, Precision::kBf16, 256, 24, 2, 1.0);
  const double int4 = hidden_fragment_bandwidth(5e9, Precision::kInt4, 256, 24, 2, 1.0);
  std::ostringstream os;
  os << "Reference points: 5B parameters, 1 s step, two datacenters.\n"
     << "  DP, 90% CU (24 layers, bf16 gradients):    " << fmt("%7.2f", dp_gbps) << " Gbit/s  (paper ~104, "
     << fmt("%+.1f%%", 100 * (dp_gbps / 104 - 1)) << ")\n"
     << "  Decoupled, P = 24, tau = 2, bf16:            " << fmt("%7.3f", bf16) << " Gbit/s  (paper 1.7, "
     << fmt("%+.1f%%", 100 * (bf16 / 1.7 - 1)) << ")\n"
     << "  Decoupled, P = 24, tau = 2, int4 (block 256): " << fmt("%7.3f", int4) << " Gbit/s  (paper 0.43, "
     << fmt("%+.1f%%", 100 * (int4 / 0.43 - 1)) << ")\n";
  for (const CodecSize& c : codecs) {
    DLOCO_CHECK_GT(c.values, 0);
    const double bits = 8.0 * static_cast<double>(c.bytes);  // one fragment of 5e9 / 24 values, as encoded
    os << "  Decoupled, P = 24, tau = 2, dloco " << c.name << " (its codec: "
       << fmt("%.4f", bits / static_cast<double>(c.values)) << " bits a value): " << fmt("%7.3f", bits / 2.0 / 1e9)
       << " Gbit/s\n";
  }
  return os.str();
}

std::string format_learner_advice(const LearnerAdvice& advice, double target_goodput, double target_uptime) {
  std::ostringstream os;
  os << "Decoupled DiLoCo, goodput target " << fmt("%.1f", 100 * target_goodput) << "%, uptime target "
     << fmt("%.1f", 100 * target_uptime) << "% for the largest quorum K:\n";
  os << "     M  goodput%  uptime%(K=1)  largest K  uptime% at K\n";
  for (const LearnerOption& o : advice.options) {
    os << pad(std::to_string(o.learners), 6) << pad(fmt("%.1f", 100 * o.goodput), 10)
       << pad(fmt("%.1f", 100 * o.uptime), 14) << pad(o.max_quorum ? std::to_string(o.max_quorum) : "-", 11)
       << pad(o.max_quorum ? fmt("%.2f", 100 * o.uptime_at_max_quorum) : "-", 14)
       << (o.learners == advice.chosen_learners ? "   <- smallest M that meets the goodput target" : "") << '\n';
  }
  if (advice.chosen_learners == 0) {
    os << "No candidate M reaches the goodput target: add learners (--candidates), lower the target, or improve "
          "MTBF / pause times.\n";
  } else {
    os << "Answer: M = " << advice.chosen_learners << ", K = " << advice.chosen_quorum << ".\n";
  }
  return os.str();
}

std::string format_link_advice(const std::vector<LinkOption>& options, double link_gbps, double target_cu) {
  std::ostringstream os;
  os << "Link " << fmt("%.3g", link_gbps) << " Gbit/s, CU target " << fmt("%.1f", 100 * target_cu)
     << "%: smallest fragment count P per precision (Streaming/Decoupled, fragments hidden behind tau steps)\n";
  os << "  precision    P     CU%   Gbit/s needed at that P\n";
  for (const LinkOption& o : options) {
    os << "  " << pad(to_string(o.precision), 9, true) << pad(o.fragments ? std::to_string(o.fragments) : "none", 6)
       << pad(fmt("%.1f", 100 * o.cu), 8) << pad(std::isfinite(o.required_gbps) ? fmt("%.3f", o.required_gbps) : "inf", 12)
       << '\n';
  }
  return os.str();
}

void plot(const std::vector<PlotSeries>& series, const std::string& title, const std::string& xlabel,
          const std::string& ylabel, bool log_y, const std::filesystem::path& out) {
  if (!on_path("gnuplot")) {
    throw InputError("gnuplot not found on PATH; install it (Debian: sudo apt-get install gnuplot-nox) or use "
                     "--format csv and plot the numbers yourself");
  }
  const std::string ext = out.extension().string();
  if (ext != ".png" && ext != ".svg") throw InputError("plot file must end in .png or .svg, got " + out.string());
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
  const std::filesystem::path dat = out.string() + ".dat", gp = out.string() + ".gp";
  {
    std::ofstream d(dat);
    for (const PlotSeries& s : series) {
      DLOCO_CHECK_EQ(s.x.size(), s.y.size());
      d << "# " << s.title << '\n';
      for (size_t i = 0; i < s.x.size(); ++i) d << s.x[i] << ' ' << s.y[i] << '\n';
      d << "\n\n";
    }
  }
  std::ofstream g(gp);
  g << (ext == ".png" ? "set terminal pngcairo size 960,640 font 'Sans,11'\n" : "set terminal svg size 960,640\n");
  g << "set output '" << out.string() << "'\nset title '" << title << "'\nset xlabel '" << xlabel
    << "'\nset ylabel '" << ylabel << "'\nset logscale x\n" << (log_y ? "set logscale y\n" : "")
    << "set grid\nset key outside right\nplot ";
  for (size_t i = 0; i < series.size(); ++i) {
    g << (i ? ", \\\n     " : "") << "'" << dat.string() << "' index " << i << " using 1:2 with "
      << (series[i].points_only ? "points pt 7 ps 0.8" : "linespoints pt 6") << " title '" << series[i].title << "'";
  }
  g << '\n';
  g.close();
  const std::string cmd = "gnuplot '" + gp.string() + "'";
  if (std::system(cmd.c_str()) != 0) throw InputError("gnuplot failed on " + gp.string());
}

}  // namespace dloco::sim
