// A tensor-parallel GPT (Megatron-LM §3): the architecture of model/gpt.h (RMSNorm, RoPE, SwiGLU without biases,
// tied or untied head) with every matrix split over the t ranks of a TensorParallelGroup:
//   attention  f → qkv column-parallel (each rank its NH/t heads of q, k and v) → local causal attention →
//              proj row-parallel → g
//   MLP        f → gate, up column-parallel → SwiGLU → down row-parallel → g
//   embedding  vocab-parallel wte (V/t rows); the tied head multiplies f(x) by the same shard, giving (B, T, V/t)
//              logits that the vocab-parallel cross-entropy consumes without ever gathering B·T·V
// Two all-reduces per block in forward (the two g) and two in backward (the two f), plus one of each for the
// embedding and the head and three in the cross-entropy's forward. Norm gains are replicated: their gradients
// are already identical on every rank (they sit before an f, whose backward all-reduces), so each rank runs its
// own optimizer on its own parameters with no further communication.
// Built by sharding a full GPT; gathers back to a full GPT (same parameter names, so the same safetensors).
// Dimension letters: B, T, C, NH, hs = C/NH, F, V, L as in model/gpt.h; t the tensor-parallel degree.
// Deliberately not here: dropout, generation, sequence parallelism.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt.h"
#include "parallel/tensor_parallel.h"

namespace dloco {

/// Causal self-attention split by heads: rank r computes heads [r·NH/t, (r+1)·NH/t).
class TensorParallelAttentionImpl : public torch::nn::Module {
 public:
  /// Shards `full` (its qkv (3C, C) rows: this rank's heads of q, of k, of v; its proj (C, C) columns).
  /// Throws InputError when NH is not a multiple of t.
  TensorParallelAttentionImpl(const CausalSelfAttentionImpl& full, const ModelConfig& cfg, TensorParallelGroup& group);
  /// x: (B, T, C) on every rank; cos, sin: (T, hs/2); causal: (T, T) additive mask. Returns (B, T, C).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& causal);

  ColumnParallelLinear qkv{nullptr};  // C -> 3C/t (f inside)
  RowParallelLinear proj{nullptr};    // C/t -> C (g inside)

 private:
  int64_t local_heads_, head_size_;  // NH/t, hs
};
TORCH_MODULE(TensorParallelAttention);

/// SwiGLU MLP split over the hidden width F: f once, then gate and up column-parallel, down row-parallel.
class TensorParallelMLPImpl : public torch::nn::Module {
 public:
  /// Shards `full`. Throws InputError when F is not a multiple of t.
  TensorParallelMLPImpl(const MLPImpl& full, TensorParallelGroup& group);
  /// x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  ColumnParallelLinear gate{nullptr};  // C -> F/t
  ColumnParallelLinear up{nullptr};    // C -> F/t
  RowParallelLinear down{nullptr};     // F/t -> C

 private:
  TensorParallelGroup* group_;
};
TORCH_MODULE(TensorParallelMLP);

/// Pre-norm block as BlockImpl, with replicated norms and the split attention and MLP.
class TensorParallelBlockImpl : public torch::nn::Module {
 public:
  TensorParallelBlockImpl(const BlockImpl& full, const ModelConfig& cfg, TensorParallelGroup& group);
  /// x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& causal);

  RMSNorm ln_1{nullptr};
  TensorParallelAttention attn{nullptr};
  RMSNorm ln_2{nullptr};
  TensorParallelMLP mlp{nullptr};
};
TORCH_MODULE(TensorParallelBlock);

/// One rank's part of a tensor-parallel GPT. Its parameters carry the full model's names ("wte.weight",
/// "h.<i>.attn.qkv.weight", …) and hold this rank's shards; every method that communicates must be called by
/// all t ranks in the same order.
class TensorParallelGPTImpl : public torch::nn::Module {
 public:
  /// Shards `full` over `group` (copies; `full` is not kept). Throws InputError when NH, F or V is not a
  /// multiple of t.
  TensorParallelGPTImpl(const GPT& full, TensorParallelGroup& group);
  /// Built part by part without a full GPT (sharded initialisation, parallel/sharded_init.h): each part of the full
  /// model — wte, block 0 … L − 1, ln_f, lm_head (untied) — is constructed exactly as GPT(cfg)'s constructor does
  /// (so torch's default generator makes the same draws), sharded, and freed before the next, and `cut` is called
  /// with each TP part once it holds its shards (it may replace their storage). The parameters hold the
  /// constructors' values, not GPT's final initialisation. Throws InputError as the other constructor.
  TensorParallelGPTImpl(const ModelConfig& cfg, TensorParallelGroup& group,
                        const std::function<void(torch::nn::Module&)>& cut);

  /// idx: (B, T) int64 token ids, the same on every rank, T ≤ seq_len. Returns this rank's logits (B, T, V/t),
  /// vocabulary ids [r·V/t, (r+1)·V/t).
  torch::Tensor forward(const torch::Tensor& idx);
  /// Mean next-token cross-entropy in nats (vocab-parallel): idx, targets (B, T) int64 -> scalar, equal on
  /// every rank. Throws CollectiveError on a failed all-reduce.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);

  /// Every parameter as the full tensor, in named_parameters() order, with the full model's names and shapes.
  /// gradients = true gathers the gradients instead (undefined ones as zeros). One kGather all-gather per
  /// sharded parameter. Throws CollectiveError.
  std::vector<std::pair<std::string, torch::Tensor>> gather(bool gradients = false);
  /// Copies the gathered parameters into `full` in place (under NoGradGuard, so its optimizer keeps its state).
  /// Throws InputError when `full` lacks a parameter or has another shape; CollectiveError.
  void write_to(GPT& full);
  /// Global-norm gradient clipping over the whole (unsharded) model, as torch::nn::utils::clip_grad_norm_ on the
  /// full GPT: ‖g‖ = sqrt(Σ_r Σ_sharded ‖g_r‖² + Σ_replicated ‖g‖²) (one kNorm all-reduce; replicated gains counted
  /// once), and every gradient scaled by max_norm / (‖g‖ + 1e-6) when that is below 1. Returns ‖g‖ before
  /// clipping (the same on every rank). max_norm = +inf only measures. Throws CollectiveError.
  double clip_grad_norm(double max_norm);
  /// The split rule of a parameter, by its full name; throws InputError for an unknown name.
  ShardSpec shard_spec(const std::string& parameter_name) const;
  /// The full-model shape of a parameter, by its full name; throws InputError for an unknown name.
  std::vector<int64_t> full_size(const std::string& parameter_name) const;

  const ModelConfig& config() const { return cfg_; }

  VocabParallelEmbedding wte{nullptr};
  torch::nn::ModuleList h{nullptr};
  RMSNorm ln_f{nullptr};
  ColumnParallelLinear lm_head{nullptr};  // null when tied

 private:
  // The parts of a full GPT, one at a time, in its construction order; `cut` as in the constructor (may be null).
  struct FullParts {
    std::function<torch::nn::Embedding()> wte;
    std::function<Block(size_t)> block;
    std::function<RMSNorm()> ln_f;
    std::function<torch::nn::Linear()> lm_head;  // untied only
  };
  void build(const FullParts& parts, const std::function<void(torch::nn::Module&)>& cut);

  ModelConfig cfg_;
  TensorParallelGroup* group_;
  std::vector<std::pair<std::string, ShardSpec>> specs_;                  // every parameter, named_parameters() order
  std::vector<std::pair<std::string, std::vector<int64_t>>> full_sizes_;  // the full shapes, same order
  torch::Tensor rope_cos_, rope_sin_;                                     // (T, hs/2), copied from the full model
  torch::Tensor causal_;                                                  // (T, T) additive mask
};
TORCH_MODULE(TensorParallelGPT);

}  // namespace dloco
