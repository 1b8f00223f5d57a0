// `dloco compare`: runs variants (training modes, or any config overrides) × seeds of one config at equal total
// tokens, one `dloco train` child process after another, and writes a side-by-side report (spec
// decoupled-diloco.md §11; the baselines issue): compare.md (table), compare.json (every run's report and resolved
// config) and loss-vs-tokens curves of every variant on one plot.
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "core/check.h"
#include "core/config.h"
#include "process/atomic_file.h"
#include "process/private_file.h"
#include "sim/report.h"

namespace dloco::apps {

namespace {

namespace fs = std::filesystem;

struct Variant {
  std::string name;
  std::vector<std::string> overrides;  // section.key=value
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// "NAME:section.key=value;section.key=value"
Variant parse_variant(const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos || colon == 0) {
    throw InputError("--variant '" + text + "' must look like NAME:section.key=value;section.key=value");
  }
  Variant v{text.substr(0, colon), split(text.substr(colon + 1), ';')};
  if (v.name.find('/') != std::string::npos) throw InputError("--variant name '" + v.name + "' must not contain '/'");
  return v;
}

std::vector<nlohmann::json> read_events(const fs::path& path, const std::string& event) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"" + event + "\"") == std::string::npos) continue;
    try {
      auto j = nlohmann::json::parse(line);
      if (j.value("event", "") == event) out.push_back(std::move(j));
    } catch (const nlohmann::json::exception&) {
    }
  }
  return out;
}

// The run's in-training evaluations as (tokens, val loss); tokens ≈ global step · M · B·T.
std::vector<std::pair<double, double>> eval_curve(const fs::path& run_dir, const Config& c) {
  const double tokens_per_global_step = static_cast<double>(c.train.tokens_per_step(c.model) * c.diloco.learners);
  std::vector<std::pair<double, double>> curve;
  if (c.diloco.mode == Mode::kDecoupled) {
    for (const auto& e : read_events(run_dir / "events" / "evaluator.jsonl", "eval")) {
      curve.emplace_back(e.value("global_step", 0) * tokens_per_global_step, e.value("val_loss", NAN));
    }
  } else if (is_collective_mode(c.diloco.mode)) {
    for (const auto& e : read_events(run_dir / "events" / "worker_0.jsonl", "eval")) {
      curve.emplace_back(e.value("step", 0) * tokens_per_global_step, e.value("val_loss", NAN));
    }
  } else {
    for (const auto& e : read_events(run_dir / "events.jsonl", "eval")) {
      curve.emplace_back(e.value("tokens", 0.0), e.value("val_loss", NAN));
    }
  }
  return curve;
}

// Bytes the report's learners (or workers) sent and received: {up, down} summed over them, and how many there were.
struct LearnerBytes {
  double up = 0, down = 0;
  int learners = 0;
};
LearnerBytes learner_bytes(const nlohmann::json& report) {
  double up = 0, down = 0;
  int n = 0;
  const nlohmann::json bytes = report.value("bytes", nlohmann::json::object());  // a named copy: items() refers to it
  for (const auto& [role, b] : bytes.items()) {
    if (role.rfind("learner_", 0) == 0 || role.rfind("worker_", 0) == 0) {
      up += b.value("sent", 0.0);
      down += b.value("received", 0.0);
      ++n;
    }
  }
  return {up, down, n};
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// The flags of `dloco compare`.
struct CompareOptions {
  std::string config_path, name = "compare", modes_text, seeds_text = "1", plot_path;
  std::vector<std::string> variant_texts, overrides;
};

// One run of the comparison: a variant at one seed, and its report once trained (null if it failed).
struct Run {
  std::string variant;
  uint64_t seed;
  Config config;
  nlohmann::json report;
};

std::vector<Variant> parse_variants(const CompareOptions& o) {
  std::vector<Variant> variants;
  for (const auto& m : split(o.modes_text, ',')) variants.push_back({m, {"diloco.mode=" + m}});
  for (const auto& v : o.variant_texts) variants.push_back(parse_variant(v));
  if (variants.empty()) throw InputError("give --modes and/or --variant: nothing to compare");
  return variants;
}

std::vector<uint64_t> parse_seeds(const std::string& seeds_text) {
  std::vector<uint64_t> seeds;
  for (const auto& s : split(seeds_text, ',')) {
    try {
      seeds.push_back(std::stoull(s));
    } catch (const std::exception&) {
      throw InputError("--seeds: '" + s + "' is not a non-negative integer");
    }
  }
  if (seeds.empty()) throw InputError("--seeds is empty");
  return seeds;
}

// Every variant × seed, resolved up front so a typo fails before hours of training. Throws InputError for a
// variant that changes train.total_tokens.
std::vector<Run> resolve_runs(const CompareOptions& o, const Config& base, const fs::path& dir,
                              const std::vector<Variant>& variants, const std::vector<uint64_t>& seeds) {
  std::vector<Run> runs;
  for (const auto& v : variants) {
    for (uint64_t seed : seeds) {
      std::vector<std::string> all = o.overrides;
      all.insert(all.end(), v.overrides.begin(), v.overrides.end());
      all.push_back("run.seed=" + std::to_string(seed));
      all.push_back("run.name=" + v.name + "-s" + std::to_string(seed));
      all.push_back("run.out_dir=\"" + dir.string() + "\"");
      Config c = load_config(o.config_path, all);
      if (c.train.total_tokens != base.train.total_tokens) {
        throw InputError("variant " + v.name + " changes train.total_tokens: runs must compare at equal tokens");
      }
      runs.push_back({v.name, seed, c, nullptr});
    }
  }
  return runs;
}

// Each run as a `dloco train` child process, one after the other; an interrupted child ends the series.
void train_runs(std::vector<Run>& runs, const fs::path& dir) {
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (auto& r : runs) {
    const fs::path cfg = dir / "configs" / (r.config.run.name + ".toml");
    write_private_file_atomically(cfg, to_toml(r.config));
    const fs::path log = dir / (r.config.run.name + ".log");
    spdlog::info("[compare] {} (seed {}): training, log {}", r.variant,
                 static_cast<unsigned long long>(r.seed), log.string());
    const auto t0 = std::chrono::steady_clock::now();
    const std::string command = "'" + self.string() + "' train --config '" + cfg.string() + "' > '" + log.string() + "' 2>&1";
    const int rc = std::system(command.c_str());
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const fs::path report_file = r.config.run_dir() / "report.json";
    if (rc == 0 && fs::exists(report_file)) {
      r.report = nlohmann::json::parse(std::ifstream(report_file));
      spdlog::info("[compare] {} (seed {}): val loss {:.4f} in {:.0f} s", r.variant,
                   static_cast<unsigned long long>(r.seed), r.report.value("final_val_loss", NAN), secs);
    } else {
      spdlog::info("[compare] {} (seed {}): FAILED (exit {}), see {}", r.variant,
                   static_cast<unsigned long long>(r.seed), WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, log.string());
      if (WIFSIGNALED(rc) && (WTERMSIG(rc) == SIGINT || WTERMSIG(rc) == SIGTERM)) break;
    }
  }
}

// One variant's means over its seeds (each seed's loss listed); adds its runs to `out_runs` and their evaluation
// curves to `series`.
struct VariantRow {
  std::string name, per_seed;
  int ok = 0;
  double loss = 0, ppl = 0, wall = 0, tps = 0, mb_up = 0, mb_down = 0, bytes_per_step = 0, syncs = 0;
};

VariantRow variant_row(const Variant& v, const std::vector<Run>& runs, nlohmann::json& out_runs,
                       std::vector<sim::PlotSeries>& series) {
  VariantRow row{v.name, {}};
  for (const auto& r : runs) {
    if (r.variant != v.name) continue;
    out_runs.push_back({{"variant", r.variant}, {"seed", r.seed}, {"report", r.report}, {"config", to_json(r.config)}});
    if (r.report.is_null()) {
      row.per_seed += std::string(row.per_seed.empty() ? "" : ", ") + "failed";
      continue;
    }
    ++row.ok;
    row.loss += r.report.value("final_val_loss", NAN);
    row.ppl += r.report.value("final_val_perplexity", NAN);
    row.wall += r.report.value("wall_seconds", NAN);
    row.tps += r.report.value("tokens_per_second", NAN);
    const LearnerBytes b = learner_bytes(r.report);
    const double n = std::max(1, b.learners);
    row.mb_up += b.up / n / 1e6;
    row.mb_down += b.down / n / 1e6;
    // A learner-step: one inner step of one learner (B·T·grad_accum tokens). All learners' bytes over all their
    // steps, so learners that joined late or restarted count as what they sent and trained.
    const double learner_steps = r.report.value("tokens_trained", 0.0) /
                                 static_cast<double>(r.config.train.tokens_per_step(r.config.model));
    row.bytes_per_step += learner_steps > 0 ? (b.up + b.down) / learner_steps : 0;
    row.syncs += r.report.contains("merges") ? r.report.value("merges", 0.0) : r.report.value("syncs", 0.0);
    row.per_seed += std::string(row.per_seed.empty() ? "" : ", ") + fmt("%.4f", r.report.value("final_val_loss", NAN));
    const auto curve = eval_curve(r.config.run_dir(), r.config);
    if (!curve.empty()) {
      sim::PlotSeries s{r.variant + " s" + std::to_string(r.seed), {}, {}};
      for (const auto& [x, y] : curve) {
        s.x.push_back(x);
        s.y.push_back(y);
      }
      // The final loss on the whole validation split, at the run's last token.
      s.x.push_back(r.report.value("tokens_trained", 0.0));
      s.y.push_back(r.report.value("final_val_loss", NAN));
      series.push_back(std::move(s));
    }
  }
  if (row.ok > 0) {
    for (double* x : {&row.loss, &row.ppl, &row.wall, &row.tps, &row.mb_up, &row.mb_down, &row.bytes_per_step, &row.syncs}) {
      *x /= row.ok;
    }
  }
  return row;
}

// <folder>/compare.md (also printed), compare.json and the loss-vs-tokens plot.
void write_compare_report(const CompareOptions& o, const Config& base, const fs::path& dir,
                          const std::vector<Variant>& variants, const std::vector<Run>& runs) {
  std::ostringstream md;
  md << "# dloco compare: " << o.name << "\n\nConfig `" << o.config_path << "`, " << base.train.total_tokens
     << " tokens per run, M = " << base.diloco.learners << ", seeds " << o.seeds_text << ".\n\n"
     << "| variant | final val loss (nats/token) | perplexity | wall s | tokens/s | MB up / down per learner | "
        "bytes per learner-step | fewer bytes than dp | syncs |\n"
     << "|---|---|---|---|---|---|---|---|---|\n";
  nlohmann::json out = {{"config", o.config_path}, {"total_tokens", base.train.total_tokens}, {"runs", nlohmann::json::array()}};
  std::vector<sim::PlotSeries> series;
  std::vector<VariantRow> rows;
  double dp_bytes_per_step = 0;
  for (const auto& v : variants) {
    rows.push_back(variant_row(v, runs, out["runs"], series));
    if (v.name == "dp" && rows.back().ok > 0) dp_bytes_per_step = rows.back().bytes_per_step;
  }
  out["variants"] = nlohmann::json::array();
  for (const auto& row : rows) {
    if (row.ok == 0) {
      md << "| " << row.name << " | failed (" << row.per_seed << ") | | | | | | | |\n";
      continue;
    }
    const double fewer = dp_bytes_per_step > 0 && row.bytes_per_step > 0 ? dp_bytes_per_step / row.bytes_per_step : 0;
    md << "| " << row.name << " | " << fmt("%.4f", row.loss) << " (" << row.per_seed << ") | " << fmt("%.1f", row.ppl)
       << " | " << fmt("%.0f", row.wall) << " | " << fmt("%.0f", row.tps) << " | " << fmt("%.2f", row.mb_up) << " / "
       << fmt("%.2f", row.mb_down) << " | " << fmt("%.0f", row.bytes_per_step) << " | "
       << (fewer > 0 ? fmt("%.1f×", fewer) : std::string()) << " | " << fmt("%.0f", row.syncs) << " |\n";
    out["variants"].push_back({{"variant", row.name}, {"seeds_ok", row.ok}, {"final_val_loss", row.loss},
                               {"mb_up_per_learner", row.mb_up}, {"mb_down_per_learner", row.mb_down},
                               {"bytes_per_learner_step", row.bytes_per_step}, {"fewer_bytes_than_dp", fewer}});
  }
  md << "\nSyncs: merges of fragments (decoupled), outer all-reduces (diloco, streaming) or gradient all-reduces "
        "(dp). Bytes: up = what a learner sent, down = what it received; decoupled counts the protocol's payloads "
        "(codec bytes plus ~64 bytes a message) both ways, bootstrap included; the baselines count a ring all-reduce's "
        "2·(M−1)/M·size per worker each way. A learner-step is one inner step of one learner; \"fewer bytes than "
        "dp\" divides the dp variant's bytes per learner-step by the row's. Curves: in-training evaluations on "
        "train.eval_tokens validation tokens, ending at the final loss on the whole validation split (the "
        "table's).\n";
  write_file_atomically(dir / "compare.md", md.str());
  write_file_atomically(dir / "compare.json", out.dump(2) + "\n");
  std::printf("\n%s", md.str().c_str());
  const fs::path plot_file = o.plot_path.empty() ? dir / "loss.png" : fs::path(o.plot_path);
  if (!series.empty()) {
    try {
      sim::plot(series, "validation loss vs tokens", "tokens (all learners)", "validation loss (nats/token)", false,
                plot_file);
      std::printf("plot: %s\n", plot_file.c_str());
    } catch (const InputError& e) {
      std::printf("no plot: %s\n", e.what());
    }
  }
  std::printf("report: %s and %s\n", (dir / "compare.md").c_str(), (dir / "compare.json").c_str());
}

void run_compare(const CompareOptions& o) {
  const std::vector<Variant> variants = parse_variants(o);
  const std::vector<uint64_t> seeds = parse_seeds(o.seeds_text);
  const Config base = load_config(o.config_path, o.overrides);
  const fs::path dir = fs::path(base.run.out_dir) / o.name;
  if (fs::exists(dir / "compare.json")) {
    throw InputError("'" + dir.string() + "' already holds a comparison: pick another --name");
  }
  fs::create_directories(dir / "configs");
  std::vector<Run> runs = resolve_runs(o, base, dir, variants, seeds);
  spdlog::info("[compare] {} runs ({} variants × {} seeds) at {} tokens each; folder {}", runs.size(),
               variants.size(), seeds.size(), static_cast<long long>(base.train.total_tokens), dir.string());
  train_runs(runs, dir);
  write_compare_report(o, base, dir, variants, runs);
}

}  // namespace

void add_compare_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("compare", "Run training modes (or other variants) × seeds at equal tokens and "
                                            "report them side by side");
  static CompareOptions o;
  cmd->add_option("--config", o.config_path, "TOML config every run starts from (e.g. configs/demo.toml)")->required();
  cmd->add_option("--modes", o.modes_text, "Comma-separated modes, each a variant named after it: dp,diloco,streaming,decoupled");
  cmd->add_option("--variant", o.variant_texts,
                  "A variant NAME:section.key=value;section.key=value (repeatable), e.g. "
                  "\"mean-0.5:diloco.merge=mean;diloco.outer_lr=0.5\"");
  cmd->add_option("--seeds", o.seeds_text, "Comma-separated run.seed values; each variant runs once per seed")
      ->capture_default_str();
  cmd->add_option("--set", o.overrides, "Override a field in every run (repeatable)");
  cmd->add_option("--name", o.name, "Comparison folder under run.out_dir")->capture_default_str();
  cmd->add_option("--plot", o.plot_path, "Loss-vs-tokens plot (.png or .svg); default <folder>/loss.png");
  cmd->callback([] { run_compare(o); });
}

}  // namespace dloco::apps
