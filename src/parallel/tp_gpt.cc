// The tensor-parallel GPT; see tp_gpt.h. Dimension letters: B, T, C, NH, hs, F, V, L; t, r.
#include "parallel/tp_gpt.h"

#include <cmath>
#include <map>

#include "core/check.h"

namespace dloco {

namespace F = torch::nn::functional;

namespace {

// A replicated RMSNorm holding a copy of `full`'s gain.
RMSNorm copy_norm(const RMSNormImpl& full, const ModelConfig& cfg) {
  RMSNorm norm(cfg.d_model, cfg.norm_eps);
  torch::NoGradGuard no_grad;
  norm->named_parameters()["weight"].copy_(full.named_parameters()["weight"]);
  return norm;
}

void check_divides(int64_t size, int world, const char* what) {
  if (size % world != 0) {
    throw InputError(std::string("tensor parallelism: ") + what + " = " + std::to_string(size) +
                     " is not a multiple of the tensor-parallel degree " + std::to_string(world) +
                     "; choose a degree that divides it");
  }
}

}  // namespace

TensorParallelAttentionImpl::TensorParallelAttentionImpl(const CausalSelfAttentionImpl& full, const ModelConfig& cfg,
                                                         TensorParallelGroup& group) {
  check_divides(cfg.n_head, group.world(), "model.n_head");
  local_heads_ = cfg.n_head / group.world();
  head_size_ = cfg.d_model / cfg.n_head;
  // The fused (3C, C) weight's rows are q, k, v (each head-major): three blocks, each split by heads.
  qkv = register_module("qkv", ColumnParallelLinear(full.qkv, group, ColumnParallelOptions{3, true, false}));
  proj = register_module("proj", RowParallelLinear(full.proj, group));
}

torch::Tensor TensorParallelAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                   const torch::Tensor& sin, const torch::Tensor& causal) {
  const int64_t B = x.size(0), T = x.size(1), NHt = local_heads_, hs = head_size_;
  auto qkv_out = qkv(x).view({B, T, 3, NHt, hs}).permute({2, 0, 3, 1, 4});  // (3, B, NH/t, T, hs)
  auto qk = apply_rope(qkv_out.narrow(0, 0, 2), cos, sin);                  // (2, B, NH/t, T, hs), contiguous
  auto q = qk[0].reshape({B * NHt, T, hs});
  auto k = qk[1].reshape({B * NHt, T, hs});
  auto v = qkv_out[2].reshape({B * NHt, T, hs});
  auto att = torch::baddbmm(causal, q, k.transpose(1, 2), /*beta=*/1.0,
                            /*alpha=*/1.0 / std::sqrt(static_cast<double>(hs)));  // (B·NH/t, T, T)
  att = torch::softmax(att, -1);
  auto y = torch::bmm(att, v).view({B, NHt, T, hs});          // (B, NH/t, T, hs)
  y = y.transpose(1, 2).contiguous().view({B, T, NHt * hs});  // (B, T, C/t): this rank's heads, head-major
  return proj(y);                                             // (B, T, C), all-reduced by g
}

TensorParallelMLPImpl::TensorParallelMLPImpl(const MLPImpl& full, TensorParallelGroup& group) : group_(&group) {
  check_divides(full.gate->weight.size(0), group.world(), "the SwiGLU width F (model.d_ff)");
  // f is applied once in forward for both gate and up: one all-reduce of dx in backward, not two.
  const ColumnParallelOptions no_f{1, /*copy_input=*/false, /*gather_output=*/false};
  gate = register_module("gate", ColumnParallelLinear(full.gate, group, no_f));
  up = register_module("up", ColumnParallelLinear(full.up, group, no_f));
  down = register_module("down", RowParallelLinear(full.down, group));
}

torch::Tensor TensorParallelMLPImpl::forward(const torch::Tensor& x) {
  auto xf = copy_to_tensor_parallel(x, *group_);  // (B, T, C)
  return down(F::silu(gate(xf)) * up(xf));        // (B, T, F/t) -> (B, T, C), all-reduced by g
}

TensorParallelBlockImpl::TensorParallelBlockImpl(const BlockImpl& full, const ModelConfig& cfg,
                                                 TensorParallelGroup& group) {
  ln_1 = register_module("ln_1", copy_norm(*full.ln_1, cfg));
  attn = register_module("attn", TensorParallelAttention(*full.attn, cfg, group));
  ln_2 = register_module("ln_2", copy_norm(*full.ln_2, cfg));
  mlp = register_module("mlp", TensorParallelMLP(*full.mlp, group));
}

torch::Tensor TensorParallelBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                               const torch::Tensor& sin, const torch::Tensor& causal) {
  auto y = x + attn(ln_1(x), cos, sin, causal);
  return y + mlp(ln_2(y));
}

TensorParallelGPTImpl::TensorParallelGPTImpl(const GPT& full, TensorParallelGroup& group)
    : cfg_(full->config()), group_(&group) {
  build({[&] { return full->wte; }, [&](size_t i) { return Block(full->h->ptr<BlockImpl>(i)); },
         [&] { return full->ln_f; }, [&] { return full->lm_head; }},
        nullptr);
}

TensorParallelGPTImpl::TensorParallelGPTImpl(const ModelConfig& cfg, TensorParallelGroup& group,
                                             const std::function<void(torch::nn::Module&)>& cut)
    : cfg_(cfg), group_(&group) {
  validate_model(cfg);
  // GPTImpl's constructor, part by part (model/gpt.cc): the same modules in the same order draw the same values.
  const int64_t V = cfg.vocab_size, C = cfg.d_model;
  build({[&] { return torch::nn::Embedding(V, C); }, [&](size_t) { return Block(cfg); },
         [&] { return RMSNorm(C, cfg.norm_eps); },
         [&] { return torch::nn::Linear(torch::nn::LinearOptions(C, V).bias(false)); }},
        cut);
}

void TensorParallelGPTImpl::build(const FullParts& parts, const std::function<void(torch::nn::Module&)>& cut) {
  check_divides(cfg_.vocab_size, group_->world(), "model.vocab_size");
  std::map<std::string, std::vector<int64_t>> full_sizes;  // every parameter's full shape, by full name
  const auto record = [&](const std::string& prefix, torch::nn::Module& part) {
    for (const auto& p : part.named_parameters()) full_sizes[prefix + "." + p.key()] = p.value().sizes().vec();
  };
  const auto done = [&](torch::nn::Module& part) {
    if (cut) cut(part);
  };
  {
    auto full_wte = parts.wte();
    record("wte", *full_wte);
    wte = register_module("wte", VocabParallelEmbedding(full_wte, *group_));
  }
  done(*wte);
  h = register_module("h", torch::nn::ModuleList());
  for (size_t i = 0; i < static_cast<size_t>(cfg_.n_layer); ++i) {
    {
      auto full_block = parts.block(i);
      record("h." + std::to_string(i), *full_block);
      h->push_back(TensorParallelBlock(*full_block, cfg_, *group_));
    }
    done(*h[i]);
  }
  {
    auto full_ln_f = parts.ln_f();
    record("ln_f", *full_ln_f);
    ln_f = register_module("ln_f", copy_norm(*full_ln_f, cfg_));
  }
  done(*ln_f);
  if (!cfg_.tie_embeddings) {
    {
      auto full_head = parts.lm_head();
      record("lm_head", *full_head);
      lm_head = register_module("lm_head", ColumnParallelLinear(full_head, *group_));
    }
    done(*lm_head);
  }
  const auto tables = GPTImpl::rope_and_mask(cfg_);  // the same values as the full model's buffers
  rope_cos_ = register_buffer("rope_cos", tables.cos);
  rope_sin_ = register_buffer("rope_sin", tables.sin);
  causal_ = register_buffer("causal", tables.causal);

  // The split rule and full shape of every parameter, walking the modules as named_parameters() does (this
  // module holds no parameter itself, and cannot name itself before it sits in a shared_ptr).
  for (const auto& module : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(module.value().get());
    for (const auto& p : module.value()->named_parameters(/*recurse=*/false)) {
      const std::string name = module.key() + "." + p.key();
      DLOCO_CHECK(full_sizes.count(name) == 1);
      specs_.emplace_back(name, sharded ? sharded->shard_spec(p.key()) : ShardSpec{});
      full_sizes_.emplace_back(name, full_sizes.at(name));
    }
  }
  DLOCO_CHECK_EQ(specs_.size(), full_sizes.size());
}

torch::Tensor TensorParallelGPTImpl::forward(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  DLOCO_CHECK_LE(T, cfg_.seq_len);
  auto cos = rope_cos_.narrow(0, 0, T), sin = rope_sin_.narrow(0, 0, T);
  auto causal = causal_.narrow(0, 0, T).narrow(1, 0, T);
  auto x = wte(idx);  // (B, T, C), all-reduced by g
  for (auto& block : *h) x = block->as<TensorParallelBlock>()->forward(x, cos, sin, causal);
  x = ln_f(x);
  if (!cfg_.tie_embeddings) return lm_head(x);                                 // (B, T, V/t), f inside
  return torch::matmul(copy_to_tensor_parallel(x, *group_), wte->weight.t());  // (B, T, V/t)
}

torch::Tensor TensorParallelGPTImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = forward(idx);  // (B, T, V/t)
  return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}), *group_);
}

ShardSpec TensorParallelGPTImpl::shard_spec(const std::string& parameter_name) const {
  for (const auto& [name, spec] : specs_) {
    if (name == parameter_name) return spec;
  }
  throw InputError("tensor-parallel GPT has no parameter '" + parameter_name + "'");
}

std::vector<int64_t> TensorParallelGPTImpl::full_size(const std::string& parameter_name) const {
  for (const auto& [name, sizes] : full_sizes_) {
    if (name == parameter_name) return sizes;
  }
  throw InputError("tensor-parallel GPT has no parameter '" + parameter_name + "'");
}

std::vector<std::pair<std::string, torch::Tensor>> TensorParallelGPTImpl::gather(bool gradients) {
  const auto local = named_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const auto& [name, spec] = specs_[i];
    torch::Tensor piece = local[name];
    if (gradients) piece = piece.grad().defined() ? piece.grad() : torch::zeros_like(piece);
    out.emplace_back(name, gather_shards(piece, spec, full_sizes_[i].second, *group_));
  }
  return out;
}

double TensorParallelGPTImpl::clip_grad_norm(double max_norm) {
  torch::NoGradGuard no_grad;
  const auto local = named_parameters();
  auto sharded_sq = torch::zeros({1}, torch::kDouble);  // Σ ‖g‖² over this rank's shards, then over all ranks
  double replicated_sq = 0;                             // identical on every rank: counted once, not summed
  for (const auto& [name, spec] : specs_) {
    const auto& grad = local[name].grad();
    if (!grad.defined()) continue;
    if (spec.replicated()) {
      replicated_sq += grad.to(torch::kDouble).square().sum().item<double>();
    } else {
      sharded_sq += grad.to(torch::kDouble).square().sum();
    }
  }
  group_->allreduce_sum(sharded_sq, TensorParallelCall::kNorm);
  const double norm = std::sqrt(sharded_sq.item<double>() + replicated_sq);
  const double coef = max_norm / (norm + 1e-6);  // torch::nn::utils::clip_grad_norm_'s coefficient
  if (coef < 1) {
    for (auto& p : parameters()) {
      if (p.grad().defined()) p.grad().mul_(coef);
    }
  }
  return norm;
}

void TensorParallelGPTImpl::write_to(GPT& full) {
  auto gathered = gather(false);  // every rank takes part, whatever `full` holds
  auto targets = full->named_parameters();
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : gathered) {
    if (!targets.contains(name) || targets[name].sizes() != tensor.sizes()) {
      throw InputError("cannot write the tensor-parallel model into this GPT: parameter '" + name +
                       "' is missing or has another shape; build both from the same [model] config");
    }
    targets[name].copy_(tensor);
  }
}

}  // namespace dloco
