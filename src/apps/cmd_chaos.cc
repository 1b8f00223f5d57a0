// `dloco chaos`: trains a decoupled run under a fault plan (plans/*.toml), then the same config without faults at
// equal tokens, and reports goodput, uptime, steps trained / kept / lost per learner, recovery times, syncer
// downtime, bytes, the final validation loss of both, and the consistency checks (exact data, versions, final
// copies) on the console and in <folder>/chaos.json and chaos.md. Each run is a `dloco train` child process.
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "baselines/chaos_report.h"
#include "chaos/chaos_report.h"
#include "chaos/fault_plan.h"
#include "chaos/sim_replay.h"
#include "core/check.h"
#include "core/config.h"
#include "process/atomic_file.h"
#include "process/private_file.h"
#include "sim/goodput_sim.h"

namespace dloco::apps {

namespace {

namespace fs = std::filesystem;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

// Runs `dloco train` on `config` (and `plan`, if any) as a child process; returns its report, or null.
nlohmann::json train_child(const Config& config, const fs::path& dir, const fs::path& plan) {
  const fs::path cfg = dir / (config.run.name + ".toml");
  write_private_file_atomically(cfg, to_toml(config));
  const fs::path log = dir / (config.run.name + ".log");
  spdlog::info("[chaos] {}: training{}, log {}", config.run.name,
               plan.empty() ? " without faults" : (" under plan " + plan.string()), log.string());
  const fs::path self = fs::read_symlink("/proc/self/exe");
  std::string command = "'" + self.string() + "' train --config '" + cfg.string() + "'";
  if (!plan.empty()) command += " --plan '" + plan.string() + "'";
  command += " > '" + log.string() + "' 2>&1";
  const int rc = std::system(command.c_str());
  const fs::path report = config.run_dir() / "report.json";
  if (rc != 0 || !fs::exists(report)) {
    spdlog::info("[chaos] {}: FAILED (exit {}), see {}", config.run.name, WIFEXITED(rc) ? WEXITSTATUS(rc) : rc,
                 log.string());
    if (WIFSIGNALED(rc) && (WTERMSIG(rc) == SIGINT || WTERMSIG(rc) == SIGTERM)) throw InputError("interrupted");
    return nullptr;
  }
  return nlohmann::json::parse(std::ifstream(report));
}

double sent_per_learner_mb(const nlohmann::json& report) {
  double sum = 0;
  int n = 0;
  const nlohmann::json bytes = report.value("bytes", nlohmann::json::object());
  for (const auto& [role, b] : bytes.items()) {
    if (role.rfind("learner_", 0) == 0) {
      sum += b.value("sent", 0.0);
      ++n;
    }
  }
  return n ? sum / n / 1e6 : 0;
}

std::string seconds(double s) { return s < 0 ? "never" : fmt("%.1f", s); }

// The flags of `dloco chaos`.
struct ChaosOptions {
  std::string config_path, plan_path, name = "chaos";
  std::vector<std::string> overrides;
  bool no_reference = false, report_only = false;
  std::vector<std::string> baselines, dp_overrides;
  bool reuse = false;
};

// One run of the comparison: its report, its analysis and (decoupled runs) its replay in the goodput simulator.
struct Side {
  std::string label;
  nlohmann::json report;
  ChaosAnalysis analysis;
  sim::GoodputResult simulated;  // the same learner kills replayed in the goodput simulator
  nlohmann::json simulated_config;
};

bool is_dp(const Side& s) { return s.analysis.mode == "dp"; }

// Refuses a folder that holds runs this command would overwrite, or (--reuse) runs trained under another plan;
// creates the folder and copies the plan into it.
void check_chaos_folder(const ChaosOptions& o, const fs::path& dir) {
  if (o.reuse && !o.report_only && fs::exists(dir / "plan.toml")) {
    const auto slurp = [](const fs::path& p) {
      std::ifstream in(p);
      return std::string(std::istreambuf_iterator<char>(in), {});
    };
    if (slurp(dir / "plan.toml") != slurp(o.plan_path)) {
      throw InputError("--reuse: the runs in '" + dir.string() + "' were trained under another plan than " + o.plan_path);
    }
  }
  if (o.report_only) {
    if (!fs::exists(dir / "faulted" / "report.json")) {
      throw InputError("--report-only: '" + (dir / "faulted").string() + "' holds no finished run");
    }
    return;
  }
  if (fs::exists(dir / "chaos.json") && !o.reuse) {
    throw InputError("'" + dir.string() + "' already holds a chaos report: pick another --name (or --report-only, "
                     "or --reuse to add runs)");
  }
  for (const char* run : {"faulted", "fault-free"}) {
    if (fs::exists(dir / run) && !(o.reuse && fs::exists(dir / run / "report.json"))) {
      throw InputError("'" + (dir / run).string() + "' is left from an earlier attempt: pick another --name, "
                       "or remove it");
    }
  }
  fs::create_directories(dir);
  if (!(o.reuse && fs::exists(dir / "plan.toml"))) {
    fs::copy_file(o.plan_path, dir / "plan.toml", fs::copy_options::overwrite_existing);
  }
}

// The baselines under the same plan: the same config, diloco.mode = dp.
std::vector<Config> dp_baseline_configs(const ChaosOptions& opts, const fs::path& dir) {
  std::vector<Config> dp_runs;
  for (const auto& b : opts.baselines) {
    std::vector<std::string> o = opts.overrides;
    o.push_back("diloco.mode=dp");
    o.push_back(std::string("run.recovery=") + (b == "elastic-dp" ? "elastic" : "restart"));
    o.insert(o.end(), opts.dp_overrides.begin(), opts.dp_overrides.end());
    Config c = load_config(opts.config_path, o);
    c.run.out_dir = dir.string();
    c.run.name = b;
    if (!opts.report_only && fs::exists(c.run_dir()) && !(opts.reuse && fs::exists(c.run_dir() / "report.json"))) {
      throw InputError("'" + c.run_dir().string() + "' is left from an earlier attempt: pick another --name, or "
                       "remove it");
    }
    dp_runs.push_back(c);
  }
  return dp_runs;
}

// A finished run is reused only if it was trained with this very config.
void check_reused_configs(const std::vector<const Config*>& runs) {
  for (const Config* c : runs) {
    if (!fs::exists(c->run_dir() / "report.json")) continue;
    std::ifstream in(c->run_dir() / "config.toml");
    const std::string saved((std::istreambuf_iterator<char>(in)), {});
    if (saved != to_toml(*c)) {
      throw InputError("--reuse: '" + c->run_dir().string() + "' was trained with another config than this "
                       "command gives it (compare its config.toml); --report-only analyses it as it is");
    }
  }
}

// Trains each run (or reads its report: --report-only, --reuse) and analyses it; a run that did not finish or
// cannot be analysed is left out (one run's broken folder must not throw away the other's report).
std::vector<Side> train_and_analyse(const ChaosOptions& o, const std::vector<const Config*>& runs,
                                    const Config* reference, const fs::path& dir, const ChaosRunShape& shape) {
  std::vector<Side> sides;
  for (const Config* c : runs) {
    const bool dp = c->diloco.mode == Mode::kDp;
    nlohmann::json report;
    if (o.report_only || (o.reuse && fs::exists(c->run_dir() / "report.json"))) {
      if (fs::exists(c->run_dir() / "report.json")) report = nlohmann::json::parse(std::ifstream(c->run_dir() / "report.json"));
    } else {
      report = train_child(*c, dir, c != reference ? fs::absolute(dir / "plan.toml") : fs::path());
    }
    Side side{c->run.name, report, {}, {}, {}};
    if (side.report.is_null()) continue;
    try {
      if (dp) {
        side.analysis = analyze_dp_chaos_run(c->run_dir(), shape);
        sides.push_back(std::move(side));
        continue;
      }
      side.analysis = analyze_chaos_run(c->run_dir(), shape);
      const sim::GoodputConfig replay = replay_config(
          side.analysis, {static_cast<int>(c->diloco.learners), static_cast<int>(c->diloco.quorum),
                          c->diloco.inner_steps, static_cast<int>(c->diloco.fragments), c->diloco.overlap});
      side.simulated = sim::simulate_goodput(replay);
      side.simulated_config = sim::to_json(replay);
      side.simulated_config["trace_failures"] = replay.trace.size();
      side.simulated_config["result"] = sim::to_json(side.simulated, replay);
    } catch (const InputError& e) {
      spdlog::info("[chaos] {}: cannot analyse the run: {}", c->run.name, e.what());
      continue;
    }
    sides.push_back(std::move(side));
  }
  return sides;
}

// The table with one column per run: goodput, uptime, loss, steps, restarts, bytes and the consistency checks.
void summary_table(std::ostringstream& md, const std::vector<Side>& sides) {
  md << "\n| | ";
  for (const auto& s : sides) md << s.label << " | ";
  md << "\n|---|";
  for (size_t i = 0; i < sides.size(); ++i) md << "---|";
  md << "\n";
  auto row = [&](const std::string& label, auto value) {
    md << "| " << label << " | ";
    for (const auto& s : sides) md << value(s) << " | ";
    md << "\n";
  };
  const std::string na = "n/a";
  row("goodput", [](const Side& s) { return fmt("%.1f%%", 100 * s.analysis.goodput); });
  row("simulated goodput (same learner kills, `dloco sim` model)",
      [&](const Side& s) {
        if (s.analysis.learners_added + s.analysis.learners_left > 0) return std::string("n/a (joins and leaves are not modelled)");
        return is_dp(s) ? na : fmt("%.1f%%", 100 * s.simulated.goodput);
      });
  row("uptime", [](const Side& s) { return fmt("%.1f%%", 100 * s.analysis.uptime); });
  row("final val loss (nats/token)", [](const Side& s) { return fmt("%.4f", s.analysis.final_val_loss); });
  row("window s (started → final flush; dp: → last step)", [](const Side& s) { return fmt("%.0f", s.analysis.window_s); });
  row("nominal step s", [](const Side& s) { return fmt("%.3f", s.analysis.nominal_step_s); });
  auto sum = [](const Side& s, auto field) {
    double total = 0;
    for (const auto& l : s.analysis.learners) total += field(l);
    return total;
  };
  row("steps trained / kept / lost", [&](const Side& s) {
    return fmt("%.0f", sum(s, [](const LearnerTally& l) { return static_cast<double>(l.steps_trained); })) + " / " +
           fmt("%.0f", sum(s, [](const LearnerTally& l) { return l.steps_kept; })) + " / " +
           fmt("%.0f", sum(s, [](const LearnerTally& l) { return l.steps_lost; }));
  });
  row("faults injected", [](const Side& s) { return std::to_string(s.report.value("faults_injected", 0)); });
  row("learner restarts / syncer restarts (dp: worker restarts)", [&](const Side& s) {
    if (is_dp(s)) return std::to_string(s.report.value("worker_restarts", 0));
    return std::to_string(s.report.value("learner_restarts", 0)) + " / " + std::to_string(s.report.value("syncer_restarts", 0));
  });
  row("dp: group formations / pauses for failures, for returns", [&](const Side& s) {
    if (!is_dp(s)) return na;
    int failures = 0, grows = 0;
    for (const auto& p : s.analysis.pauses) (p.reason == "grow" ? grows : failures) += 1;
    return std::to_string(s.analysis.generations) + " / " + std::to_string(failures) + ", " + std::to_string(grows);
  });
  row("dp: mean pause s (failure; return) / steps rolled back", [&](const Side& s) {
    if (!is_dp(s)) return na;
    double pf = 0, pg = 0;
    int nf = 0, ng = 0;
    int64_t rolled = 0;
    for (const auto& p : s.analysis.pauses) {
      rolled += p.rolled_back_steps;
      if (p.pause_s < 0) continue;
      (p.reason == "grow" ? pg : pf) += p.pause_s;
      (p.reason == "grow" ? ng : nf) += 1;
    }
    return fmt("%.1f", nf ? pf / nf : 0.0) + "; " + fmt("%.1f", ng ? pg / ng : 0.0) + " / " + std::to_string(rolled);
  });
  row("MB sent per learner (since the last syncer start)", [&](const Side& s) {
    return is_dp(s) ? na : fmt("%.1f", sent_per_learner_mb(s.report));
  });
  row("exact data: batches / repeated / gaps (jumps over batches)", [&](const Side& s) {
    if (is_dp(s)) return std::string("n/a (rolled-back batches are retrained)");
    return std::to_string(s.analysis.batches) + " / " + std::to_string(s.analysis.duplicate_batches) + " / " +
           std::to_string(s.analysis.gaps);
  });
  row("versions only increase (dp: steps count up from a reached checkpoint)", [&](const Side& s) {
    if (is_dp(s)) return std::string(s.analysis.lineage_ok ? "yes" : "NO");
    return std::string(s.analysis.version_regressions == 0 ? "yes" : "NO");
  });
  row("final copies equal Θ (checked)", [&](const Side& s) {
    if (is_dp(s)) return na;
    return std::to_string(s.analysis.fragments_equal) + "/" + std::to_string(s.analysis.fragments_checked);
  });
  row("no NaN", [](const Side& s) { return std::string(s.analysis.nan_free ? "yes" : "NO"); });
  row("consistency checks", [](const Side& s) { return std::string(s.analysis.consistent() ? "pass" : "FAIL"); });
}

// Per learner, recoveries and link faults of one faulted run.
void per_learner_tables(std::ostringstream& md, const Side& side) {
  const ChaosAnalysis& f = side.analysis;
  md << "\nPer learner (" << side.label << "):\n\n| learner | steps trained | kept | lost | incarnations | kills | "
        "joined at s / left at s (scavenging) |\n|---|---|---|---|---|---|---|\n";
  for (const auto& l : f.learners) {
    md << "| " << l.id << " | " << l.steps_trained << " | " << fmt("%.1f", l.steps_kept) << " | "
       << fmt("%.1f", l.steps_lost) << " | " << l.incarnations << " | " << l.kills << " | "
       << (l.joined_at_s >= 0 ? fmt("%.1f", l.joined_at_s) : std::string("start")) << " / "
       << (l.left_at_s >= 0 ? fmt("%.1f", l.left_at_s) : std::string("-")) << " |\n";
  }
  if (f.learners_added + f.learners_left > 0) {
    md << "\nAllocated learner-seconds (goodput's denominator): " << fmt("%.0f", f.slot_seconds) << " ("
       << f.learners_added << " joined, " << f.learners_left << " left).\n";
  }
  if (!f.recoveries.empty() || !f.syncer_downtime.empty()) {
    md << "\nRecoveries of " << side.label << " (seconds after the kill):\n\n| process | killed at s | back (joined / "
          "listening) | contributing (first kept answer / first merge; dp: first step) |\n|---|---|---|---|\n";
    for (const auto& r : f.recoveries) {
      md << "| learner " << r.learner << " | " << fmt("%.1f", r.killed_at_s) << " | " << seconds(r.back_s) << " | "
         << seconds(r.contributing_s) << " |\n";
    }
    for (const auto& r : f.syncer_downtime) {
      md << "| syncer | " << fmt("%.1f", r.killed_at_s) << " | " << seconds(r.back_s) << " | "
         << seconds(r.contributing_s) << " |\n";
    }
  }
  if (!f.link_faults.empty()) {
    md << "\nLink faults of " << side.label << ":\n\n| learner | fault | at s | lasting s | its steps meanwhile | "
          "end → first kept answer s |\n|---|---|---|---|---|---|\n";
    for (const auto& l : f.link_faults) {
      md << "| " << l.learner << " | " << l.action << " | " << fmt("%.1f", l.at_s) << " | "
         << fmt("%.1f", l.duration_s) << " | " << l.steps_during << " | " << seconds(l.contributing_s) << " |\n";
    }
  }
}

// The loss difference against the fault-free run and each dp baseline's group stops.
void loss_and_group_stops(std::ostringstream& md, const std::vector<Side>& sides) {
  if (sides.size() >= 2 && sides[1].label == "fault-free") {
    md << "\nLoss difference (faulted − fault-free): "
       << fmt("%+.4f", sides[0].analysis.final_val_loss - sides[1].analysis.final_val_loss) << " nats/token.\n";
  }
  for (const auto& s : sides) {
    if (!is_dp(s) || s.analysis.pauses.empty()) continue;
    md << "\nGroup stops of " << s.label << " (pause = its last step → the next generation's first step):\n\n"
       << "| generation | reason | at s | pause s | steps rolled back | workers after |\n|---|---|---|---|---|---|\n";
    for (const auto& p : s.analysis.pauses) {
      md << "| " << p.generation << " | " << p.reason << " | " << fmt("%.1f", p.stopped_at_s) << " | "
         << seconds(p.pause_s) << " | " << p.rolled_back_steps << " | " << p.world_after << " |\n";
    }
  }
}

// <folder>/chaos.md (also printed) and <folder>/chaos.json.
void write_chaos_report(const ChaosOptions& o, const fs::path& dir, const Config& faulted, const FaultPlan& plan,
                        size_t faults, const std::vector<Config>& dp_runs, const std::vector<Side>& sides) {
  std::ostringstream md;
  md << "# dloco chaos: " << o.name << "\n\nConfig `" << o.config_path << "`, plan `" << o.plan_path << "` ("
     << faults << " faults), " << faulted.train.total_tokens << " tokens per run, M = "
     << faulted.diloco.learners << ".\n";
  if (!dp_runs.empty()) {
    md << "Baselines: the same config with diloco.mode = dp, run.recovery = elastic (elastic-dp) or restart "
          "(dp-restart)";
    if (!o.dp_overrides.empty()) md << "; --dp-set";
    for (const auto& d : o.dp_overrides) md << " " << d;
    md << "; rank 0 checkpoints every " << dp_runs[0].train.checkpoint_interval << " steps.\n";
  }
  summary_table(md, sides);
  for (const auto& side : sides) {
    if (side.label != "fault-free") per_learner_tables(md, side);
  }
  loss_and_group_stops(md, sides);
  md << "\nDefinitions: src/chaos/chaos_report.h (goodput, uptime, recovery); docs/protocol.md §7.\n";

  nlohmann::json out = {{"config", o.config_path}, {"plan", plan.to_json(static_cast<int>(faulted.diloco.learners))},
                        {"runs", nlohmann::json::array()}};
  for (const auto& s : sides) {
    out["runs"].push_back({{"name", s.label}, {"analysis", s.analysis.to_json()}, {"report", s.report},
                           {"simulated", s.simulated_config}});
  }
  write_file_atomically(dir / "chaos.json", out.dump(2) + "\n");
  write_file_atomically(dir / "chaos.md", md.str());
  std::printf("\n%s\nwritten: %s, %s\n", md.str().c_str(), (dir / "chaos.md").c_str(), (dir / "chaos.json").c_str());
  std::fflush(stdout);
}

void run_chaos(const ChaosOptions& o) {
  Config faulted = load_config(o.config_path, o.overrides);
  if (faulted.diloco.mode != Mode::kDecoupled) {
    throw InputError(std::string("dloco chaos needs diloco.mode = \"decoupled\" (got \"") + to_string(faulted.diloco.mode) +
                     "\"); --baselines elastic-dp,dp-restart adds data parallel under the same plan");
  }
  const fs::path dir = fs::path(faulted.run.out_dir) / o.name;
  // --report-only describes the plan that ran (the folder's copy), not whatever --plan holds now.
  const fs::path plan_file = o.report_only && fs::exists(dir / "plan.toml") ? dir / "plan.toml" : fs::path(o.plan_path);
  const FaultPlan plan = load_fault_plan(plan_file);
  const auto resolved = plan.resolve(static_cast<int>(faulted.diloco.learners));  // bad slots fail now
  check_chaos_folder(o, dir);
  faulted.run.out_dir = dir.string();
  faulted.run.name = "faulted";
  Config reference = faulted;
  reference.run.name = "fault-free";
  const std::vector<Config> dp_runs = dp_baseline_configs(o, dir);
  spdlog::info("[chaos] plan '{}': {} faults over a run of {} tokens, M = {}; folder {}", plan.name,
               resolved.size(), static_cast<long long>(faulted.train.total_tokens),
               static_cast<long long>(faulted.diloco.learners), dir.string());
  for (const auto& f : resolved) spdlog::info("[chaos]   {}", f.describe());

  const ChaosRunShape shape{static_cast<int>(faulted.diloco.learners), static_cast<int>(faulted.diloco.fragments),
                            faulted.diloco.inner_steps, faulted.train.tokens_per_step(faulted.model), 5.0};
  std::vector<const Config*> runs{&faulted};
  if (!o.no_reference) runs.push_back(&reference);
  for (const auto& c : dp_runs) runs.push_back(&c);
  if (o.reuse && !o.report_only) check_reused_configs(runs);
  const std::vector<Side> sides = train_and_analyse(o, runs, &reference, dir, shape);
  if (sides.empty()) throw InputError("no run finished: see the logs in " + dir.string());
  write_chaos_report(o, dir, faulted, plan, resolved.size(), dp_runs, sides);
}

}  // namespace

void add_chaos_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("chaos", "Train under a fault plan and beside a fault-free run at equal tokens; "
                                          "report goodput, uptime, recoveries and consistency checks");
  static ChaosOptions o;
  cmd->add_option("--config", o.config_path, "TOML config of a decoupled run (e.g. configs/demo.toml)")->required();
  cmd->add_option("--plan", o.plan_path, "Fault plan (e.g. plans/smoke.toml; format in src/chaos/fault_plan.h)")->required();
  cmd->add_option("--set", o.overrides, "Override a config field in both runs (repeatable)");
  cmd->add_option("--name", o.name, "Folder under run.out_dir for both runs and the report")->capture_default_str();
  cmd->add_flag("--no-reference", o.no_reference, "Skip the fault-free run (no loss comparison)");
  cmd->add_option("--baselines", o.baselines,
                  "Also run data parallel under the same plan: elastic-dp (run.recovery = elastic: the survivors "
                  "re-form at once) and/or dp-restart (run.recovery = restart: all wait and restart from the last "
                  "checkpoint); comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"elastic-dp", "dp-restart"}));
  cmd->add_option("--dp-set", o.dp_overrides,
                  "Override a config field in the baseline runs only, e.g. train.checkpoint_interval=8 (repeatable)");
  cmd->add_flag("--reuse", o.reuse,
                "Keep the runs that already finished in the folder (same plan) and train only the missing ones");
  cmd->add_flag("--report-only", o.report_only,
                "Train nothing: analyse the runs already in the folder again (faulted/, fault-free/)");
  cmd->callback([] { run_chaos(o); });
}

}  // namespace dloco::apps
