// GPT: a decoder-only transformer in LibTorch with RMSNorm, rotary positions (RoPE), SwiGLU MLPs, no biases,
// and optional weight tying (config field). Classes are named after the roles in the papers.
// Dimension letters: B batch, T sequence length, C d_model, NH heads, hs = C/NH head size, F SwiGLU width,
// V vocabulary, L layers.
// Deliberately not here: dropout (pre-training at our scale does not need it), KV caches (generation is a
// short sample for reports), fused kernels (LibTorch 1.13 has no public scaled_dot_product_attention).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "core/config.h"

namespace dloco {

/// Root-mean-square layer norm (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) · g. Shape-preserving.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  /// x: (..., C) -> (..., C)
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::Tensor weight_;  // (C) gain, initialised to 1
  double eps_;
};
TORCH_MODULE(RMSNorm);

/// Rotary position embedding (Su et al. 2021): rotates pairs (x1, x2) = (first half, second half) of the head
/// dimension by the position's angle. x: (..., T, hs); cos, sin: (T, hs/2). Returns a contiguous tensor of x's shape.
/// Shared with the tensor-parallel attention (parallel/tp_gpt.cc).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

/// Multi-head causal self-attention with rotary position embeddings on q and k (Su et al. 2021).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const ModelConfig& cfg);
  /// x: (B, T, C); cos, sin: (T, hs/2) rotary tables; causal: (T, T) additive mask, −inf above the diagonal and 0 elsewhere.
  /// Returns (B, T, C).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& causal);

  torch::nn::Linear qkv{nullptr};   // C -> 3C
  torch::nn::Linear proj{nullptr};  // C -> C (residual projection)

 private:
  int64_t n_head_;
};
TORCH_MODULE(CausalSelfAttention);

/// SwiGLU feed-forward (Shazeer 2020): down(silu(gate(x)) · up(x)).
class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& cfg);
  /// x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear gate{nullptr};  // C -> F
  torch::nn::Linear up{nullptr};    // C -> F
  torch::nn::Linear down{nullptr};  // F -> C (residual projection)
};
TORCH_MODULE(MLP);

/// Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& cfg);
  /// x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& causal);

  RMSNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  RMSNorm ln_2{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

/// The language model. Parameter names are stable across processes (they key fragments and checkpoints):
/// "wte.weight" (V, C), "h.<i>.ln_1.weight", "h.<i>.attn.qkv.weight" (3C, C), "h.<i>.attn.proj.weight",
/// "h.<i>.ln_2.weight", "h.<i>.mlp.{gate,up,down}.weight", "ln_f.weight", and "lm_head.weight" (V, C)
/// only when embeddings are untied.
class GPTImpl : public torch::nn::Module {
 public:
  /// Builds and initialises the model (normal(0, init_std); residual projections scaled by 1/sqrt(2L)).
  /// Throws InputError if the config is inconsistent (see Config::validate).
  explicit GPTImpl(const ModelConfig& cfg);

  /// idx: (B, T) int64 token ids with T ≤ seq_len. Returns logits (B, T, V).
  torch::Tensor forward(const torch::Tensor& idx);
  /// Mean next-token cross-entropy in nats: idx, targets (B, T) int64 -> scalar.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  /// Samples `max_new_tokens` continuations of prompt (1, T0) with temperature and top-k (0 = off); temperature ≤ 0
  /// is greedy (the most likely token each time; top-k and the generator unused).
  /// Returns (1, T0 + max_new_tokens). Runs without gradients.
  torch::Tensor generate(torch::Tensor prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
                         torch::Generator* generator = nullptr);

  /// Skipped blocks (SkipPipe, docs/skippipe.md "Stages"): where `active[i]` is false, forward (and so loss and
  /// generate) passes the residual stream around block i unchanged. Empty = every block (the default). Throws
  /// InputError when the size is neither 0 nor model.n_layer.
  void set_active_blocks(std::vector<bool> active);
  const std::vector<bool>& active_blocks() const { return active_; }

  const ModelConfig& config() const { return cfg_; }
  /// The constructor's last pass on parameter `name` (after the modules' own initialisers): matrices (dim ≥ 2)
  /// drawn normal(0, init_std) from torch's default generator, residual projections (attn.proj, mlp.down) with
  /// init_std / sqrt(2L) (GPT-2); norm gains untouched. Sharded initialisation (parallel/sharded_init.h) replays it.
  static void init_parameter(const std::string& name, torch::Tensor p, const ModelConfig& cfg);
  /// The rotary tables cos, sin (T, hs/2) and the additive causal mask (T, T) (0 allowed, −inf masked), fp32.
  struct Tables {
    torch::Tensor cos, sin, causal;
  };
  static Tables rope_and_mask(const ModelConfig& cfg);
  /// True for the token embedding (and so the tied output head): merged with the plain weighted mean (§6).
  static bool is_embedding(const std::string& parameter_name) { return parameter_name == "wte.weight"; }

  torch::nn::Embedding wte{nullptr};
  torch::nn::ModuleList h{nullptr};
  RMSNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied

 private:
  ModelConfig cfg_;
  torch::Tensor rope_cos_, rope_sin_;  // (T, hs/2) buffers
  torch::Tensor causal_;               // (T, T) float buffer: −inf where attention is masked, else 0
  std::vector<bool> active_;           // set_active_blocks; empty = all
};
TORCH_MODULE(GPT);

/// Number of elements over all parameters of the module (equals gpt_parameter_count for a GPT).
int64_t count_parameters(torch::nn::Module& module);

/// Mean cross-entropy in nats of logits (N, V) against int64 targets (N); value and gradient equal
/// torch::nn::functional::cross_entropy's, with a backward pass that allocates nothing of size N·V.
/// Throws InvariantError on mismatched shapes.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace dloco
