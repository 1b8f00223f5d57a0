// Megatron tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", §3): the operators f and g as autograd
// functions, column- and row-parallel linear layers, the vocabulary-parallel embedding and cross-entropy, and the
// shard/gather rules that map a full parameter to the piece one rank holds. The GPT built from these is in
// parallel/tp_gpt.h.
// Dimension letters: B batch, T sequence length, N = B·T tokens, C d_model, V vocabulary, t tensor-parallel
// degree (the group's world), r this rank (0 … t − 1).
// The group is a dloco::Collective of world t, used through allreduce_sum and all_gather: the all-gathers (of a
// column output, of parameters for checkpoints) are the adapter's list all-gather followed by a local
// concatenation (exact: copies), and the maximum of the cross-entropy is a max over the t per-rank maxima, summed
// into a zero-padded (t, N) tensor by one of its three all-reduces.
// Deliberately not here: sequence parallelism, asynchronous overlap of the all-reduces with compute, sub-groups
// (the TP group is the whole Collective), and anything c10d (only collective/process_group.cc includes it).
// Threading: one rank's forward and backward run on the thread that owns its Collective (LibTorch runs a CPU
// graph's backward on the calling thread); every rank must issue the same calls in the same order.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "collective/process_group.h"

namespace dloco {

/// Which Megatron operation issued a collective (what TensorParallelCounts counts).
enum class TensorParallelCall {
  kF,             // operator f: identity forward, all-reduce of the input's gradient in backward
  kG,             // operator g: all-reduce forward (row-parallel outputs, the vocab-parallel embedding)
  kCrossEntropy,  // the vocab-parallel cross-entropy's three forward all-reduces (max, target logit, sum of exp)
  kGather,        // all-gathers: a column-parallel output, parameters and gradients gathered for checkpoints
  kNorm,          // the sum of squared gradients of the sharded parameters (global-norm clipping)
};

/// Collectives issued through a TensorParallelGroup, by the operation that issued them: all-reduces, except the
/// gathers, which are all-gathers (Collective::all_gather). Counted on this rank.
struct TensorParallelCounts {
  int64_t f_backward = 0;     // operator f, in backward
  int64_t g_forward = 0;      // operator g, in forward
  int64_t cross_entropy = 0;  // vocab-parallel cross-entropy, in forward (3 per call)
  int64_t gather = 0;         // all-gathers (each one Collective::all_gather of this rank's piece)
  int64_t norm = 0;           // gradient-norm sums
  int64_t total() const { return f_backward + g_forward + cross_entropy + gather + norm; }
};

/// The tensor-parallel group of one rank: a Collective of world t plus the counters. Thread-compatible, like the
/// Collective. It must outlive every autograd graph built through it (the operators keep a pointer to it).
class TensorParallelGroup {
 public:
  /// collective: the t ranks of this tensor-parallel group (not owned; outlives this object).
  explicit TensorParallelGroup(Collective& collective) : collective_(&collective) {}

  int rank() const { return collective_->rank(); }    // r
  int world() const { return collective_->world(); }  // t
  const TensorParallelCounts& counts() const { return counts_; }
  /// The Collective's per-operation bytes and calls (which kind of collective moved what).
  const Traffic& traffic() const { return collective_->traffic(); }

  /// Sums a dense contiguous CPU tensor across the t ranks in place and counts it under `call`.
  /// Throws CollectiveError when a peer dies or the deadline passes (the group is unusable afterwards).
  void allreduce_sum(torch::Tensor tensor, TensorParallelCall call);
  /// Gathers every rank's `local` (a CPU tensor of the same shape and dtype on every rank; made contiguous here):
  /// returns t new tensors, element r from rank r, and counts one collective under `call`. Throws CollectiveError.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& local, TensorParallelCall call);

 private:
  Collective* collective_;
  void count(TensorParallelCall call);
  TensorParallelCounts counts_;
};

/// How a full parameter is split over the t ranks. dim < 0: replicated (every rank holds all of it, e.g. norm
/// gains, a row-parallel bias). Otherwise the tensor is cut along `dim` into `blocks` equal blocks (3 for a fused
/// qkv weight whose rows are q, k, v) and rank r holds the r-th of t equal pieces of every block, in block order.
struct ShardSpec {
  int64_t dim = -1;
  int64_t blocks = 1;
  bool replicated() const { return dim < 0; }
};

/// Rank r's piece of `full`, detached: a fresh contiguous tensor (a clone of all of `full` when replicated).
/// Throws InputError when full.size(dim) is not a multiple of blocks·t (the message names the sizes).
torch::Tensor shard_of(const torch::Tensor& full, const ShardSpec& spec, int rank, int world);

/// The full tensor of shape `full_sizes` assembled from every rank's `local` piece (all ranks call it): one
/// all-gather of the pieces (counted as kGather), concatenated block by block, so the result is exactly the
/// tensor that was sharded.
/// Replicated: a clone of local, no communication. Throws CollectiveError on a failed all-reduce.
torch::Tensor gather_shards(const torch::Tensor& local, const ShardSpec& spec, at::IntArrayRef full_sizes,
                            TensorParallelGroup& group);

/// Operator f (Megatron's copy_to_tensor_model_parallel_region): x unchanged forward; backward all-reduces the
/// gradient (one kF all-reduce). x: any shape, float.
torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group);
/// Operator g (reduce_from_tensor_model_parallel_region): all-reduce sum forward (one kG all-reduce), gradient
/// unchanged backward. x: any shape, float. Returns a new tensor.
torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group);
/// All-gather along the last dimension (gather_from_tensor_model_parallel_region): x (..., n) -> (..., t·n),
/// rank r's x at columns [r·n, (r+1)·n); backward keeps this rank's columns of the gradient. One kGather.
torch::Tensor gather_last_dim(const torch::Tensor& x, TensorParallelGroup& group);

/// Implemented by the tensor-parallel modules: the ShardSpec of each of their own (non-recursive) parameters.
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;
  /// name: a parameter of this module itself ("weight", "bias"). Unknown names are replicated.
  virtual ShardSpec shard_spec(const std::string& name) const = 0;
};

/// Options of ColumnParallelLinear.
struct ColumnParallelOptions {
  int64_t blocks = 1;          // fused output blocks split separately (3 for qkv: each rank takes its heads of q, k, v)
  bool copy_input = true;      // apply f to the input (false when the caller applied f once for several layers)
  bool gather_output = false;  // all-gather Y to (…, out) on every rank instead of returning this rank's columns
};

/// Column-parallel linear (Megatron §3, Y = X·[A_1 … A_t]): rank r holds rows of the full (out, in) weight
/// (out/t of them, per block) and computes Y_r = X·A_rᵀ + b_r. Parameters "weight" (out/t, in) and, when the
/// full layer has one, "bias" (out/t), named as in the full layer so gathered names match the full model's.
class ColumnParallelLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  /// Takes this rank's shard of `full` (copied; `full` is not kept). Throws InputError when out is not a
  /// multiple of blocks·t.
  ColumnParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup& group,
                           const ColumnParallelOptions& options = {});
  /// x: (..., in), the same on every rank -> (..., out/t), or (..., out) with gather_output.
  torch::Tensor forward(const torch::Tensor& x);
  ShardSpec shard_spec(const std::string& name) const override;

  torch::Tensor weight;  // (out/t, in)
  torch::Tensor bias;    // (out/t) or undefined

 private:
  TensorParallelGroup* group_;
  ColumnParallelOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

/// Row-parallel linear (Megatron §3, Y = Σ_r X_r·A_r): rank r holds columns [r·in/t, (r+1)·in/t) of the full
/// (out, in) weight, takes its already split input X_r, and Y = g(X_r·A_rᵀ) + b with the (replicated) bias added
/// after the reduction. Parameters "weight" (out, in/t) and "bias" (out, replicated) when the full layer has one.
class RowParallelLinearImpl : public torch::nn::Module, public ShardedModule {
 public:
  /// Takes this rank's shard of `full` (copied). Throws InputError when in is not a multiple of t.
  RowParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup& group);
  /// x: (..., in/t), this rank's columns of the input -> (..., out), the same on every rank.
  torch::Tensor forward(const torch::Tensor& x);
  ShardSpec shard_spec(const std::string& name) const override;

  torch::Tensor weight;  // (out, in/t)
  torch::Tensor bias;    // (out) or undefined

 private:
  TensorParallelGroup* group_;
};
TORCH_MODULE(RowParallelLinear);

/// Vocabulary-parallel embedding (Megatron's VocabParallelEmbedding): rank r holds rows [r·V/t, (r+1)·V/t) of the
/// (V, C) table; a token outside that range looks up zeros, and g all-reduces the t partial lookups. Parameter
/// "weight" (V/t, C).
class VocabParallelEmbeddingImpl : public torch::nn::Module, public ShardedModule {
 public:
  /// Takes this rank's rows of `full` (copied). Throws InputError when V is not a multiple of t.
  VocabParallelEmbeddingImpl(const torch::nn::Embedding& full, TensorParallelGroup& group);
  /// idx: (B, T) int64 token ids in [0, V) -> (B, T, C), the same on every rank.
  torch::Tensor forward(const torch::Tensor& idx);
  ShardSpec shard_spec(const std::string&) const override { return {0, 1}; }
  int64_t vocab_start() const { return vocab_start_; }  // first token id of this rank's rows

  torch::Tensor weight;  // (V/t, C)

 private:
  TensorParallelGroup* group_;
  int64_t vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

/// Vocabulary-parallel cross-entropy (Megatron core's vocab_parallel_cross_entropy), per token, in nats:
/// loss_n = log Σ_v exp(z_nv − m_n) − (z_n,target − m_n), with three all-reduces (kCrossEntropy): the maximum m_n,
/// the target logit (held by one rank, 0 elsewhere) and the sum of exp. The B·T·V logits are never gathered.
/// Backward is hand-written and local: (softmax − one-hot) on this rank's columns times the incoming gradient; it
/// reuses the saved softmax in place, so the graph can be backpropagated once (no retain_graph).
/// logits: (N, V/t) float, rank r's columns [r·V/t, (r+1)·V/t); targets: (N) int64 in [0, V). Returns (N).
/// Throws InvariantError on mismatched shapes, CollectiveError on a failed all-reduce.
torch::Tensor vocab_parallel_cross_entropy_per_token(const torch::Tensor& logits, const torch::Tensor& targets,
                                                     TensorParallelGroup& group);
/// The mean over the N tokens of vocab_parallel_cross_entropy_per_token: a scalar, equal on every rank, whose
/// value and gradient match cross_entropy (model/gpt.h) on the full logits.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           TensorParallelGroup& group);

}  // namespace dloco
