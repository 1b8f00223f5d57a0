// A launcher's run folder and report (shared by the decoupled, baselines and SkipPipe launchers): the checks and
// files before any child starts, the final evaluation of the newest checkpoint, the run's status and exit code, and
// the loss plot. Spawning and stopping the children themselves is process/children.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace dloco {

/// What both launchers (decoupled and baselines) set up before starting children.
struct RunFolder {
  int learners = 1;        // M
  int cores = 1;           // cores of this run (run.threads, 0 = all)
  int child_threads = 1;   // BLAS threads per learner or worker: cores / M, at least 1
  std::string config_path; // run_dir/config.toml, the resolved config every child reads
};

/// Fails fast on a missing corpus or a broken tokenizer (here rather than in M children or after training),
/// creates run_dir/logs and run_dir/events and writes the resolved config. Throws InputError naming the problem.
RunFolder prepare_run_folder(const Config& config);

/// The report's common part, after the children have stopped: the newest checkpoint evaluated on the whole
/// validation split and a short sample from it, on all of the run's cores. Returns {"checkpoint", "val_loss",
/// "val_perplexity", "sample"}. Throws InputError if there is no valid checkpoint.
nlohmann::json evaluate_final_checkpoint(const Config& config, int cores);

/// The report's final evaluation (evaluate_final_checkpoint), or {"checkpoint", "val_loss", "val_perplexity",
/// "sample"} all null with "skipped" saying why: `skip_reason` when not empty (a second signal asked to hurry, the
/// run failed), or no valid checkpoint yet.
nlohmann::json final_evaluation(const Config& config, int cores, const std::string& skip_reason);

/// Why a launcher's report skips its final evaluation: a second signal asked to hurry, or the run failed; "" if not.
std::string final_eval_skip_reason(bool hurry, const std::string& failure);

/// A run's status for its report: "failed" (`failure` not empty: a crash loop, a role that failed), "stopped"
/// (interrupted by a signal or a role that vanished), "incomplete" (it ended below Config::complete_tokens()) or
/// "finished".
std::string run_status(const Config& config, bool interrupted, const std::string& failure, int64_t tokens_trained);

/// Draws run_dir/loss.png with gnuplot (sim::plot, the tool `dloco compare` uses): each learner's (or worker's)
/// training loss per step, and the global model's validation loss at its evaluations ending at the report's final
/// loss. Reads the run's event logs (decoupled: events/learner_<id>.jsonl and evaluator.jsonl; baselines:
/// events/worker_<r>.jsonl; local: events.jsonl). Returns the plot's path, or "" with the reason printed when there is
/// nothing to draw or gnuplot is missing.
std::filesystem::path write_loss_plot(const Config& config, const nlohmann::json& report);

/// The exit status of `dloco train` for a report: 0 finished, 1 failed or stopped without a signal, 3 incomplete,
/// 128 + the signal when one stopped it.
int report_exit_code(const nlohmann::json& report);

}  // namespace dloco
