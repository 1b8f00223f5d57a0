// Entry points the CLI calls (torch-free header, so src/apps stays out of LibTorch's compile time).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace dloco {

struct RunOptions {
  bool resume = false;            // continue the run folder's newest checkpoint instead of starting fresh
  int64_t stop_after_steps = 0;   // stop this invocation after so many steps (0 = run to the token budget);
                                  // it ends like an interrupt: final checkpoint, report, resumable
};

/// Trains one model in this process (diloco.mode = "local": the inner loop alone, no syncer) with periodic
/// evaluation and checkpoints, and ends with a report (also written as <run>/report.json): final validation
/// loss and perplexity, a generated sample, tokens trained, wall time. SIGINT/SIGTERM stop it after the current
/// step with a checkpoint. Throws InputError on bad set-up (missing corpus, vocabulary larger than the model's,
/// a run folder that exists without `resume`, an unknown device).
nlohmann::json run_local(const Config& config, const RunOptions& options);

/// Validation loss and perplexity of a checkpoint (a run folder or a checkpoint folder) on `data_dir`
/// (default: the checkpoint's own data.dir) over `max_tokens` tokens (0 = all).
nlohmann::json evaluate_checkpoint(const std::filesystem::path& checkpoint, const std::optional<std::string>& data_dir,
                                   int64_t max_tokens, int threads);

/// Text sampled from a checkpoint: `prompt` continued by `tokens` tokens (temperature, top-k, seed).
std::string generate_from_checkpoint(const std::filesystem::path& checkpoint, const std::string& prompt,
                                     int64_t tokens, double temperature, int64_t top_k, uint64_t seed, int threads);

}  // namespace dloco
