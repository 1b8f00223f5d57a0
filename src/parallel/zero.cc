// ZeRO-1/2/3; see zero.h. Dimension letters: B batch, T sequence length, C d_model, V vocabulary, L layers;
// N the data-parallel degree, S = padded / N the elements of a rank's slice of a unit.
#include "parallel/zero.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "parallel/zero_unit.h"

namespace dloco {

namespace {
// Lays `unit` out from its params' shapes for rank `rank` of N (offsets, padding, slice, the decayed and counted
// ranges of the slice; `replicated[i]`: parameter i is whole on every TP rank and counted only where `count_replicated`),
// then fills it: stages 1, 2 flatten the current values and the params become views of `flat` (keep_full); stage 3
// keeps the slice only — of the current values, or of what `init` writes — and releases the params.
void build_unit(ZeroAdamW::Unit& u, int N, int rank, bool keep_full, const std::vector<bool>& replicated,
                bool count_replicated, const ZeroUnitInit& init) {
  torch::NoGradGuard no_grad;
  for (const auto& p : u.params) {
    u.offsets.push_back(u.numel);
    u.shapes.push_back(p.sizes().vec());
    u.numel += p.numel();
  }
  u.padded = (u.numel + N - 1) / N * N;
  u.shard = u.padded / N;
  const int64_t begin = rank * u.shard, end = begin + u.shard;
  for (size_t i = 0; i < u.params.size(); ++i) {
    const int64_t a = std::max(begin, u.offsets[i]), b = std::min(end, u.offsets[i] + u.params[i].numel());
    if (a >= b) continue;
    if (u.params[i].dim() >= 2) u.decay.emplace_back(a - begin, b - a);
    if (count_replicated || !replicated[i]) {
      if (!u.counted.empty() && u.counted.back().first + u.counted.back().second == a - begin) {
        u.counted.back().second += b - a;  // adjacent: one reduction, not one per parameter
      } else {
        u.counted.emplace_back(a - begin, b - a);
      }
    }
  }
  auto flat = torch::zeros({u.padded});  // (padded); the tail past numel stays 0
  std::vector<torch::Tensor> views;
  for (size_t i = 0; i < u.params.size(); ++i) views.push_back(flat.narrow(0, u.offsets[i], u.params[i].numel()).view(u.shapes[i]));
  if (init) {
    init(u.names, views);
  } else {
    for (size_t i = 0; i < u.params.size(); ++i) views[i].copy_(u.params[i]);
  }
  if (keep_full) {
    u.flat = flat;
    u.slice = flat.narrow(0, begin, u.shard);  // a view: the step updates the model in place
    for (size_t i = 0; i < u.params.size(); ++i) u.params[i].set_data(views[i]);
  } else {
    u.slice = flat.narrow(0, begin, u.shard).clone();
    for (auto& p : u.params) p.set_data(torch::empty({0}));  // released until gathered
  }
  u.exp_avg = torch::zeros({u.shard});
  u.exp_avg_sq = torch::zeros({u.shard});
  u.anchor = torch::empty({0}).requires_grad_(true);
}

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }
}  // namespace

/// ZeRO-3's unit as an autograd node: forward gathers, runs under no-grad and frees; backward gathers again,
/// recomputes with grad, back-propagates into the unit's input and parameters, frees, and reduce-scatters the
/// parameter gradient into the owners' slices. Inputs: x (the unit's input: idx (B, T) int64 for the embedding,
/// (B, T, C) after it), aux (targets (B, T) for the head, else an empty tensor), anchor, the optimizer and the unit index.
struct ZeroUnitFunction : torch::autograd::Function<ZeroUnitFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& aux, const torch::Tensor& anchor, ZeroAdamW* zero,
                               int64_t unit) {
    (void)anchor;
    auto& u = zero->units_[static_cast<size_t>(unit)];
    zero->gather(u);
    auto out = zero->run_unit(static_cast<size_t>(unit), x, aux);
    zero->release(u);
    ctx->saved_data["x"] = x;  // the unit's input: the only activation kept (recompute in backward)
    ctx->saved_data["aux"] = aux;
    ctx->saved_data["zero"] = reinterpret_cast<int64_t>(zero);  // IValue holds no pointers; alive for the step
    ctx->saved_data["unit"] = unit;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad_output) {
    auto* zero = reinterpret_cast<ZeroAdamW*>(ctx->saved_data["zero"].toInt());
    const auto unit = static_cast<size_t>(ctx->saved_data["unit"].toInt());
    const auto x = ctx->saved_data["x"].toTensor();
    const auto aux = ctx->saved_data["aux"].toTensor();
    ctx->saved_data.clear();
    auto& u = zero->units_[unit];
    const bool has_input_grad = x.is_floating_point();
    zero->gather(u);
    std::vector<torch::Tensor> grads;
    {
      torch::AutoGradMode with_grad(true);
      auto input = has_input_grad ? x.detach().requires_grad_(true) : x;
      auto out = zero->run_unit(unit, input, aux);
      std::vector<torch::Tensor> wrt = u.params;
      if (has_input_grad) wrt.push_back(input);
      grads = torch::autograd::grad({out}, wrt, {grad_output[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                    /*allow_unused=*/true);
    }
    zero->release(u);
    torch::Tensor grad_x;
    if (has_input_grad) {
      grad_x = grads.back();
      grads.pop_back();
    }
    zero->reduce_unit_gradient(u, grads);
    return {grad_x, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

ZeroAdamW::ZeroAdamW(GPT model, Collective& group, ZeroOptions options)
    : model_(std::move(model)), cfg_(model_->config()), group_(group), options_(options) {
  check_options(cfg_);
  auto buffers = model_->named_buffers();
  build_units(model_->named_parameters(), {buffers["rope_cos"], buffers["rope_sin"], buffers["causal"]}, {});
}

ZeroAdamW::ZeroAdamW(TensorParallelGPT model, TensorParallelGroup& tensor, Collective& group, ZeroOptions options,
                     const ZeroUnitInit& init)
    : model_(nullptr), tp_model_(std::move(model)), tp_(&tensor), cfg_(tp_model_->config()), group_(group),
      options_(options) {
  if (options_.stage != 3) {
    throw InputError("ZeRO with tensor parallelism shards the parameters: stage 3 (ZeRO-1 with tensor parallelism "
                     "is the distributed optimizer)");
  }
  check_options(cfg_);
  build_units(tp_model_->named_parameters(), GPTImpl::rope_and_mask(cfg_), init);
}

void ZeroAdamW::check_options(const ModelConfig& cfg) const {
  if (options_.stage < 1 || options_.stage > 3) {
    throw InputError("ZeRO stage " + std::to_string(options_.stage) + " does not exist; use 1, 2 or 3");
  }
  if (options_.all_reduce_gradients && options_.stage != 1) {
    throw InputError("ZeroOptions::all_reduce_gradients applies to stage 1 only (stage " +
                     std::to_string(options_.stage) + " reduces gradients to their owners)");
  }
  if (options_.stage == 3 && cfg.tie_embeddings) {
    throw InputError("ZeRO-3 here shards the embedding and the head as separate units: set tie_embeddings = false");
  }
  if (options_.compute_dtype != torch::kFloat && (options_.compute_dtype != torch::kBFloat16 || options_.stage != 3)) {
    throw InputError("ZeroAdamW computes in fp32, or in bf16 at stage 3");
  }
}

void ZeroAdamW::build_units(const torch::OrderedDict<std::string, torch::Tensor>& named, const GPTImpl::Tables& tables,
                            const ZeroUnitInit& init) {
  const int N = group_.world();
  const int64_t L = cfg_.n_layer;
  units_.resize(options_.stage == 3 ? static_cast<size_t>(L + 2) : 1);
  std::vector<std::vector<bool>> replicated(units_.size());
  for (const auto& item : named) {
    const std::string& name = item.key();
    size_t unit = 0;  // stages 1, 2: one unit; stage 3: wte | h.<i> | head (ln_f, lm_head)
    if (options_.stage == 3) {
      unit = name.rfind("wte.", 0) == 0  ? 0
             : name.rfind("h.", 0) == 0 ? 1 + std::stoul(name.substr(2, name.find('.', 2) - 2))
                                         : static_cast<size_t>(L + 1);
    }
    units_[unit].params.push_back(item.value());
    units_[unit].names.push_back(name);
    replicated[unit].push_back(tp_model_ && tp_model_->shard_spec(name).replicated());
    parameter_count_ += item.value().numel();
  }
  for (auto& u : units_) {
    const size_t k = static_cast<size_t>(&u - units_.data());
    build_unit(u, N, group_.rank(), /*keep_full=*/options_.stage < 3, replicated[k], tp_ == nullptr || tp_->rank() == 0,
               init);
    if (!options_.offload_dir.empty()) {  // m, v (stage 3: and the fp32 slice) in a zero-filled mapped file
      // v and the slice start on page boundaries (1024 floats = 4 KiB), so whole pages of each can be released.
      const int64_t pages = (u.shard + 1023) / 1024 * 1024, v_at = pages, slice_at = 2 * pages;
      const bool masters = options_.stage == 3;  // the slice is the only copy: the fp32 master (bf16 or not)
      u.offload = std::make_unique<MappedState>(options_.offload_dir / ("zero_unit_" + std::to_string(k) + ".state"),
                                                masters ? slice_at + u.shard : v_at + u.shard);
      u.exp_avg = u.offload->tensor().narrow(0, 0, u.shard);
      u.exp_avg_sq = u.offload->tensor().narrow(0, v_at, u.shard);
      if (masters) {
        auto mapped = u.offload->tensor().narrow(0, slice_at, u.shard);
        mapped.copy_(u.slice);
        u.slice = mapped;
        u.offload->release(slice_at, u.shard);
      }
    }
    if (options_.stage >= 2) u.grad = torch::zeros({u.shard});
  }
  if (options_.stage == 2) {
    for (size_t k = 0; k < units_[0].params.size(); ++k) {
      auto& p = units_[0].params[k];
      hooks_.emplace_back(p, p.register_hook([this, k](const torch::Tensor& grad) { on_gradient(k, grad); }));
    }
  }
  rope_cos_ = tables.cos.to(options_.compute_dtype);
  rope_sin_ = tables.sin.to(options_.compute_dtype);
  causal_ = tables.causal.to(options_.compute_dtype);
}

ZeroAdamW::~ZeroAdamW() {
  for (auto& [p, handle] : hooks_) p.remove_hook(handle);
}

void ZeroAdamW::gather(Unit& u) {
  auto full = torch::empty({u.padded}, options_.compute_dtype);  // (padded)
  if (options_.compute_dtype == torch::kBFloat16) {  // rounded once, moved as 2-byte words (Gloo has no bf16)
    group_.all_gather_flat(full.view(torch::kHalf), u.slice.to(torch::kBFloat16).view(torch::kHalf));
  } else {
    group_.all_gather_flat(full, u.slice);
  }
  for (size_t i = 0; i < u.params.size(); ++i) {
    u.params[i].set_data(full.narrow(0, u.offsets[i], c10::multiply_integers(u.shapes[i])).view(u.shapes[i]));
  }
  live_gathered_bytes_ += bytes_of(full);
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, live_gathered_bytes_);
}

void ZeroAdamW::release(Unit& u) {
  if (u.offload) u.offload->release(u.slice.storage_offset(), u.shard);  // stage 3: the offloaded masters read
  for (auto& p : u.params) p.set_data(torch::empty({0}));
  live_gathered_bytes_ -= u.padded * static_cast<int64_t>(c10::elementSize(options_.compute_dtype));
}

torch::Tensor ZeroAdamW::run_unit(size_t unit, const torch::Tensor& x, const torch::Tensor& aux) {
  const int64_t L = cfg_.n_layer;
  if (unit == 0) return tp_model_ ? tp_model_->wte(x) : model_->wte(x);  // (B, T) -> (B, T, C)
  if (unit <= static_cast<size_t>(L)) {
    const int64_t T = x.size(1);
    const auto cos = rope_cos_.narrow(0, 0, T), sin = rope_sin_.narrow(0, 0, T);
    const auto causal = causal_.narrow(0, 0, T).narrow(1, 0, T);
    if (tp_model_) return tp_model_->h[unit - 1]->as<TensorParallelBlock>()->forward(x, cos, sin, causal);
    return model_->h[unit - 1]->as<Block>()->forward(x, cos, sin, causal);  // (B, T, C)
  }
  if (tp_model_) {  // this rank's (B, T, V/t) logits, the vocab-parallel cross-entropy in fp32
    auto logits = tp_model_->lm_head(tp_model_->ln_f(x)).to(torch::kFloat);
    return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), aux.reshape({-1}), *tp_);
  }
  auto logits = model_->lm_head(model_->ln_f(x)).to(torch::kFloat);  // (B, T, V), the loss in fp32
  return cross_entropy(logits.view({-1, cfg_.vocab_size}), aux.reshape({-1}));
}

void ZeroAdamW::reduce_unit_gradient(Unit& u, const std::vector<torch::Tensor>& grads) {
  DLOCO_CHECK_EQ(grads.size(), u.params.size());
  auto full = torch::zeros({u.padded});  // (padded) this rank's full gradient of the unit
  int64_t live = bytes_of(full);
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    live += bytes_of(grads[i]);
    full.narrow(0, u.offsets[i], grads[i].numel()).copy_(grads[i].reshape({-1}));
  }
  peak_full_gradient_bytes_ = std::max(peak_full_gradient_bytes_, live);
  auto part = torch::empty({u.shard});  // (S)
  group_.reduce_scatter_sum(part, full, options_.reduce_scatter);
  u.grad.add_(part);
}

void ZeroAdamW::on_gradient(size_t k, const torch::Tensor& grad) {
  auto& u = units_[0];
  // The parameters reduced at earlier hooks have their .grad by now (autograd accumulated them): free them.
  live_full_gradient_bytes_ += bytes_of(grad);
  peak_full_gradient_bytes_ = std::max(peak_full_gradient_bytes_, live_full_gradient_bytes_);
  for (size_t j : reduced_) u.params[j].mutable_grad().reset();
  reduced_.clear();
  live_full_gradient_bytes_ = bytes_of(grad);
  // Each piece of this gradient goes to the owner of the slice it falls in (a parameter can span owners).
  const int64_t off = u.offsets[k], n = grad.numel();
  const auto flat = grad.reshape({-1});  // (n)
  for (int64_t owner = off / u.shard; n > 0 && owner < group_.world() && owner * u.shard < off + n; ++owner) {
    const int64_t a = std::max(off, owner * u.shard), b = std::min(off + n, (owner + 1) * u.shard);
    auto piece = flat.narrow(0, a - off, b - a).clone();  // (b − a) Gloo's reduce scribbles on it
    group_.reduce_sum(piece, static_cast<int>(owner));
    if (owner == group_.rank()) u.grad.narrow(0, a - owner * u.shard, b - a).add_(piece);
  }
  reduced_.push_back(k);
}

torch::Tensor ZeroAdamW::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  if (options_.stage < 3) return model_->loss(idx, targets);  // stages 1, 2 have no TP model
  const auto L = static_cast<int64_t>(units_.size()) - 2;
  const auto no_aux = torch::empty({0}, torch::kLong);  // (0) autograd functions take no undefined inputs
  auto x = ZeroUnitFunction::apply(idx, no_aux, units_[0].anchor, this, int64_t{0});  // (B, T, C)
  for (int64_t i = 1; i <= L; ++i) x = ZeroUnitFunction::apply(x, no_aux, units_[i].anchor, this, i);
  return ZeroUnitFunction::apply(x, targets, units_.back().anchor, this, L + 1);  // scalar
}

void ZeroAdamW::backward(const torch::Tensor& loss) {
  loss.backward();
  if (options_.stage == 2) {  // the last hooked parameter's full gradient is still in its .grad
    for (size_t j : reduced_) units_[0].params[j].mutable_grad().reset();
    reduced_.clear();
    live_full_gradient_bytes_ = 0;
  }
}

void ZeroAdamW::adamw_on_slice(Unit& u) {
  // torch::optim::AdamW (LibTorch 1.13) on the slice: θ ← θ·(1 − lr·λ); m ← β₁m + (1 − β₁)g;
  // v ← β₂v + (1 − β₂)g²; θ ← θ − lr/(1 − β₁ᵗ) · m / (sqrt(v)/sqrt(1 − β₂ᵗ) + ε).
  torch::NoGradGuard no_grad;
  const auto& o = options_;
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step_count_));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step_count_));
  if (o.weight_decay != 0) {
    for (const auto& [start, length] : u.decay) u.slice.narrow(0, start, length).mul_(1 - o.lr * o.weight_decay);
  }
  // Elementwise, so chunks give the same bits; offloaded, each chunk's m and v pages leave the resident set after it.
  // Offloaded chunks are whole pages (multiples of 1024 floats), so releasing one leaves no partial page behind.
  const int64_t chunk =
      u.offload ? std::max<int64_t>(1024, o.offload_chunk / 1024 * 1024) : std::max<int64_t>(1, u.shard);
  for (int64_t a = 0; a < u.shard; a += chunk) {
    const int64_t n = std::min(chunk, u.shard - a);
    auto m = u.exp_avg.narrow(0, a, n), v = u.exp_avg_sq.narrow(0, a, n), g = u.grad.narrow(0, a, n);  // (n)
    m.mul_(o.beta1).add_(g, 1 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
    auto denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);  // (n)
    u.slice.narrow(0, a, n).addcdiv_(m, denom, -o.lr / bias_correction1);
    if (u.offload) {
      u.offload->release(a, n);
      u.offload->release(u.exp_avg_sq.storage_offset() + a, n);
      if (options_.stage == 3) u.offload->release(u.slice.storage_offset() + a, n);  // the masters
    }
  }
}

ZeroStepStats ZeroAdamW::step(double max_grad_norm, bool skip) {
  torch::NoGradGuard no_grad;
  const int N = group_.world();
  for (auto& u : units_) {
    if (options_.stage == 1) {  // the full gradients are in .grad: reduce them now
      auto full = torch::zeros({u.padded});  // (padded)
      for (size_t i = 0; i < u.params.size(); ++i) {
        auto& g = u.params[i].mutable_grad();
        if (g.defined()) full.narrow(0, u.offsets[i], g.numel()).copy_(g.reshape({-1}));
        g.reset();
      }
      if (options_.all_reduce_gradients) {
        group_.allreduce_sum(full);
        u.grad = full.narrow(0, group_.rank() * u.shard, u.shard);
      } else {
        u.grad = torch::empty({u.shard});
        group_.reduce_scatter_sum(u.grad, full, options_.reduce_scatter);
      }
    }
    u.grad.div_(N);  // the mean over the N ranks, as plain data parallelism's all-reduce / N
  }
  if (replicas_ != nullptr) {  // the dp baseline over learner groups: the same slices of every learner, averaged
    std::vector<torch::Tensor> parts;
    for (const auto& u : units_) parts.push_back(u.grad);
    auto flat = torch::cat(parts);  // (Σ shard)
    replicas_->allreduce_sum(flat);
    flat.div_(static_cast<double>(replicas_->world()));
    int64_t offset = 0;
    for (auto& u : units_) {
      u.grad.copy_(flat.narrow(0, offset, u.grad.numel()));
      offset += u.grad.numel();
    }
  }
  // ‖g‖ over the whole model: the slices partition it (the padding is zero), so Σ over ranks of Σ over slices;
  // with TP, then Σ over the TP ranks, each replicated gain counted on TP rank 0 only.
  auto square_sum = torch::zeros({1}, torch::kDouble);
  for (const auto& u : units_) {
    for (const auto& [start, length] : u.counted) square_sum += u.grad.narrow(0, start, length).to(torch::kDouble).square().sum();
  }
  group_.allreduce_sum(square_sum);
  if (tp_ != nullptr) tp_->allreduce_sum(square_sum, TensorParallelCall::kNorm);
  ZeroStepStats stats;
  stats.grad_norm = std::sqrt(square_sum.item<double>());
  stats.skipped = skip || !std::isfinite(stats.grad_norm);
  const double coef = max_grad_norm / (stats.grad_norm + 1e-6);
  if (!stats.skipped) ++step_count_;
  for (auto& u : units_) {
    if (!stats.skipped) {
      if (coef < 1) u.grad.mul_(coef);
      adamw_on_slice(u);
      if (options_.stage < 3) group_.all_gather_flat(u.flat, u.slice);
    }
    if (options_.stage == 1) {
      u.grad = torch::Tensor();  // stage 1 keeps no gradient slice between steps
    } else {
      u.grad.zero_();
    }
  }
  return stats;
}

std::vector<std::pair<std::string, torch::Tensor>> ZeroAdamW::gather_full(int root, int moment) {
  DLOCO_CHECK(moment >= 0 && moment <= 2);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& u : units_) {
    torch::Tensor full = u.flat;  // (padded)
    if (moment != 0 || options_.stage == 3) {
      const auto& mine = moment == 0 ? u.slice : moment == 1 ? u.exp_avg : u.exp_avg_sq;  // (S)
      full = torch::empty({u.padded});
      group_.all_gather_flat(full, mine);
    }
    if (group_.rank() != root) continue;
    for (size_t i = 0; i < u.params.size(); ++i) {
      const int64_t n = c10::multiply_integers(u.shapes[i]);
      out.emplace_back(u.names[i], full.narrow(0, u.offsets[i], n).view(u.shapes[i]).clone());
    }
  }
  return out;
}

ZeroMemory ZeroAdamW::memory() const {
  ZeroMemory m;
  for (const auto& u : units_) {
    const bool offloaded_slice = u.offload && options_.stage == 3;
    m.parameter_bytes += options_.stage < 3 ? bytes_of(u.flat) : offloaded_slice ? 0 : bytes_of(u.slice);
    m.offloaded_parameter_bytes += offloaded_slice ? bytes_of(u.slice) : 0;
    m.gradient_bytes += bytes_of(u.grad);
    if (u.offload) {
      m.offloaded_state_bytes += bytes_of(u.exp_avg) + bytes_of(u.exp_avg_sq);
      m.optimizer_state_bytes += u.offload->resident_bytes();  // −1 when /proc/self/smaps cannot be read
    } else {
      m.optimizer_state_bytes += bytes_of(u.exp_avg) + bytes_of(u.exp_avg_sq);
    }
    for (const auto& p : u.params) {
      if (options_.stage == 3) m.parameter_bytes += bytes_of(p);  // 0 unless gathered right now
      m.gradient_bytes += bytes_of(p.grad());                     // full .grad: stage 1 (and stage 2 mid-backward)
    }
  }
  m.peak_full_gradient_bytes = peak_full_gradient_bytes_;
  m.peak_gathered_parameter_bytes = peak_gathered_bytes_;
  return m;
}

}  // namespace dloco
