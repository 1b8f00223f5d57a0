// Megatron's distributed optimizer (ZeRO-1) over one rank's tensors; see distributed_optimizer.h.
#include "parallel/distributed_optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace dloco {

DistributedAdamW::DistributedAdamW(std::vector<DistributedParameter> params, Collective* dp, const TrainConfig& train,
                                   torch::ScalarType compute)
    : dp_(dp), train_(train), d_(dp ? dp->world() : 1), rank_(dp ? dp->rank() : 0) {
  if (params.empty()) throw InputError("the distributed optimizer needs at least one tensor");
  if (compute != torch::kFloat && compute != torch::kBFloat16) {
    throw InputError("the distributed optimizer computes in fp32 or bf16, not " + std::string(c10::toString(compute)));
  }
  int64_t numel = 0;
  for (const auto& p : params) {
    if (p.tensor.scalar_type() != torch::kFloat) throw InputError("the distributed optimizer takes fp32 tensors");
    offsets_.push_back(numel);
    numel += p.tensor.numel();
  }
  padded_ = (numel + d_ - 1) / d_ * d_;
  shard_ = padded_ / d_;
  torch::NoGradGuard no_grad;
  auto values = torch::zeros({padded_});  // (padded) fp32; the tail past numel stays 0
  for (size_t i = 0; i < params.size(); ++i) {
    values.narrow(0, offsets_[i], params[i].tensor.numel()).copy_(params[i].tensor.reshape({-1}));
  }
  const int64_t begin = rank_ * shard_, end = begin + shard_;
  master_ = values.narrow(0, begin, shard_);                    // fp32: the compute copy is the master
  if (compute == torch::kBFloat16) master_ = master_.clone();   // bf16: the exact fp32 values, before rounding
  flat_ = values.to(compute);                                   // bf16: rounded to nearest even
  grad_flat_ = torch::zeros({padded_}, torch::kFloat);  // (padded)
  for (size_t i = 0; i < params.size(); ++i) {
    auto& t = params[i].tensor;
    const int64_t n = t.numel(), off = offsets_[i];
    t.set_data(flat_.narrow(0, off, n).view(t.sizes()));
    params_.push_back(t);
    main_grads_.push_back(grad_flat_.narrow(0, off, n).view(t.sizes()));
    const int64_t a = std::max(begin, off), b = std::min(end, off + n);  // its part of the own slice
    if (a >= b) continue;
    if (params[i].decay) decay_.emplace_back(a - begin, b - a);
    if (params[i].in_norm) norm_.emplace_back(a - begin, b - a);
  }
  exp_avg_ = torch::zeros({shard_});
  exp_avg_sq_ = torch::zeros({shard_});
}

void DistributedAdamW::zero_grad() { grad_flat_.zero_(); }

void DistributedAdamW::average_main_grads(Collective& replicas) {
  torch::NoGradGuard no_grad;
  replicas.allreduce_sum(grad_flat_);
  grad_flat_.div_(replicas.world());
}

double DistributedAdamW::reduce_gradients(Collective* replicas) {
  torch::NoGradGuard no_grad;
  if (d_ > 1) {
    grad_ = torch::empty({shard_});
    dp_->reduce_scatter_sum(grad_, grad_flat_);
    grad_.div_(d_);
  } else {
    grad_ = grad_flat_.clone();
  }
  if (replicas != nullptr) {
    replicas->allreduce_sum(grad_);
    grad_.div_(static_cast<double>(replicas->world()));
  }
  double sum = 0;
  for (const auto& [start, length] : norm_) {
    sum += grad_.narrow(0, start, length).to(torch::kDouble).square().sum().item<double>();
  }
  return sum;
}

void DistributedAdamW::step(double lr, double clip_coef) {
  DLOCO_CHECK(grad_.defined());
  torch::NoGradGuard no_grad;
  ++step_count_;
  if (clip_coef < 1) grad_.mul_(clip_coef);
  // torch::optim::AdamW (LibTorch 1.13) on the slice, as parallel/zero.cc: θ ← θ·(1 − lr·λ) where decayed;
  // m ← β₁m + (1 − β₁)g; v ← β₂v + (1 − β₂)g²; θ ← θ − lr/(1 − β₁ᵗ) · m / (sqrt(v)/sqrt(1 − β₂ᵗ) + ε).
  const double bias_correction1 = 1 - std::pow(train_.beta1, static_cast<double>(step_count_));
  const double bias_correction2 = 1 - std::pow(train_.beta2, static_cast<double>(step_count_));
  if (train_.weight_decay != 0) {
    for (const auto& [start, length] : decay_) master_.narrow(0, start, length).mul_(1 - lr * train_.weight_decay);
  }
  exp_avg_.mul_(train_.beta1).add_(grad_, 1 - train_.beta1);
  exp_avg_sq_.mul_(train_.beta2).addcmul_(grad_, grad_, 1 - train_.beta2);
  auto denom = (exp_avg_sq_.sqrt() / std::sqrt(bias_correction2)).add_(train_.adam_eps);  // (S)
  master_.addcdiv_(exp_avg_, denom, -lr / bias_correction1);
  grad_ = torch::Tensor();
  auto own = flat_.narrow(0, rank_ * shard_, shard_);  // (S)
  if (flat_.scalar_type() == torch::kBFloat16) own.copy_(master_);  // round to nearest even, once
  if (d_ == 1) return;
  // Gloo 1.13 moves no bf16: an all-gather only copies, so the 2-byte words travel as fp16's.
  const auto wire = flat_.scalar_type() == torch::kBFloat16 ? torch::kHalf : torch::kFloat;
  dp_->all_gather_flat(flat_.view(wire), own.view(wire));
}

void DistributedAdamW::drop_gradients() { grad_ = torch::Tensor(); }

void DistributedAdamW::set_parameter(size_t i, const torch::Tensor& value) {
  DLOCO_CHECK(i < params_.size());
  if (value.sizes() != params_[i].sizes()) {
    throw InputError("the distributed optimizer's tensor " + std::to_string(i) + " has shape " +
                     c10::str(params_[i].sizes()) + ", the value " + c10::str(value.sizes()));
  }
  torch::NoGradGuard no_grad;
  const auto values = value.reshape({-1}).to(torch::kFloat);  // (n)
  params_[i].copy_(value);
  if (flat_.scalar_type() == torch::kFloat) return;  // the master is the compute copy
  const int64_t begin = rank_ * shard_, off = offsets_[i], a = std::max(begin, off),
                b = std::min(begin + shard_, off + values.numel());
  if (a < b) master_.narrow(0, a - begin, b - a).copy_(values.narrow(0, a - off, b - a));
}

torch::Tensor DistributedAdamW::full_master(size_t i) {
  DLOCO_CHECK(i < params_.size());
  torch::NoGradGuard no_grad;
  if (flat_.scalar_type() == torch::kFloat) return params_[i].detach().clone();
  const int64_t n = params_[i].numel(), off = offsets_[i];
  const int64_t begin = rank_ * shard_, a = std::max(begin, off), b = std::min(begin + shard_, off + n);
  auto mine = torch::zeros({n});  // (n) this rank's part of [off, off + n) in place, zeros elsewhere
  if (a < b) mine.narrow(0, a - off, b - a).copy_(master_.narrow(0, a - begin, b - a));
  // Summed over dp as 32-bit integers: every element is one rank's bits plus the others' zero bits, so the sum is
  // those bits exactly (a float sum would turn −0 into +0), at an all-reduce's traffic.
  if (d_ > 1) dp_->allreduce_sum(mine.view(torch::kInt));
  return mine.view(params_[i].sizes());
}

void DistributedAdamW::save_state(const std::string& file) const {
  std::vector<torch::Tensor> state{torch::tensor({int64_t{d_}, int64_t{rank_}, padded_, step_count_}), exp_avg_,
                                   exp_avg_sq_, numels()};
  torch::save(state, file);
}

void DistributedAdamW::load_state(const std::string& file) {
  std::vector<torch::Tensor> state;
  try {
    torch::load(state, file);
  } catch (const c10::Error& e) {
    throw InputError("cannot read the distributed optimizer state '" + file + "': " + e.what_without_backtrace());
  }
  if (state.size() != 4 || state[0].numel() != 4) {
    throw InputError("the distributed optimizer state '" + file + "' was written for another layout");
  }
  const auto meta = state[0];
  if (meta[0].item<int64_t>() != d_ || meta[1].item<int64_t>() != rank_ || meta[2].item<int64_t>() != padded_ ||
      state[1].sizes() != exp_avg_.sizes() || state[2].sizes() != exp_avg_sq_.sizes()) {
    throw InputError("the distributed optimizer state '" + file + "' was written by rank " +
                     std::to_string(meta[1].item<int64_t>()) + " of d = " + std::to_string(meta[0].item<int64_t>()) +
                     " over " + std::to_string(meta[2].item<int64_t>()) + " elements; this is rank " +
                     std::to_string(rank_) + " of d = " + std::to_string(d_) + " over " + std::to_string(padded_));
  }
  if (!torch::equal(state[3], numels())) {
    throw InputError("the distributed optimizer state '" + file + "' was written for other tensors (another model, "
                     "stage or TP split: their sizes differ)");
  }
  torch::NoGradGuard no_grad;
  step_count_ = meta[3].item<int64_t>();
  exp_avg_.copy_(state[1]);
  exp_avg_sq_.copy_(state[2]);
}

void DistributedAdamW::reset_state() {
  torch::NoGradGuard no_grad;
  step_count_ = 0;
  exp_avg_.zero_();
  exp_avg_sq_.zero_();
}

torch::Tensor DistributedAdamW::numels() const {
  auto out = torch::empty({static_cast<int64_t>(params_.size())}, torch::kLong);  // (n tensors)
  for (size_t i = 0; i < params_.size(); ++i) out[static_cast<int64_t>(i)] = params_[i].numel();
  return out;
}

DistributedMemory DistributedAdamW::memory() const {
  DistributedMemory m;
  for (const auto& p : params_) m.parameters += p.numel();
  m.parameter_bytes = static_cast<int64_t>(flat_.nbytes());
  m.gradient_bytes = static_cast<int64_t>(grad_flat_.nbytes());
  if (flat_.scalar_type() == torch::kBFloat16) m.master_bytes = static_cast<int64_t>(master_.nbytes());
  m.moment_bytes = static_cast<int64_t>(exp_avg_.nbytes() + exp_avg_sq_.nbytes());
  return m;
}

}  // namespace dloco
