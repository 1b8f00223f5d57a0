// bf16 mixed precision inside a learner, Megatron's scheme (Shoeybi et al. 2019; Micikevicius et al. 2018 for
// the master-weight idea; Megatron-LM's Float16OptimizerWithFloat16Params and its `main_grad`):
//   - the model's parameters are the bf16 compute copy (2 bytes each): forward and backward run in bf16;
//   - each parameter's gradient is accumulated into an fp32 buffer (`main_grad`, 4 bytes) by a post hook on the
//     parameter's AccumulateGrad node, which then drops the bf16 .grad, so no bf16 gradient lingers past its
//     parameter's last backward use (the cost: one bf16 gradient per parameter, transiently, while backward runs);
//   - fp32 master weights (4 bytes) and AdamW's m, v (4 + 4) live in the optimizer; global-norm clipping runs on
//     the fp32 gradients, torch::optim::AdamW steps the masters, and the bf16 copy is refreshed from them.
// 2 + 4 + 12 = 18 bytes per parameter unsharded (docs/parallel.md). Collectives stay fp32: main_grads()
// are what a data-parallel group reduces (Gloo cannot all-reduce bf16).
// Also here: CPU autocast as the other way to run bf16 (fp32 weights cast per op, no master copy). The precision
// key is `[parallel] precision` (core/config.h), which refuses fp16 (no fp16 matmul on this CPU build).
// Deliberately not here: the fp16 dynamic loss scaler (src/parallel/loss_scaler.h, the `pipe` part), sharding of
// the masters and moments (ZeRO, src/parallel/zero.*), the data-parallel reduction itself (process_group.h).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"

namespace dloco {

/// Live bytes of model and optimizer state by category, summed from the tensors themselves (numel · element size).
struct PrecisionMemory {
  int64_t parameters = 0;   // Ψ elements of the model
  int64_t model_bytes = 0;  // the bf16 compute copy: 2Ψ
  int64_t grad_bytes = 0;   // fp32 main_grad buffers: 4Ψ (plus any bf16 .grad still held: 0 after backward)
  int64_t master_bytes = 0; // fp32 master weights: 4Ψ
  int64_t m_bytes = 0;      // AdamW first moments, fp32: 4Ψ (0 before the first step)
  int64_t v_bytes = 0;      // AdamW second moments, fp32: 4Ψ (0 before the first step)
  int64_t total() const { return model_bytes + grad_bytes + master_bytes + m_bytes + v_bytes; }
};

/// Outcome of one optimizer step.
struct MixedStepResult {
  double grad_norm = 0;  // global L2 norm of the fp32 gradients before clipping
  bool skipped = false;  // a non-finite gradient (or loss): no update, masters, moments and bf16 copy untouched
};

/// Owns the fp32 side of a bf16 model: masters, main_grads and the AdamW over the masters.
/// Use per step: zero_grad(); loss = model->loss(x, y) (bf16 compute, fp32 loss); loss.backward(); step(lr, loss).
/// Weight decay applies to matrices only (dim ≥ 2), never to norm gains, as in InnerTrainer.
class Bf16Optimizer {
 public:
  /// Takes an fp32 model, copies its parameters into fp32 masters (exact), then casts the model's parameters and
  /// buffers to bf16 in place (module.to(kBFloat16)) and hooks each parameter's gradient accumulator.
  /// Throws InputError if a parameter is not fp32 or the model has no parameters.
  Bf16Optimizer(torch::nn::Module& model, const TrainConfig& train);
  ~Bf16Optimizer();
  Bf16Optimizer(const Bf16Optimizer&) = delete;
  Bf16Optimizer& operator=(const Bf16Optimizer&) = delete;

  /// Zeroes the fp32 gradient buffers (and drops any bf16 .grad).
  void zero_grad();
  /// 1. Global L2 norm of the fp32 gradients; 2. skip on a non-finite norm or loss; 3. clip to train.grad_clip
  /// (0 = off) by scaling with max_norm / (norm + 1e-6) as torch::nn::utils::clip_grad_norm_ does; 4. AdamW at
  /// learning rate `lr` on the masters; 5. bf16 copy ← round-to-nearest-even(masters).
  MixedStepResult step(double lr, double loss = 0.0);

  /// fp32 masters, one per model parameter in model.parameters() order (shapes as the parameters).
  const std::vector<torch::Tensor>& masters() const { return masters_; }
  /// fp32 gradient buffers in the same order: what a data-parallel group all-reduces before step().
  const std::vector<torch::Tensor>& main_grads() const { return main_grads_; }
  /// The bf16 model parameters in the same order.
  const std::vector<torch::Tensor>& model_parameters() const { return params_; }
  /// AdamW's moments (m, v) of master i, fp32 with its shape; undefined tensors before the first step.
  std::pair<torch::Tensor, torch::Tensor> moments(size_t i) const;
  /// AdamW's step count (steps taken, skipped ones excluded).
  int64_t steps() const { return steps_; }
  /// Overwrites master i with `value` (fp32, its shape) and the bf16 copy with its rounding; moments kept (a merge
  /// written into a learner). Throws InputError on another shape.
  void set_master(size_t i, const torch::Tensor& value);
  /// AdamW's state over the masters and the step count to `file` (one torch archive), and back; load throws
  /// InputError on a file that does not fit. reset_state: fresh moments, step count 0.
  void save_state(const std::string& file) const;
  void load_state(const std::string& file);
  void reset_state();
  /// Live bytes per category, counted from the tensors (see PrecisionMemory).
  PrecisionMemory memory() const;

 private:
  void refresh_model();

  TrainConfig train_;
  std::vector<torch::Tensor> params_;      // bf16 compute copy (the model's own tensors)
  std::vector<torch::Tensor> masters_;     // fp32, grads point at main_grads_
  std::vector<torch::Tensor> main_grads_;  // fp32
  std::vector<std::shared_ptr<torch::autograd::Node>> grad_accumulators_;  // kept alive: hooks live on them
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t steps_ = 0;
};

/// CPU autocast to bf16 for the guard's lifetime (the other way to run bf16: fp32 weights, each matmul-class op
/// casts its inputs to bf16, no master copy; 4 + 4 + 8 = 16 bytes per parameter plus transient bf16 casts).
/// Restores the previous autocast state on destruction. Not re-entrant across threads (autocast is thread-local).
class CpuAutocastBf16 {
 public:
  CpuAutocastBf16();
  ~CpuAutocastBf16();
  CpuAutocastBf16(const CpuAutocastBf16&) = delete;
  CpuAutocastBf16& operator=(const CpuAutocastBf16&) = delete;

 private:
  bool was_enabled_;
  at::ScalarType previous_dtype_;
};

}  // namespace dloco
