// The inner optimisation of one learner (docs/protocol.md §3 steps 1–3): micro-batches with gradient
// accumulation, global-norm clipping, AdamW with warmup + cosine, and a guard that skips a step whose loss or
// gradients are not finite. Also the evaluation of a model on the validation split.
// Deliberately not here: anything about the syncer or the network; this is the hot path and adds nothing to a
// bare LibTorch loop but the cursor bookkeeping.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <utility>

#include "core/config.h"
#include "core/lr_schedule.h"
#include "data/stream.h"
#include "model/gpt.h"

namespace dloco {

/// Outcome of one optimizer step.
struct StepResult {
  double loss = 0;        // mean training loss over the micro-batches, nats/token
  double grad_norm = 0;   // global gradient norm before clipping
  double lr = 0;          // learning rate used
  int64_t tokens = 0;     // tokens consumed (B·T·grad_accum), also when skipped
  bool skipped = false;   // non-finite loss or gradient: parameters and moments untouched
};

/// AdamW on one GPT replica. Parameters are only ever changed in place (the optimizer's state is keyed by the
/// parameter tensors themselves in LibTorch 1.13), so fragments can be overwritten by merges without losing moments.
class InnerTrainer {
 public:
  /// `schedule` gives the lr per global step. The model must already live on `device`.
  InnerTrainer(GPT model, const TrainConfig& train, LrSchedule schedule, torch::Device device);

  /// One optimizer step at global step `step` on grad_accum windows from `stream`.
  StepResult step(DataStream& stream, int64_t step);

  /// Called after the micro-batches' backward passes and before clipping, with the mean loss over them; returns
  /// the loss the non-finite guard and StepResult use. The dp mode all-reduces gradients and the loss here, so
  /// every worker clips, guards and steps on the same numbers. Empty = no hook.
  using GradientHook = std::function<double(double loss)>;
  void set_gradient_hook(GradientHook hook) { gradient_hook_ = std::move(hook); }

  /// SkipPipe training (docs/skippipe.md "Training with skips"; skip.stages = 0 turns it off): in every step,
  /// micro-batch m runs stage 0 and the other stages of its path (balanced_stage_paths, drawn from `seed` and the
  /// step, so a resumed run draws the same paths), the gradients of stage s's parameters are averaged over the n_s
  /// micro-batches that visited it (stage 0's, as before, over all grad_accum), then the hook, the global clip
  /// and AdamW run as before. Every skip.full_depth_every-th step (step + 1 a multiple of it) runs the full depth.
  /// The model runs the full depth again when step returns (evaluation, fragments, checkpoints see every block).
  /// The config must have passed Config::validate (S divides n_layer; equal visits possible for grad_accum).
  void set_skip(const SkipConfig& skip, uint64_t seed);
  /// Paths from elsewhere (a SkipPipe schedule's stage sequences; the multi-process pipeline's reference): called
  /// once per skip step with the step, it returns grad_accum paths, each stage 0 then non-zero stages in increasing
  /// order. Replaces the balanced random draw. A stage no path visits gets no gradient (AdamW skips it that step;
  /// under the dp baseline's gradient hook it would be averaged as zeros, so dp keeps the balanced draw). Every path is
  /// checked (stage_blocks) before the first micro-batch runs: InputError, nothing consumed.
  using PathSource = std::function<std::vector<std::vector<int64_t>>(int64_t step)>;
  void set_path_source(PathSource source) { path_source_ = std::move(source); }
  /// The paths of the last step (one per micro-batch; empty when it ran the full depth).
  const std::vector<std::vector<int64_t>>& last_paths() const { return last_paths_; }

  GPT& model() { return model_; }
  torch::optim::AdamW& optimizer() { return *optimizer_; }
  const LrSchedule& schedule() const { return schedule_; }
  /// Fresh AdamW moments from global step `from_step` > 0 in a warm run: LrSchedule::rewarm_from.
  void rewarm(int64_t from_step) { schedule_.rewarm_from = from_step; }

 private:
  GPT model_;
  TrainConfig train_;
  LrSchedule schedule_;
  torch::Device device_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  torch::Tensor window_;  // (B·(T + 1)) int64, B rows of T + 1 (data/stream.h), reused every micro-batch
  GradientHook gradient_hook_;
  SkipConfig skip_;
  uint64_t skip_seed_ = 0;
  std::vector<int64_t> param_stage_;  // per model_->parameters() entry: its stage under skip_ (0 outside blocks)
  std::vector<std::vector<int64_t>> last_paths_;
  PathSource path_source_;

  // Scales each stage's accumulated gradients (already divided by grad_accum) to the mean over its visitors.
  void average_stage_gradients(const std::vector<std::vector<int64_t>>& paths);
};

/// Inputs and targets of one batch window (window_tokens(B, T) int64 values, B rows of T + 1 tokens: data/stream.h):
/// x = each row's tokens [0, T), y = its tokens [1, T + 1), each (B, T) and contiguous.
inline std::pair<torch::Tensor, torch::Tensor> window_batch(const torch::Tensor& window, int64_t B, int64_t T) {
  const auto rows = window.view({B, T + 1});
  return {rows.narrow(1, 0, T).contiguous(), rows.narrow(1, 1, T).contiguous()};
}

/// The seed of learner (or worker) `id`'s SkipPipe paths (InnerTrainer::set_skip): run.seed + 7919·id, so the
/// one-process local run and learner 0 of a decoupled run draw the same paths, and every other learner its own.
inline uint64_t skip_path_seed(uint64_t run_seed, int64_t id) { return run_seed + 7919 * static_cast<uint64_t>(id); }

/// torch::optim::AdamW with train/trainer.cc's recipe (train.lr, betas, eps; weight decay on tensors of dim ≥ 2
/// only, never on norm gains) over `params`: shared by the one-process learner and the ranks of a learner group.
std::unique_ptr<torch::optim::AdamW> make_inner_adamw(const std::vector<torch::Tensor>& params,
                                                      const TrainConfig& train);

/// Mean next-token loss (nats/token) of `model` on the split's first `max_tokens` tokens (0 = all) in
/// non-overlapping windows of B sequences × T tokens; a partial last batch is evaluated too. Runs without
/// gradients and restores the model's training mode.
double evaluate_loss(GPT& model, const TokenSplit& split, int64_t max_tokens, int64_t batch_size, torch::Device device);


}  // namespace dloco
