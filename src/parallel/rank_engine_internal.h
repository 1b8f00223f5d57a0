// Internal to the rank engines (rank_engine.cc, pipeline_engine.cc): the step helpers they share and the pipeline
// engine's factory. Deliberately not for use outside src/parallel.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "core/check.h"
#include "parallel/rank_engine.h"

namespace dloco::rank_engine_detail {

// Inputs and targets of window w: (B, T) each, views of windows[w] as train/trainer.cc reads it.
inline std::pair<torch::Tensor, torch::Tensor> window_batch(const torch::Tensor& windows, int64_t w, int64_t B, int64_t T) {
  const auto row = windows[w];  // (B·T + 1)
  return {row.narrow(0, 0, B * T).view({B, T}), row.narrow(0, 1, B * T).view({B, T})};
}

inline double max_norm_of(const TrainConfig& train) {
  return train.grad_clip > 0 ? train.grad_clip : std::numeric_limits<double>::infinity();
}

inline void set_lr(torch::optim::AdamW& adamw, double lr) {
  for (auto& group : adamw.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

inline void save_adamw(torch::optim::AdamW& adamw, const std::filesystem::path& file) { torch::save(adamw, file.string()); }

inline void load_adamw(torch::optim::AdamW& adamw, const std::filesystem::path& file) {
  try {
    torch::load(adamw, file.string());
  } catch (const c10::Error& e) {
    throw InputError("cannot load the optimizer state '" + file.string() + "': " + e.what_without_backtrace());
  }
}

// Copies `full` into `target` after checking the shape.
inline void copy_checked(torch::Tensor target, const torch::Tensor& full, const std::string& name) {
  if (target.sizes() != full.sizes()) {
    throw InputError("parameter '" + name + "' has shape " + c10::str(target.sizes()) + ", the value " +
                     c10::str(full.sizes()));
  }
  torch::NoGradGuard no_grad;
  target.copy_(full);
}

// train/trainer.cc's guard: a non-finite loss or gradient norm skips the step (moments untouched, gradients
// dropped); else one AdamW step. Sets r.skipped.
inline void guard_and_step(torch::optim::AdamW& adamw, EngineStep& r) {
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (r.skipped) {
    adamw.zero_grad();
  } else {
    adamw.step();
  }
}

}  // namespace dloco::rank_engine_detail

namespace dloco {
/// The engine of pipeline = p (× tensor = t) groups (pipeline_engine.cc).
std::unique_ptr<RankEngine> make_pipeline_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group);
}  // namespace dloco
