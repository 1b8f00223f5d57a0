// `dloco sim ...`: the goodput and bandwidth simulators on the command line (docs/sim.md).
//   dloco sim goodput    simulate methods × learners × chip counts; table, CSV, JSON, plot
//   dloco sim fit        fit the shared knobs on the paper's two DP rows only (--write saves them)
//   dloco sim grid       the paper's goodput grid: DP rows fitted, Decoupled rows predicted, differences in points
//   dloco sim bandwidth  CU vs link bandwidth; Table 4 and the spec's reference points; solve for a target CU
//   dloco sim advise     operator questions: `learners` (which M and K) and `link` (which P and precision)
// Flags -> config -> run happens here; the models live in src/sim. Bad input throws InputError (exit 2).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "core/check.h"
#include "sim/advise.h"
#include "sim/bandwidth.h"
#include "sim/calibration.h"
#include "sim/goodput_config.h"
#include "sim/goodput_sim.h"
#include "sim/report.h"
#include "transport/codec.h"

namespace dloco::apps {
namespace {

using namespace dloco::sim;

constexpr const char* kDefaultCalibration = "configs/sim/calibration.toml";
constexpr double kDay = 86400.0;

std::string dashed(std::string name) {
  for (char& c : name) c = c == '_' ? '-' : c;
  return name;
}

/// Flags shared by every goodput command: the calibration file and one flag per knob, applied on top of it.
struct KnobFlags {
  std::string calibration = kDefaultCalibration;
  CLI::Option* calibration_opt = nullptr;
  std::string return_dist;
  double mtbf_years = 0.0;
  CLI::Option* mtbf_years_opt = nullptr;
  std::map<std::string, double> values;
  std::map<std::string, CLI::Option*> options;

  void add(CLI::App* sub, const std::vector<std::string>& skip) {
    calibration_opt = sub->add_option("--calibration", calibration,
                                      "calibration file (fixed and fitted knobs, each with its reason)");
    sub->add_option("--return-dist", return_dist, "time away of a failed slice: fixed, exponential, lognormal");
    mtbf_years_opt = sub->add_option("--mtbf-years", mtbf_years, "chip MTBF in years (sets chip_mtbf_s)");
    for (const KnobInfo& k : knob_table()) {
      if (std::find(skip.begin(), skip.end(), k.name) != skip.end()) continue;
      values[k.name] = 0.0;
      options[k.name] = sub->add_option("--" + dashed(k.name), values[k.name], k.help + " [" + k.unit + "]");
    }
  }

  /// Defaults <- calibration file (if present; an explicit --calibration must exist) <- flags.
  GoodputConfig resolve() const {
    GoodputConfig config;
    const bool explicit_file = calibration_opt != nullptr && calibration_opt->count() > 0;
    if (explicit_file || std::filesystem::exists(calibration)) {
      load_calibration(calibration).apply(config);
    } else {
      spdlog::warn("[sim] no {} here: using built-in defaults (run from the repository root, or pass "
                   "--calibration)", calibration);
    }
    if (!return_dist.empty()) config.return_dist = parse_return_dist(return_dist);
    if (mtbf_years_opt != nullptr && mtbf_years_opt->count() > 0) config.chip_mtbf_s = mtbf_years * 365.0 * kDay;
    for (const auto& [name, option] : options) {
      if (option->count() > 0) set_knob(config, name, values.at(name));
    }
    return config;
  }
};

void write_or_print(const std::string& text, const std::string& path) {
  if (path.empty()) {
    std::cout << text << std::flush;
    return;
  }
  std::ofstream out(path);
  if (!out) throw InputError("cannot write " + path);
  out << text;
  spdlog::info("[sim] wrote {}", path);
}

std::string series_title(Method method, int64_t learners) {
  std::string t = to_string(method);
  if (method != Method::kDp && method != Method::kElasticDp) t += " M=" + std::to_string(learners);
  return t;
}

void add_goodput(CLI::App& sim) {
  struct Args {
    KnobFlags knobs;
    std::vector<std::string> methods = {"elastic-dp"};
    std::vector<int64_t> learners = {1};
    std::vector<int64_t> chips = {150'000};
    double horizon_days = 0.0;
    CLI::Option* horizon_opt = nullptr;
    std::string format = "table";
    std::string plot_path;
    std::string out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = sim.add_subcommand("goodput", "simulate goodput and uptime of methods under chip failures");
  sub->add_option("--method", args->methods, "dp, elastic-dp, diloco, streaming, decoupled (comma list)")
      ->delimiter(',');
  sub->add_option("--learners", args->learners, "M (comma list; ignored by dp and elastic-dp)")->delimiter(',');
  sub->add_option("--chips", args->chips, "N (comma list)")->delimiter(',');
  args->horizon_opt = sub->add_option("--days", args->horizon_days, "simulated days (sets horizon_s)");
  sub->add_option("--format", args->format, "table, csv or json (json: one object for one run)");
  sub->add_option("--plot", args->plot_path, "also draw goodput vs chips into this .png/.svg (gnuplot)");
  sub->add_option("--out", args->out, "write the table/CSV/JSON here instead of stdout");
  args->knobs.add(sub, {"chips", "learners"});
  sub->callback([args] {
    const Format format = parse_format(args->format);
    GoodputConfig base = args->knobs.resolve();
    if (args->horizon_opt->count() > 0) base.horizon_s = args->horizon_days * kDay;
    std::vector<GoodputRun> runs;
    std::vector<PlotSeries> series;
    for (const std::string& name : args->methods) {
      const Method method = parse_method(name);
      const bool single = method == Method::kDp || method == Method::kElasticDp;
      for (int64_t m : single ? std::vector<int64_t>{1} : args->learners) {
        PlotSeries s{series_title(method, m), {}, {}, false};
        for (int64_t chips : args->chips) {
          GoodputConfig c = base;
          c.method = method;
          c.learners = m;
          c.chips = chips;
          if (single) c.quorum = 1;
          if (c.quorum > c.learners) {
            throw InputError("--quorum " + std::to_string(c.quorum) + " exceeds --learners " + std::to_string(m));
          }
          runs.push_back({c, simulate_goodput(c)});
          s.x.push_back(static_cast<double>(chips));
          s.y.push_back(100.0 * runs.back().result.goodput);
        }
        series.push_back(s);
      }
    }
    write_or_print(format_runs(runs, format), args->out);
    if (!args->plot_path.empty()) {
      plot(series, "Goodput vs chips", "chips", "goodput (%)", false, args->plot_path);
      spdlog::info("[sim] plot {}", args->plot_path);
    }
  });
}

void add_fit(CLI::App& sim) {
  struct Args {
    KnobFlags knobs;
    double horizon_days = 10.0;
    int max_evaluations = 150;
    bool write = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = sim.add_subcommand("fit", "fit the shared knobs on the paper's two DP rows only, print the fit");
  sub->add_option("--days", args->horizon_days, "simulated days per evaluation");
  sub->add_option("--max-evaluations", args->max_evaluations, "Nelder-Mead budget per row");
  sub->add_flag("--write", args->write, "write the fitted values into the calibration file's [fitted_shared]");
  args->knobs.add(sub, {});
  sub->callback([args] {
    const GoodputConfig base = args->knobs.resolve();
    const DpFit fit = fit_dp_rows(base, {args->horizon_days * kDay, args->max_evaluations});
    std::cout << format_fit(fit);
    if (!args->write) return;
    const std::string path = args->knobs.calibration;
    Calibration cal = std::filesystem::exists(path) ? load_calibration(path) : Calibration{};
    std::erase_if(cal.knobs, [](const CalibratedKnob& k) { return k.group == "fitted_shared"; });
    for (const FittedKnob& k : fit.knobs) {
      cal.knobs.push_back({k.name, std::round(k.value * 100) / 100, "fitted on '" + k.row + "' by `dloco sim fit`",
                           "fitted_shared"});
    }
    std::string header;
    if (std::ifstream in(path); in) {
      for (std::string line; std::getline(in, line) && line.rfind("#", 0) == 0;) header += line.substr(2) + "\n";
    }
    std::ofstream(path) << calibration_to_toml(cal, header);
    spdlog::info("[sim] wrote the fitted knobs into {}", path);
  });
}

void add_grid(CLI::App& sim) {
  struct Args {
    KnobFlags knobs;
    double horizon_days = 30.0;
    std::string format = "table";
    std::string plot_path;
    std::string out;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = sim.add_subcommand("grid", "the paper's goodput grid: DP rows fitted, Decoupled rows predicted");
  sub->add_option("--days", args->horizon_days, "simulated days per cell");
  sub->add_option("--format", args->format, "table or csv");
  sub->add_option("--plot", args->plot_path, "also draw simulated lines and the paper's cells (.png/.svg)");
  sub->add_option("--out", args->out, "write the table/CSV here instead of stdout");
  args->knobs.add(sub, {"chips", "learners", "quorum"});
  sub->callback([args] {
    const std::vector<GridCell> cells = predict_paper_grid(args->knobs.resolve(), args->horizon_days * kDay);
    if (args->format == "csv") {
      write_or_print(format_grid_csv(cells), args->out);
    } else if (args->format == "table") {
      write_or_print(format_grid(cells), args->out);
    } else {
      throw InputError("--format must be table or csv for `sim grid`");
    }
    if (args->plot_path.empty()) return;
    std::vector<PlotSeries> series;
    for (const PaperRow& row : paper_goodput_rows()) {
      PlotSeries sim_line{row.label + " (sim)", {}, {}, false}, paper{row.label + " (paper)", {}, {}, true};
      for (const GridCell& c : cells) {
        if (c.row != row.label) continue;
        sim_line.x.push_back(static_cast<double>(c.chips));
        sim_line.y.push_back(c.predicted_pct);
        paper.x.push_back(static_cast<double>(c.chips));
        paper.y.push_back(c.paper_pct);
      }
      series.push_back(sim_line);
      series.push_back(paper);
    }
    plot(series, "Goodput vs chips, 1-year chip MTBF: simulator (lines) vs paper (dots)", "chips", "goodput (%)",
         false, args->plot_path);
    spdlog::info("[sim] plot {}", args->plot_path);
  });
}

/// Flags describing the bandwidth workload (defaults: Table 4's 1B row).
struct ModelFlags {
  BandwidthModel model;
  std::string precision = "bf16";

  void add(CLI::App* sub) {
    sub->add_option("--params", model.params, "parameters exchanged per full sync");
    sub->add_option("--layers", model.layers, "layers of the backward pipeline");
    sub->add_option("--step-s", model.step_s, "compute time of one step [s]");
    sub->add_option("--workers", model.workers, "workers (datacenters) in the all-reduce");
    sub->add_option("--inner-steps", model.inner_steps, "H");
    sub->add_option("--fragments", model.fragments, "P");
    sub->add_option("--overlap-steps", model.overlap_steps, "tau (0 = blocking)");
    sub->add_option("--precision", precision, "outer-gradient precision: fp32, bf16, int8, int4, fp4");
    sub->add_option("--quant-block", model.quant_block, "values per fp32 scale (int8/int4)");
  }
  BandwidthModel resolve() const {
    BandwidthModel m = model;
    m.outer_precision = parse_precision(precision);
    m.validate();
    return m;
  }
};

void add_bandwidth(CLI::App& sim) {
  struct Args {
    ModelFlags model;
    std::string method;
    double link_gbps = 0.0;
    double target_cu = 0.0;
    std::string plot_path;
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = sim.add_subcommand(
      "bandwidth", "compute utilisation vs link bandwidth; with no --link-gbps/--target-cu: Table 4 and the spec's "
                   "reference points");
  sub->add_option("--method", args->method, "dp, diloco or streaming (with --link-gbps / --target-cu)");
  sub->add_option("--link-gbps", args->link_gbps, "print CU on a link of this many Gbit/s");
  sub->add_option("--target-cu", args->target_cu, "solve the Gbit/s needed for this CU (fraction)");
  sub->add_option("--plot", args->plot_path, "draw CU vs bandwidth for DP, DiLoCo, Streaming, +overlap, +FP4/int4");
  args->model.add(sub);
  sub->callback([args] {
    const BandwidthModel m = args->model.resolve();
    if (args->link_gbps > 0 || args->target_cu > 0) {
      const SyncMethod method = parse_sync_method(args->method.empty() ? "streaming" : args->method);
      nlohmann::json j = {{"method", to_string(method)}, {"params", m.params}, {"step_s", m.step_s},
                          {"fragments", m.fragments}, {"overlap_steps", m.overlap_steps},
                          {"precision", to_string(m.outer_precision)}};
      if (args->link_gbps > 0) {
        j["link_gbps"] = args->link_gbps;
        j["cu"] = compute_utilization(method, m, args->link_gbps);
      }
      if (args->target_cu > 0) {
        j["target_cu"] = args->target_cu;
        const double need = required_bandwidth(method, m, args->target_cu);
        j["required_gbps"] = std::isfinite(need) ? nlohmann::json(need) : nlohmann::json("unreachable");
      }
      std::cout << j.dump() << '\n';
    } else {
      // dloco's own codecs at their real encoded size (transport/codec.h), one reference fragment of 5e9 / 24 values.
      constexpr int64_t kFragment = 5'000'000'000 / 24;
      std::vector<CodecSize> codecs;
      for (const wire::Codec c : {wire::Codec::kQ8, wire::Codec::kQ4}) {
        codecs.push_back({wire::to_string(c), kFragment, wire::encoded_bytes(c, kFragment)});
      }
      std::cout << format_reference_points(codecs) << '\n' << format_table4();
    }
    if (args->plot_path.empty()) return;
    struct Line { std::string title; SyncMethod method; int64_t tau; Precision p; };
    const std::vector<Line> lines = {{"DP", SyncMethod::kDp, 0, Precision::kBf16},
                                     {"DiLoCo", SyncMethod::kDiloco, 0, Precision::kBf16},
                                     {"Streaming", SyncMethod::kStreaming, 0, Precision::kBf16},
                                     {"Streaming + overlap", SyncMethod::kStreaming, m.overlap_steps ? m.overlap_steps : 1,
                                      Precision::kBf16},
                                     {"+ overlap + int4", SyncMethod::kStreaming, m.overlap_steps ? m.overlap_steps : 1,
                                      Precision::kInt4},
                                     {"+ overlap + FP4", SyncMethod::kStreaming, m.overlap_steps ? m.overlap_steps : 1,
                                      Precision::kFp4}};
    std::vector<PlotSeries> series;
    for (const Line& line : lines) {
      BandwidthModel lm = m;
      lm.overlap_steps = line.tau;
      lm.outer_precision = line.p;
      PlotSeries s{line.title, {}, {}, false};
      for (int k = 0; k <= 80; ++k) {
        const double gbps = std::pow(10.0, -1.0 + 4.0 * k / 80.0);
        s.x.push_back(gbps);
        s.y.push_back(100.0 * compute_utilization(line.method, lm, gbps));
      }
      series.push_back(s);
    }
    plot(series, "Compute utilisation vs link bandwidth", "Gbit/s", "compute utilisation (%)", false,
         args->plot_path);
    spdlog::info("[sim] plot {}", args->plot_path);
  });
}

void add_advise(CLI::App& sim) {
  CLI::App* advise = sim.add_subcommand("advise", "operator questions: which M and K; which P and precision");
  advise->require_subcommand(1);

  struct LearnerArgs {
    KnobFlags knobs;
    double target = 0.9;
    double target_uptime = 0.99;
    std::vector<int64_t> candidates = {1, 2, 4, 8, 16, 32, 64};
    double horizon_days = 10.0;
  };
  auto la = std::make_shared<LearnerArgs>();
  CLI::App* learners = advise->add_subcommand("learners", "given chips, MTBF and a target goodput: which M and K");
  learners->add_option("--target", la->target, "goodput target (fraction)");
  learners->add_option("--target-uptime", la->target_uptime, "uptime the largest quorum K must keep (fraction)");
  learners->add_option("--candidates", la->candidates, "M values to try (comma list)")->delimiter(',');
  learners->add_option("--days", la->horizon_days, "simulated days per run");
  la->knobs.add(learners, {"learners", "quorum"});
  learners->callback([la] {
    GoodputConfig base = la->knobs.resolve();
    base.horizon_s = la->horizon_days * kDay;
    const LearnerAdvice advice = advise_learners(base, la->candidates, la->target, la->target_uptime);
    std::cout << "N = " << base.chips << " chips, chip MTBF " << base.chip_mtbf_s / (365.0 * kDay) << " years\n"
              << format_learner_advice(advice, la->target, la->target_uptime);
  });

  struct LinkArgs {
    ModelFlags model;
    double link_gbps = 1.0;
    double target_cu = 0.95;
    std::vector<std::string> precisions = {"bf16", "int8", "int4"};
    std::vector<int64_t> fragments = {1, 2, 3, 4, 6, 8, 12, 24, 48, 96};
  };
  auto ka = std::make_shared<LinkArgs>();
  CLI::App* link = advise->add_subcommand("link", "given a link: which fragment count P and precision keep CU up");
  link->add_option("--link-gbps", ka->link_gbps, "link bandwidth [Gbit/s]");
  link->add_option("--target-cu", ka->target_cu, "compute utilisation target (fraction)");
  link->add_option("--precisions", ka->precisions, "precisions to try (comma list)")->delimiter(',');
  link->add_option("--fragment-candidates", ka->fragments, "P values to try, ascending (comma list)")->delimiter(',');
  ka->model.add(link);
  link->callback([ka] {
    BandwidthModel m = ka->model.resolve();
    std::vector<Precision> precisions;
    for (const std::string& p : ka->precisions) precisions.push_back(parse_precision(p));
    std::vector<int64_t> fragments = ka->fragments;
    std::sort(fragments.begin(), fragments.end());
    std::cout << format_link_advice(advise_link(m, ka->link_gbps, ka->target_cu, precisions, fragments),
                                    ka->link_gbps, ka->target_cu);
  });
}

}  // namespace

void add_sim_commands(CLI::App& app) {
  CLI::App* sim = app.add_subcommand("sim", "goodput and bandwidth simulators (docs/sim.md)");
  sim->require_subcommand(1);
  add_goodput(*sim);
  add_fit(*sim);
  add_grid(*sim);
  add_bandwidth(*sim);
  add_advise(*sim);
}

}  // namespace dloco::apps
