// A launcher's run folder and report: the checks and files before children start, the final evaluation, the
// run's status and exit code, the loss plot; see run_report.h.
#include "launcher/run_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "process/atomic_file.h"
#include "process/private_file.h"
#include "sim/report.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/threads.h"

namespace dloco {

RunFolder prepare_run_folder(const Config& config) {
  namespace fs = std::filesystem;
  split_shards(fs::path(config.data.dir), "train");
  split_shards(fs::path(config.data.dir), "val");
  Tokenizer(fs::path(config.data.dir) / "tokenizer.model").encode("And God said");
  RunFolder f;
  f.learners = static_cast<int>(config.diloco.learners);
  f.cores = config.run.threads > 0 ? static_cast<int>(config.run.threads) : machine_cores();
  f.child_threads = std::max(1, f.cores / f.learners);
  const fs::path run_dir = config.run_dir();
  fs::create_directories(run_dir / "logs");
  fs::create_directories(run_dir / "events");
  write_private_file_atomically(run_dir / "config.toml", to_toml(config));
  copy_tokenizer_into_run(config);
  f.config_path = (run_dir / "config.toml").string();
  return f;
}

nlohmann::json evaluate_final_checkpoint(const Config& config, int cores) {
  apply_thread_budget(thread_budget(cores));
  const auto ckpt = resolve_checkpoint(config.run_dir());
  const auto eval = evaluate_checkpoint(ckpt.dir, std::nullopt, 0, cores);
  return {{"checkpoint", ckpt.dir.string()},
          {"val_loss", eval["val_loss"]},
          {"val_perplexity", eval["val_perplexity"]},
          {"sample", generate_from_checkpoint(ckpt.dir, "And God said", 48, 0.8, 40, config.run.seed, cores)}};
}

}  // namespace dloco

namespace dloco {

std::string final_eval_skip_reason(bool hurry, const std::string& failure) {
  if (hurry) return "a second signal asked to stop at once";
  if (!failure.empty()) return "the run failed";
  return "";
}

nlohmann::json final_evaluation(const Config& config, int cores, const std::string& skip_reason) {
  nlohmann::json none = {
      {"checkpoint", nullptr}, {"val_loss", nullptr}, {"val_perplexity", nullptr}, {"sample", nullptr}};
  if (!skip_reason.empty()) {
    none["skipped"] = skip_reason;
    return none;
  }
  try {
    return evaluate_final_checkpoint(config, cores);
  } catch (const InputError& e) {  // no valid checkpoint: the run stopped before its first one
    none["skipped"] = e.what();
    return none;
  }
}

std::string run_status(const Config& config, bool interrupted, const std::string& failure, int64_t tokens_trained) {
  if (!failure.empty()) return "failed";
  if (interrupted) return "stopped";
  return tokens_trained < config.complete_tokens() ? "incomplete" : "finished";
}

int report_exit_code(const nlohmann::json& report) {
  const int sig = report.value("signal", 0);
  if (sig != 0) return 128 + sig;
  const std::string status = report.value("status", "");
  if (status == "finished") return 0;
  if (status == "incomplete") return 3;
  return 1;
}

namespace {

// (x, y) of the events named `event` in a JSON-lines log, with y the field `y` and x the field `x`; bad lines skipped.
std::vector<std::pair<double, double>> event_points(const std::filesystem::path& log, const std::string& event,
                                                    const char* x, const char* y) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"" + event + "\"") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("event", "") != event || !j.contains(x) || !j.contains(y)) continue;
    if (!j[x].is_number() || !j[y].is_number()) continue;
    const double xv = j[x].get<double>(), yv = j[y].get<double>();
    if (xv > 0 && std::isfinite(yv)) out.emplace_back(xv, yv);
  }
  return out;
}

// At most ~400 points: means over equal windows (a training loss per step is noisy and long).
sim::PlotSeries series_of(const std::string& title, const std::vector<std::pair<double, double>>& points) {
  sim::PlotSeries s{title, {}, {}};
  const size_t window = std::max<size_t>(1, points.size() / 400);
  for (size_t i = 0; i + window <= points.size(); i += window) {
    double x = 0, y = 0;
    for (size_t k = i; k < i + window; ++k) x += points[k].first, y += points[k].second;
    s.x.push_back(x / window);
    s.y.push_back(y / window);
  }
  return s;
}

}  // namespace

std::filesystem::path write_loss_plot(const Config& config, const nlohmann::json& report) {
  namespace fs = std::filesystem;
  const fs::path run = config.run_dir(), events = run / "events";
  std::vector<sim::PlotSeries> series;
  std::vector<std::pair<double, double>> val;
  if (config.diloco.mode == Mode::kLocal) {
    series.push_back(series_of("training loss", event_points(run / "events.jsonl", "progress", "step", "loss")));
    val = event_points(run / "events.jsonl", "eval", "step", "val_loss");
  } else {
    const bool decoupled = config.diloco.mode == Mode::kDecoupled;
    std::vector<std::pair<int, fs::path>> logs;  // (id, file), by id
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(events, ec)) {
      const std::string name = entry.path().filename().string(), prefix = decoupled ? "learner_" : "worker_";
      const bool rank = name.find("_rank_") != std::string::npos;  // a learner group's ranks log no loss
      if (name.rfind(prefix, 0) != 0 || rank || entry.path().extension() != ".jsonl") continue;
      try {
        logs.emplace_back(std::stoi(name.substr(prefix.size())), entry.path());
      } catch (const std::exception&) {
      }
    }
    std::sort(logs.begin(), logs.end());
    for (const auto& [id, file] : logs) {
      auto points = event_points(file, "step", "step", "loss");
      if (!points.empty()) {
        series.push_back(series_of((decoupled ? "learner " : "worker ") + std::to_string(id), points));
      }
    }
    val = decoupled ? event_points(events / "evaluator.jsonl", "eval", "global_step", "val_loss")
                    : event_points(events / "worker_0.jsonl", "eval", "step", "val_loss");
  }
  if (report.value("final_val_loss", nlohmann::json()).is_number() && report.value("steps", 0) > 0) {
    val.emplace_back(report["steps"].get<double>(), report["final_val_loss"].get<double>());
  }
  if (!val.empty()) series.push_back(series_of("global model, validation", val));
  std::erase_if(series, [](const sim::PlotSeries& s) { return s.x.empty(); });
  if (series.empty()) {
    spdlog::info("no loss plot: the run logged no step");
    return {};
  }
  const fs::path out = run / "loss.png";
  try {
    sim::plot(series, "loss of run " + config.run.name, "step", "loss (nats/token)", false, out);
  } catch (const InputError& e) {
    spdlog::info("no loss plot: {}", e.what());
    return {};
  }
  return out;
}

}  // namespace dloco
