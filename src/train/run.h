// Entry points the CLI calls (torch-free header, so src/apps stays out of LibTorch's compile time).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

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

/// The prepared data in config.data.dir fits the model: its tokenizer's vocabulary at most model.vocab_size and the
/// train shards declare the tokenizer's vocabulary. Every mode checks it before any process starts (a model whose
/// vocabulary is too small fails later with LibTorch's "index out of range"). Throws InputError saying what to change.
void check_data_fits_model(const Config& config);

/// run.device names a torch device this build can use ("cpu"; "cuda" or "cuda:N" only with a CUDA LibTorch and a
/// visible GPU; N is not compared with the device count here). Every mode and role checks it before it starts
/// anything (a CPU build given "cuda" used to start its learners, which died before their first step and were
/// restarted in a loop). Throws InputError saying which.
void check_device(const std::string& name);

/// Which SkipPipe stages of the model run (model/stages.h; docs/skippipe.md "Inference with stages down").
struct StageSelection {
  int64_t count = 0;            // S: the model's blocks cut into S stages; 0 = model.n_layer (a block per stage)
  std::vector<int64_t> stages;  // a fixed subset (increasing, with stage 0); empty = every stage
  double skip_random = 0;       // > 0: stage 0 plus a random sorted subset of round(S·(1 − skip)) − 1 others, redrawn
                                // per batch (replaces `stages`)
  uint64_t seed = 1;            // of the random subsets
};

/// Validation loss and perplexity of a checkpoint (a run folder or a checkpoint folder) on `data_dir`
/// (default: the checkpoint's own data.dir) over `max_tokens` tokens (0 = all). With `stages`, only those stages
/// run, and the result also has "val_perplexity_per_sequence" (the SkipPipe reference's definition: the mean over
/// sequences of exp(mean token NLL), beside exp(mean loss)) and the stages used. Throws InputError on a bad
/// selection (see stage_blocks, random_stage_subset) or bad --tokens.
nlohmann::json evaluate_checkpoint(const std::filesystem::path& checkpoint, const std::optional<std::string>& data_dir,
                                   int64_t max_tokens, int threads, const StageSelection* stages = nullptr);

/// Text sampled from a checkpoint: `prompt` continued by `tokens` tokens (temperature, top-k, seed; temperature 0 =
/// greedy, the most likely token each time), with the fixed stage subset of `stages` when given (skip_random is
/// refused: one sample has one path). The tokenizer: `tokenizer` when not empty, else checkpoint_tokenizer().
std::string generate_from_checkpoint(const std::filesystem::path& checkpoint, const std::string& prompt,
                                     int64_t tokens, double temperature, int64_t top_k, uint64_t seed, int threads,
                                     const StageSelection* stages = nullptr,
                                     const std::filesystem::path& tokenizer = {});

/// The tokenizer a checkpoint was trained with: the run folder's own copy (run_dir/tokenizer.model, written when the
/// run started, so a copied run folder can still be sampled), else data.dir/tokenizer.model of its config. Throws
/// InputError naming both places when neither exists.
std::filesystem::path checkpoint_tokenizer(const std::filesystem::path& checkpoint_dir, const Config& config);

/// Copies data.dir/tokenizer.model and tokenizer.vocab into the run folder unless they are there already: a run
/// folder carries what it takes to sample its checkpoints. Throws InputError if they cannot be copied.
void copy_tokenizer_into_run(const Config& config);

}  // namespace dloco
