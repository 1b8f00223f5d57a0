// Megatron's distributed optimizer (Shoeybi et al. 2019; Megatron-LM's DistributedOptimizer, which is ZeRO-1 —
// Rajbhandari et al. 2020 §5.1 — over the data-parallel group) for the tensors one rank of a learner group holds:
// its TP shards of its pipeline stage's parameters. The d data-parallel ranks that hold the same tensors flatten
// them into one buffer in the same order, padded with zeros to a multiple of d; rank r owns the slice
// [r·S, (r+1)·S), S = padded / d, and keeps the fp32 master and AdamW's m and v of that slice only.
//   - the compute copy (the parameters themselves) is fp32 or bf16: views of one flat buffer;
//   - the gradient is accumulated in fp32 "main gradients" (views of one flat fp32 buffer, Megatron's main_grad)
//     that the caller adds into (each window's .grad, or each micro-batch's gradient from a hook);
//   - a step reduce-scatters the main gradients over the d ranks (Gloo has none: parallel/zero.h's substitutes),
//     averages them, lets the caller clip on the global norm of every rank's slice, runs AdamW on the own master
//     slice and all-gathers the updated compute copy (bf16: rounded once, moved as 2-byte words).
// Bytes per parameter held by this rank: compute copy 4 (fp32) or 2 (bf16), main gradient 4, and per d: master 4
// (bf16 only; in fp32 the compute copy is the master), m 4, v 4 — in bf16 6 + 12/d, Megatron's table.
// AdamW is torch::optim::AdamW's arithmetic (LibTorch 1.13): decoupled weight decay on the parameters marked for it,
// bias correction; the same as parallel/zero.h's slices.
// Deliberately not here: the global norm's reduction across the TP and PP groups (the caller sums
// squared_norm() over its whole group), gradient buckets overlapping backward (ZeRO-2), offload.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "collective/process_group.h"
#include "core/config.h"

namespace dloco {

/// One tensor the optimizer steps.
struct DistributedParameter {
  torch::Tensor tensor;    // fp32; becomes a view of the flat buffer, in the compute dtype
  bool decay = false;      // decoupled weight decay (train.weight_decay) applies: matrices, not norm gains
  bool in_norm = true;     // counts in the global gradient norm on this rank (false: a tied copy, or a replicated
                           // tensor that another TP rank counts)
};

/// Live bytes of this rank's optimizer-side state, counted from the tensors (numel · element size).
struct DistributedMemory {
  int64_t parameters = 0;       // elements this rank holds (Σ numel of its tensors, without the padding)
  int64_t parameter_bytes = 0;  // the compute copy: 4 or 2 per element of the padded flat buffer
  int64_t gradient_bytes = 0;   // fp32 main gradients: 4 per padded element
  int64_t master_bytes = 0;     // fp32 master slice (bf16 only): 4 per slice element
  int64_t moment_bytes = 0;     // m and v of the slice: 8 per slice element
  int64_t total() const { return parameter_bytes + gradient_bytes + master_bytes + moment_bytes; }
};

/// AdamW whose master weights and moments are sharded over a data-parallel group. Use per step:
///   zero_grad(); (add each window's gradients into main_grads()); sq = reduce_gradients(...);
///   (all-reduce sq over the learner group, clip coefficient c); step(lr, c) — or drop_gradients() to skip.
/// Every rank of `dp` constructs one over tensors of the same shapes in the same order, with the same values.
class DistributedAdamW {
 public:
  /// Takes over the fp32 tensors' storage: they become views of one flat buffer in `compute` (fp32, or bf16
  /// rounded to nearest even; modules holding them see the new storage), and the masters start from their exact
  /// fp32 values. `dp`: the data-parallel group (null: d = 1, nothing sharded). Throws InputError when the list is
  /// empty, a tensor is not fp32, or `compute` is neither fp32 nor bf16.
  DistributedAdamW(std::vector<DistributedParameter> params, Collective* dp, const TrainConfig& train,
                   torch::ScalarType compute = torch::kFloat);

  /// The fp32 gradient buffers, one per parameter (its shape), in the constructor's order.
  const std::vector<torch::Tensor>& main_grads() const { return main_grads_; }
  /// Zeroes the main gradients.
  void zero_grad();
  /// Replicated optimizer state (dp null) under data parallelism all the same: all-reduces the main gradients over
  /// `replicas` and divides by its size, so every replica steps the same full slice. Throws CollectiveError.
  void average_main_grads(Collective& replicas);
  /// Reduce-scatters the main gradients over dp and divides by d (this rank's slice of the mean gradient), then
  /// averages that slice over `replicas` when given (the dp baseline over learner groups, rank_engine.h).
  /// Returns Σ g² over the slice's elements whose parameter is in_norm (double). Collective over dp (and
  /// replicas); throws CollectiveError.
  double reduce_gradients(Collective* replicas = nullptr);
  /// One AdamW step at `lr` on the own master slice with the reduced gradient scaled by `clip_coef` (≤ 1), then
  /// all-gathers the compute copy over dp. Collective over dp; throws CollectiveError.
  void step(double lr, double clip_coef);
  /// Forgets the reduced gradient (a skipped step: masters, moments and the step count untouched). Local.
  void drop_gradients();

  /// Overwrites parameter i (its shape) with `value` in the compute copy and in the master slice; moments kept.
  /// Local; throws InputError on another shape.
  void set_parameter(size_t i, const torch::Tensor& value);
  /// The fp32 master of parameter i, whole (its shape): fp32 a copy of the compute copy (local); bf16 each dp
  /// rank's part of it summed over dp as integers, bitwise (collective over dp; every dp rank calls it). Throws
  /// CollectiveError.
  torch::Tensor full_master(size_t i);
  /// The step count, m and v of this rank's slice to `file` (torch::save; not atomic: the caller renames), and
  /// back; load_state throws InputError when the file was written for another layout (d, rank, the tensors'
  /// sizes). The
  /// masters are not in it: a restored learner writes Θ back (set_parameter), as every group does.
  void save_state(const std::string& file) const;
  void load_state(const std::string& file);
  /// Zero moments and step count. Local.
  void reset_state();
  DistributedMemory memory() const;
  int64_t steps() const { return step_count_; }

 private:
  torch::Tensor numels() const;  // (n tensors) int64: what a state file must have been written for

  std::vector<torch::Tensor> params_;      // the caller's tensors, views of flat_
  std::vector<int64_t> offsets_;           // element offset of each in flat_
  std::vector<torch::Tensor> main_grads_;  // fp32 views of grad_flat_
  Collective* dp_;
  TrainConfig train_;
  int d_ = 1, rank_ = 0;
  int64_t padded_ = 0, shard_ = 0;
  torch::Tensor flat_;       // (padded) the compute copy, fp32 or bf16
  torch::Tensor grad_flat_;  // (padded) fp32 main gradients
  torch::Tensor master_;     // (S) fp32: a view of flat_ in fp32, its own copy in bf16
  torch::Tensor grad_;       // (S) the reduced gradient slice between reduce_gradients() and step()
  torch::Tensor exp_avg_, exp_avg_sq_;                  // (S) AdamW's m and v
  std::vector<std::pair<int64_t, int64_t>> decay_, norm_;  // (start, length) ranges of the slice
  int64_t step_count_ = 0;
};

}  // namespace dloco
