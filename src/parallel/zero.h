// ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", §5):
// AdamW whose state is sharded over a data-parallel group of N ranks, with DeepSpeed's / nanotron's semantics.
// The parameters of a unit are flattened into one fp32 buffer in model->parameters() order, padded with zeros to a
// multiple of N; rank r owns the slice [r·S, (r+1)·S), S = padded / N, of every unit.
//   stage 1 (P_os):   one unit (the whole model). m, v only for the own slice. backward() leaves full gradients in
//                     the parameters; step() reduce-scatters them (or all-reduces and slices), averages over N,
//                     runs AdamW on the own slice and all-gathers the parameters.
//   stage 2 (P_os+g): plus gradients. A hook on every parameter reduces each piece of its gradient to the piece's
//                     owner as soon as autograd has formed it (DeepSpeed's reduce per owner), accumulating into the
//                     owner's gradient slice. Full gradients exist transiently: a parameter's full gradient lives
//                     from the moment autograd computes it until the hook of the next parameter (or the end of
//                     backward()) frees it; memory().peak_full_gradient_bytes is the largest sum of live full
//                     gradients seen at a hook.
//   stage 3 (P_os+g+p): plus parameters. Units: the embedding, each transformer block, and the head (ln_f +
//                     lm_head + the loss). Each rank holds only its parameter slice of each unit; a custom autograd
//                     function per unit all-gathers the unit's parameters for forward under no-grad and frees them,
//                     and in backward gathers again, recomputes the unit with grad (ZeRO-3 with activation
//                     recompute: only unit inputs are kept), back-propagates, and reduce-scatters the unit's
//                     gradient into the slice. Needs untied embeddings (the tied wte would be in two units).
// AdamW is torch::optim::AdamW's arithmetic (decoupled weight decay, bias correction), applied elementwise to the
// slices, with weight decay on matrices only (train/trainer.cc's recipe). Everything is fp32 on the CPU.
// Global-norm clipping and the non-finite guard of train/trainer.cc run on the reduced slices (one all-reduce of a
// scalar), so every rank takes the same decision.
// Offload (ZeroOptions::offload_dir): m and v in mapped files that each step streams through (parallel/offload.h);
// at stage 3 the fp32 slices too (the masters, also in bf16): a unit's gather and the step read them and hand
// their pages back.
// ZeRO-3 × tensor parallelism (FSDP × TP, torchtitan's 2D layout): the model is a TensorParallelGPT (tp_gpt.h) and
// the units are its TP-local parts, sharded over the data-parallel group of one TP index; a unit's forward runs
// the TP part (its f/g all-reduces over the TP group) between the DP all-gather and the release. Within each
// subgroup every member issues the same calls in the same order, and every rank interleaves the two groups in the
// same program order (unit by unit: DP gather, TP collectives, DP reduce-scatter; the norm: DP, then TP), so no
// cycle of waits can form; a rank that fails alone leaves its peers waiting until the step deadline. The global
// norm adds the TP ranks' sums, replicated gains counted on TP rank 0 only.
// bf16 (ZeroOptions::compute_dtype, stage 3): the slices stay fp32 (the masters); a unit is gathered as bf16
// (rounded once, moved as 2-byte words: Gloo has no bf16), runs in bf16 with an fp32 loss, and its bf16 gradient
// is widened to fp32 before the reduce-scatter (fp32 main gradients, as torchtitan's FSDP2 mixed precision with
// reduce_dtype = fp32). Per parameter held: (4 master + 4 gradient + 8 m, v) / N bytes, plus one gathered unit.
// Deliberately not here: bucketing and overlap of communication with compute, bf16 at stages 1 and 2 (the
// distributed optimizer covers ZeRO-1 in bf16: parallel/distributed_optimizer.h).
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "collective/process_group.h"
#include "model/gpt.h"
#include "parallel/tp_gpt.h"

namespace dloco {

/// Hyperparameters of the sharded AdamW; the same meaning as torch::optim::AdamWOptions.
struct ZeroOptions {
  int stage = 1;               // 1, 2 or 3
  double lr = 1e-3;            // learning rate (set_lr changes it per step)
  double beta1 = 0.9;          // first-moment decay
  double beta2 = 0.999;        // second-moment decay
  double eps = 1e-8;           // added to sqrt(v̂)
  double weight_decay = 1e-2;  // decoupled, on parameters with dim ≥ 2 only
  ReduceScatterAlgo reduce_scatter = ReduceScatterAlgo::kAllToAll;  // stages 1 and 3
  bool all_reduce_gradients = false;  // stage 1 only: all-reduce the full gradient and slice (plain DP's traffic)
  std::filesystem::path offload_dir;  // non-empty: m and v (stage 3: and the fp32 slices) live in mapped files
                                      // here and leave the resident set after use (parallel/offload.h; ZeRO-Offload)
  int64_t offload_chunk = 1 << 18;    // elements the offloaded step updates before handing their pages back
  torch::ScalarType compute_dtype = torch::kFloat;  // kBFloat16 (stage 3): bf16 forward and backward, fp32 slices
};

/// ZeroAdamW's hyperparameters from the trainer's recipe (train/trainer.cc: lr, β₁, β₂, ε, weight decay) for `stage`,
/// with the moments offloaded to `offload_dir` when it is not empty, computing in `compute_dtype`.
inline ZeroOptions zero_options(const TrainConfig& train, int stage, const std::filesystem::path& offload_dir = {},
                                torch::ScalarType compute_dtype = torch::kFloat) {
  ZeroOptions o;
  o.stage = stage;
  o.lr = train.lr;
  o.beta1 = train.beta1;
  o.beta2 = train.beta2;
  o.eps = train.adam_eps;
  o.weight_decay = train.weight_decay;
  o.offload_dir = offload_dir;
  o.compute_dtype = compute_dtype;
  return o;
}

/// Sharded initialisation (parallel/sharded_init.h): instead of flattening the model's values, ZeroAdamW calls it
/// once per stage-3 unit, in unit order, with the unit's parameter names and a view of each (the model's — with
/// tensor parallelism the TP-local — shape, fp32) to fill; it keeps this rank's slice and drops the rest.
using ZeroUnitInit =
    std::function<void(const std::vector<std::string>& names, const std::vector<torch::Tensor>& values)>;

/// Live tensor bytes of model state on this rank (counted from the tensors' sizes, not RSS).
struct ZeroMemory {
  int64_t parameter_bytes = 0;        // held between steps: the flat model (stages 1, 2) or the slices (stage 3)
  int64_t gradient_bytes = 0;         // held between backward() and step(): full .grad (stage 1) or slices
  int64_t optimizer_state_bytes = 0;  // m and v of the own slices (offloaded: the offload files' resident pages,
                                      // at stage 3 the offloaded slices' pages too)
  int64_t offloaded_state_bytes = 0;  // m and v of the own slices held in offload files
  int64_t offloaded_parameter_bytes = 0;  // stage 3 offloaded: the fp32 slices (the masters) held in offload files
  int64_t peak_full_gradient_bytes = 0;    // stages 2, 3: largest transient full gradients alive at once
  int64_t peak_gathered_parameter_bytes = 0;  // stage 3: largest gathered (full) unit parameters alive at once
};

/// What step() did (the same on every rank).
struct ZeroStepStats {
  double grad_norm = 0;  // global norm of the averaged gradient before clipping
  bool skipped = false;  // non-finite norm (or asked to skip): parameters and moments untouched
};

/// A GPT trained with ZeRO over the data-parallel group `group` (every rank of it constructs one from a model with
/// identical parameters, and calls loss/backward/step in lockstep). One step:
///   auto loss = zero.loss(idx, targets); zero.backward(loss); zero.step();
/// Every call that communicates throws CollectiveError when a peer fails (the group is then unusable).
class ZeroAdamW {
 public:
  /// Takes over `model`'s parameter storage (stages 1, 2: views of one flat buffer; stage 3: released, only the
  /// slices stay). Throws InputError for a stage outside 1..3 or stage 3 with tied embeddings.
  ZeroAdamW(GPT model, Collective& group, ZeroOptions options);
  /// ZeRO-3 × TP: `model` is this rank's TP part, `tensor` its TP group, `group` the DP group of its TP index.
  /// With `init`, the model's tensors are placeholders of the right shapes (their values are never read) and
  /// `init` gives the values unit by unit. Throws InputError unless options.stage = 3 and embeddings are untied.
  ZeroAdamW(TensorParallelGPT model, TensorParallelGroup& tensor, Collective& group, ZeroOptions options,
            const ZeroUnitInit& init = {});
  ~ZeroAdamW();
  ZeroAdamW(const ZeroAdamW&) = delete;
  ZeroAdamW& operator=(const ZeroAdamW&) = delete;

  /// Mean next-token cross-entropy in nats of idx, targets (B, T) int64 -> scalar, with the graph for backward().
  /// Equals model->loss(idx, targets) bitwise (stage 3 runs the same modules unit by unit).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  /// Back-propagates `loss` (from loss()); stages 2, 3 reduce gradients into the owners' slices on the way.
  /// Repeated calls before step() accumulate (micro-batches).
  void backward(const torch::Tensor& loss);
  /// Averages the accumulated gradient over N, clips it to the global norm `max_grad_norm` (+inf: no clipping;
  /// torch::nn::utils::clip_grad_norm_'s coefficient max / (‖g‖ + 1e-6)), one AdamW step on the own slices, then
  /// (stages 1, 2) all-gathers the parameters into the model. With `skip`, or when ‖g‖ is not finite, nothing
  /// is updated (the step count neither: bias correction continues as if the step never happened). Clears the
  /// gradients. Throws CollectiveError.
  ZeroStepStats step(double max_grad_norm = std::numeric_limits<double>::infinity(), bool skip = false);
  void set_lr(double lr) { options_.lr = lr; }
  /// The dp baseline over learner groups (parallel/rank_engine.h set_replicas): the same rank of every other
  /// learner; step() averages this rank's reduced gradient slices over it before the norm. Null: none.
  void set_replicas(Collective* replicas) { replicas_ = replicas; }

  /// The full parameters by name (model->named_parameters() names and shapes; with TP this rank's TP part) on rank
  /// `root`, empty elsewhere; every rank must call it (stage 3 all-gathers). With `moment` = 1 or 2, the full m or v
  /// instead. For save_checkpoint_files (train/checkpoint.h): the safetensors format stays unchanged.
  std::vector<std::pair<std::string, torch::Tensor>> gather_full(int root = 0, int moment = 0);

  /// The full parameter `name` (model->named_parameters() name and shape; with TP this rank's TP part, whole) on
  /// rank `root`, undefined elsewhere. Stages 1, 2: a copy of the local one (no communication); stage
  /// 3: every rank must call it (all-gathers the parameter's unit, fp32). Throws InputError for an unknown name,
  /// CollectiveError.
  torch::Tensor gather_parameter(const std::string& name, int root = 0);
  /// Overwrites parameter `name` with `full` (the model's shape — with TP the TP part's; the same on every rank of
  /// the DP group) in place: stages 1, 2 the local copy, stage 3 this rank's part of its slice. Moments are kept.
  /// Local; throws InputError on an unknown name or another shape.
  void set_parameter(const std::string& name, const torch::Tensor& full);
  /// This rank's optimizer state (step count, m and v of its slices) to `file` (torch::save; not atomic: the
  /// caller writes to a temporary name), and back. load_state throws InputError when the file was written by
  /// another stage, DP or TP group size or rank, or model.
  void save_state(const std::string& file) const;
  void load_state(const std::string& file);
  /// Zero moments and step count (a fresh optimizer over the same parameters). Local.
  void reset_state();
  /// Live bytes per category now (see ZeroMemory); call between backward() and step() for the gradient peak.
  ZeroMemory memory() const;
  int stage() const { return options_.stage; }
  const ModelConfig& config() const { return cfg_; }
  torch::ScalarType compute_dtype() const { return options_.compute_dtype; }
  /// ZeRO-3 × TP: this rank's TP part (its tensors are released between units; for shard_spec and full_size);
  /// null without TP.
  const TensorParallelGPT& tensor_parallel_model() const { return tp_model_; }
  /// ZeRO-3 × TP: the parts of this rank's slices that hold replicated parameters (norm gains), named
  /// "<name>[a, b)" by their element range in the parameter; the TP ranks of one DP index hold the same ones.
  /// Empty without TP. For the replica check (parallel/rank_engine.h replica_mismatch). Local.
  std::vector<std::pair<std::string, torch::Tensor>> replicated_slices() const;
  bool offloaded() const { return !options_.offload_dir.empty(); }
  /// Σ numel of the model's parameters (Ψ; with TP the TP part's, about Ψ/t), without padding.
  int64_t parameter_count() const { return parameter_count_; }

  struct Unit;  // one flat, sharded group of parameters (parallel/zero_unit.h)

 private:
  std::pair<Unit*, size_t> find(const std::string& name);  // the unit holding parameter `name` and its index there
  friend struct ZeroUnitFunction;
  void check_options(const ModelConfig& cfg) const;
  void build_units(const torch::OrderedDict<std::string, torch::Tensor>& named, const GPTImpl::Tables& tables,
                   const ZeroUnitInit& init);
  void gather(Unit& unit);
  void release(Unit& unit);
  torch::Tensor run_unit(size_t unit, const torch::Tensor& x, const torch::Tensor& aux);
  void reduce_unit_gradient(Unit& unit, const std::vector<torch::Tensor>& grads);
  void on_gradient(size_t param, const torch::Tensor& grad);
  void adamw_on_slice(Unit& unit);

  GPT model_;                               // null with TP
  TensorParallelGPT tp_model_{nullptr};     // ZeRO-3 × TP: this rank's TP part
  TensorParallelGroup* tp_ = nullptr;       // its TP group
  ModelConfig cfg_;
  Collective& group_;
  Collective* replicas_ = nullptr;
  ZeroOptions options_;
  std::vector<Unit> units_;
  int64_t parameter_count_ = 0;
  int64_t step_count_ = 0;
  // stage 2: parameters whose hook has run since the last free (their full .grad is freed at the next hook)
  std::vector<size_t> reduced_;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;  // stage 2: (parameter, hook handle), removed on destruction
  torch::Tensor rope_cos_, rope_sin_, causal_;  // the model's buffers (T, hs/2), (T, hs/2), (T, T), compute dtype
  int64_t live_full_gradient_bytes_ = 0, peak_full_gradient_bytes_ = 0;
  int64_t live_gathered_bytes_ = 0, peak_gathered_bytes_ = 0;
};

}  // namespace dloco
