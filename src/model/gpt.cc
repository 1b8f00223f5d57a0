// GPT implementation; see gpt.h. Dimension letters: B, T, C, NH, hs, F, V, L.
#include "model/gpt.h"

#include <cmath>

#include "core/check.h"

namespace dloco {

namespace F = torch::nn::functional;

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight_ = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // ‖x‖₂ is one fused reduction (forward and backward); the rest works on the small (..., 1) tensor.
  const double dim = static_cast<double>(x.size(-1));
  if (x.scalar_type() != torch::kFloat) {
    // Reduced precision (bf16): the statistics and the normalisation in fp32, then back to x's dtype before the
    // gain (as Megatron and LLaMA do), so mean(x²) is not summed in bf16.
    auto xf = x.to(torch::kFloat);                                                             // (..., C) fp32
    auto inv_rms = torch::rsqrt(xf.norm(2, {-1}, /*keepdim=*/true).square() / dim + eps_);  // (..., 1) fp32
    return (xf * inv_rms).to(x.scalar_type()) * weight_;
  }
  auto inv_rms = torch::rsqrt(x.norm(2, {-1}, /*keepdim=*/true).square() / dim + eps_);  // (..., 1)
  return x * inv_rms * weight_;
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * cos - x2 * sin, x1 * sin + x2 * cos}, -1);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& cfg) : n_head_(cfg.n_head) {
  const int64_t C = cfg.d_model;
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(C, 3 * C).bias(false)));
  proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(C, C).bias(false)));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin, const torch::Tensor& causal) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), NH = n_head_, hs = C / NH;
  auto qkv_out = qkv(x).view({B, T, 3, NH, hs}).permute({2, 0, 3, 1, 4});  // (3, B, NH, T, hs)
  auto qk = apply_rope(qkv_out.narrow(0, 0, 2), cos, sin);                 // (2, B, NH, T, hs), contiguous
  auto q = qk[0].reshape({B * NH, T, hs});
  auto k = qk[1].reshape({B * NH, T, hs});
  auto v = qkv_out[2].reshape({B * NH, T, hs});
  // Scores with the 1/sqrt(hs) scale and the additive causal mask (−inf above the diagonal) in one GEMM.
  auto att = torch::baddbmm(causal, q, k.transpose(1, 2), /*beta=*/1.0,
                            /*alpha=*/1.0 / std::sqrt(static_cast<double>(hs)));  // (B·NH, T, T)
  // Softmax in fp32 whatever the compute dtype (bf16: exp and the row sums would round to 8 mantissa bits).
  att = att.scalar_type() == torch::kFloat ? torch::softmax(att, -1)
                                          : torch::softmax(att, -1, torch::kFloat).to(v.scalar_type());
  auto y = torch::bmm(att, v).view({B, NH, T, hs});       // (B, NH, T, hs)
  y = y.transpose(1, 2).contiguous().view({B, T, C});      // (B, T, C)
  return proj(y);
}

MLPImpl::MLPImpl(const ModelConfig& cfg) {
  const int64_t C = cfg.d_model, Fw = cfg.ff_dim();
  gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(C, Fw).bias(false)));
  up = register_module("up", torch::nn::Linear(torch::nn::LinearOptions(C, Fw).bias(false)));
  down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(Fw, C).bias(false)));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return down(F::silu(gate(x)) * up(x)); }

BlockImpl::BlockImpl(const ModelConfig& cfg) {
  ln_1 = register_module("ln_1", RMSNorm(cfg.d_model, cfg.norm_eps));
  attn = register_module("attn", CausalSelfAttention(cfg));
  ln_2 = register_module("ln_2", RMSNorm(cfg.d_model, cfg.norm_eps));
  mlp = register_module("mlp", MLP(cfg));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                 const torch::Tensor& causal) {
  auto y = x + attn(ln_1(x), cos, sin, causal);
  return y + mlp(ln_2(y));
}

GPTImpl::GPTImpl(const ModelConfig& cfg) : cfg_(cfg) {
  validate_model(cfg);  // throws InputError on an inconsistent model shape
  // The modules in construction order: parallel/tp_gpt.cc's part-by-part constructor repeats it (sharded init).
  const int64_t V = cfg.vocab_size, C = cfg.d_model, L = cfg.n_layer;
  wte = register_module("wte", torch::nn::Embedding(V, C));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < L; ++i) h->push_back(Block(cfg));
  ln_f = register_module("ln_f", RMSNorm(C, cfg.norm_eps));
  if (!cfg.tie_embeddings) {
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(C, V).bias(false)));
  }

  const auto tables = rope_and_mask(cfg);
  rope_cos_ = register_buffer("rope_cos", tables.cos);
  rope_sin_ = register_buffer("rope_sin", tables.sin);
  causal_ = register_buffer("causal", tables.causal);

  // Initialisation (GPT-2), after every module's constructor has drawn its own (overwritten) values: the order of
  // draws parallel/sharded_init.cc replays tensor by tensor (GroupInnerJob.ShardedInitialisation… checks it).
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) init_parameter(p.key(), p.value(), cfg);
}

void GPTImpl::init_parameter(const std::string& name, torch::Tensor p, const ModelConfig& cfg) {
  if (p.dim() < 2) return;  // norm gains stay 1
  // normal(0, std); residual projections scaled by 1/sqrt(2L)
  const bool residual = name.find("attn.proj") != std::string::npos || name.find("mlp.down") != std::string::npos;
  torch::NoGradGuard no_grad;
  p.normal_(0.0, residual ? cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layer)) : cfg.init_std);
}

GPTImpl::Tables GPTImpl::rope_and_mask(const ModelConfig& cfg) {
  const int64_t T = cfg.seq_len, hs = cfg.d_model / cfg.n_head;
  // Rotary tables: angle(t, i) = t · theta^(−2i/hs), i < hs/2.
  auto inv_freq = torch::pow(cfg.rope_theta, -torch::arange(0, hs, 2, torch::kDouble) / hs);  // (hs/2)
  auto angles = torch::outer(torch::arange(T, torch::kDouble), inv_freq).to(torch::kFloat);   // (T, hs/2)
  return {angles.cos(), angles.sin(),
          torch::full({T, T}, -std::numeric_limits<float>::infinity()).triu(1)};  // additive mask
}

void GPTImpl::set_active_blocks(std::vector<bool> active) {
  if (!active.empty() && static_cast<int64_t>(active.size()) != cfg_.n_layer) {
    throw InputError("an active-block mask of " + std::to_string(active.size()) + " entries for a model of " +
                     std::to_string(cfg_.n_layer) + " blocks");
  }
  active_ = std::move(active);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  DLOCO_CHECK_LE(T, cfg_.seq_len);
  auto cos = rope_cos_.narrow(0, 0, T), sin = rope_sin_.narrow(0, 0, T);
  auto causal = causal_.narrow(0, 0, T).narrow(1, 0, T);
  auto x = wte(idx);  // (B, T, C)
  for (size_t i = 0; i < h->size(); ++i) {
    if (active_.empty() || active_[i]) x = h[i]->as<Block>()->forward(x, cos, sin, causal);
  }
  x = ln_f(x);
  return cfg_.tie_embeddings ? torch::matmul(x, wte->weight.t()) : lm_head(x);  // (B, T, V)
}

namespace {
// Mean cross-entropy with a backward pass that reuses the saved log-probabilities in place:
// grad = (exp(log p) − onehot(target)) · g / N. Same value and gradient as F::cross_entropy, but the backward
// allocates nothing of size N·V (F::cross_entropy's nll_loss backward zero-fills an (N, V) tensor and its
// log_softmax backward allocates another).
struct CrossEntropy : torch::autograd::Function<CrossEntropy> {
  // logits: (N, V) float; targets: (N) int64 in [0, V). Returns a scalar.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets) {
    auto logp = torch::log_softmax(logits, 1);  // (N, V)
    auto loss = -logp.gather(1, targets.unsqueeze(1)).mean();
    ctx->saved_data["logp"] = logp;  // not save_for_backward: backward consumes it in place
    ctx->saved_data["targets"] = targets;
    return loss;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_output) {
    auto grad = ctx->saved_data["logp"].toTensor();
    const auto targets = ctx->saved_data["targets"].toTensor().unsqueeze(1);  // (N, 1)
    ctx->saved_data.clear();
    grad.exp_().scatter_add_(1, targets, torch::full({targets.size(0), 1}, -1.0, grad.options()));
    grad.mul_(grad_output[0] / static_cast<double>(grad.size(0)));
    return {grad, torch::Tensor()};
  }
};
}  // namespace

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  DLOCO_CHECK_EQ(logits.dim(), 2);
  DLOCO_CHECK_EQ(targets.dim(), 1);
  DLOCO_CHECK_EQ(logits.size(0), targets.size(0));
  return CrossEntropy::apply(logits, targets);
}

torch::Tensor GPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);  // (B, T, V), bf16 under mixed precision
  // The loss in fp32 (a no-op for an fp32 model): log-softmax over V in bf16 would lose the small probabilities.
  return cross_entropy(logits.view({-1, cfg_.vocab_size}).to(torch::kFloat), targets.reshape({-1}));
}

torch::Tensor GPTImpl::generate(torch::Tensor prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
                                torch::Generator* generator) {
  torch::NoGradGuard no_grad;
  auto idx = prompt;  // (1, T0)
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    auto context = idx.size(1) > cfg_.seq_len ? idx.narrow(1, idx.size(1) - cfg_.seq_len, cfg_.seq_len) : idx;
    auto logits = forward(context).select(1, context.size(1) - 1);  // (1, V)
    if (temperature <= 0) {  // greedy: the most likely token
      idx = torch::cat({idx, logits.argmax(-1, /*keepdim=*/true)}, 1);
      continue;
    }
    // Shifted so the largest is 0 first: a tiny temperature (1e-45) then sends the others to −inf, not inf − inf.
    logits = (logits - std::get<0>(logits.max(-1, /*keepdim=*/true))) / temperature;
    if (top_k > 0 && top_k < cfg_.vocab_size) {
      auto kth = std::get<0>(logits.topk(top_k, -1)).select(1, top_k - 1).unsqueeze(1);  // (1, 1)
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    auto probs = torch::softmax(logits, -1);
    auto next = generator ? torch::multinomial(probs, 1, false, *generator) : torch::multinomial(probs, 1);
    idx = torch::cat({idx, next}, 1);
  }
  return idx;
}

int64_t count_parameters(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace dloco
