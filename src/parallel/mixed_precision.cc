// bf16 mixed precision: the fp32 master/main_grad side of a bf16 model, CPU autocast, the precision key.
// See mixed_precision.h. Shapes: every master and main_grad has its parameter's shape.
#include "parallel/mixed_precision.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cmath>
#include <limits>

#include "core/check.h"
#include "train/trainer.h"

namespace dloco {

namespace {

// Megatron's main_grad accumulation: runs after a parameter's AccumulateGrad node has stored the bf16 gradient
// in .grad; adds it into the fp32 buffer (main_grad += float(grad)) and drops the bf16 .grad, so that gradient
// is freed as soon as autograd is done with it and micro-batches accumulate in fp32, not bf16.
class AccumulateIntoMainGrad : public torch::autograd::FunctionPostHook {
 public:
  AccumulateIntoMainGrad(torch::Tensor param, torch::Tensor main_grad)
      : param_(std::move(param)), main_grad_(std::move(main_grad)) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    auto& grad = param_.mutable_grad();
    if (grad.defined()) {
      torch::NoGradGuard no_grad;
      main_grad_.add_(grad);  // fp32 += bf16: the add runs in fp32 (type promotion into the fp32 self)
      grad.reset();
    }
    return outputs;
  }

 private:
  // The hook lives on the accumulator node, which holds the parameter strongly itself (and the parameter holds
  // the node weakly): holding it here adds no cycle; Bf16Optimizer owns the nodes.
  torch::Tensor param_;      // bf16 model parameter
  torch::Tensor main_grad_;  // fp32, same shape
};

int64_t bytes_of(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

Bf16Optimizer::Bf16Optimizer(torch::nn::Module& model, const TrainConfig& train) : train_(train) {
  auto params = model.parameters();
  if (params.empty()) throw InputError("bf16 mixed precision: the model has no parameters");
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) {
      if (p.scalar_type() != torch::kFloat) {
        throw InputError("bf16 mixed precision needs an fp32 model to take masters from; got a parameter of dtype " +
                         std::string(c10::toString(p.scalar_type())));
      }
      masters_.push_back(p.detach().clone());  // exact fp32 copy of the initialisation
      main_grads_.push_back(torch::zeros_like(masters_.back()));
      masters_.back().mutable_grad() = main_grads_.back();  // AdamW and clipping read the fp32 buffer
    }
  }
  // In place: Module::to keeps the parameter tensors (their data changes dtype), so the caller's model holds bf16.
  model.to(torch::kBFloat16);
  params_ = model.parameters();
  DLOCO_CHECK_EQ(params_.size(), masters_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    DLOCO_CHECK(params_[i].scalar_type() == torch::kBFloat16);
    auto accumulator = torch::autograd::impl::grad_accumulator(params_[i]);
    DLOCO_CHECK(accumulator != nullptr);
    accumulator->add_post_hook(std::make_unique<AccumulateIntoMainGrad>(params_[i], main_grads_[i]));
    grad_accumulators_.push_back(std::move(accumulator));
  }

  optimizer_ = make_inner_adamw(masters_, train);  // InnerTrainer's groups: decay on matrices only
}

Bf16Optimizer::~Bf16Optimizer() = default;

void Bf16Optimizer::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& g : main_grads_) g.zero_();
  for (auto& p : params_) p.mutable_grad().reset();
}

MixedStepResult Bf16Optimizer::step(double lr, double loss) {
  MixedStepResult r;
  // 1.–3. Norm, guard and clip on the fp32 gradients (clip_grad_norm_'s formula; max_norm = ∞ leaves them as is).
  const double max_norm = train_.grad_clip > 0 ? train_.grad_clip : std::numeric_limits<double>::infinity();
  r.grad_norm = torch::nn::utils::clip_grad_norm_(masters_, max_norm);
  if (!std::isfinite(loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;  // the guard, as InnerTrainer: no update, moments untouched
    zero_grad();
    return r;
  }
  // 4. AdamW on the fp32 masters (torch::optim::AdamW's own math: decoupled decay, bias-corrected moments).
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  optimizer_->step();
  ++steps_;
  // 5. Refresh the compute copy.
  refresh_model();
  return r;
}

void Bf16Optimizer::set_master(size_t i, const torch::Tensor& value) {
  DLOCO_CHECK_LT(i, masters_.size());
  if (value.sizes() != masters_[i].sizes()) throw InputError("bf16 master: a value of another shape");
  torch::NoGradGuard no_grad;
  masters_[i].copy_(value);
  params_[i].copy_(masters_[i]);  // round to nearest even, as refresh_model()
}

void Bf16Optimizer::save_state(const std::string& file) const {
  torch::serialize::OutputArchive archive;
  optimizer_->save(archive);
  archive.write("bf16_steps", torch::tensor({steps_}));
  archive.save_to(file);
}

void Bf16Optimizer::load_state(const std::string& file) {
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(file);
    optimizer_->load(archive);
    torch::Tensor steps;
    archive.read("bf16_steps", steps);
    steps_ = steps.item<int64_t>();
  } catch (const c10::Error& e) {
    throw InputError("cannot load the bf16 optimizer state '" + file + "': " + e.what_without_backtrace());
  }
}

void Bf16Optimizer::reset_state() {
  optimizer_ = make_inner_adamw(masters_, train_);
  steps_ = 0;
}

void Bf16Optimizer::refresh_model() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(masters_[i]);  // fp32 → bf16, round to nearest even
}

std::pair<torch::Tensor, torch::Tensor> Bf16Optimizer::moments(size_t i) const {
  DLOCO_CHECK_LT(i, masters_.size());
  auto it = optimizer_->state().find(c10::guts::to_string(masters_[i].unsafeGetTensorImpl()));
  if (it == optimizer_->state().end()) return {};  // no moments before the first step
  const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
  return {s.exp_avg(), s.exp_avg_sq()};
}

PrecisionMemory Bf16Optimizer::memory() const {
  PrecisionMemory m;
  for (size_t i = 0; i < params_.size(); ++i) {
    m.parameters += params_[i].numel();
    m.model_bytes += bytes_of(params_[i]);
    m.grad_bytes += bytes_of(main_grads_[i]) + bytes_of(params_[i].grad());
    m.master_bytes += bytes_of(masters_[i]);
  }
  for (size_t i = 0; i < masters_.size(); ++i) {
    const auto [m1, v1] = moments(i);
    m.m_bytes += bytes_of(m1);
    m.v_bytes += bytes_of(v1);
  }
  return m;
}

CpuAutocastBf16::CpuAutocastBf16()
    : was_enabled_(at::autocast::is_cpu_enabled()), previous_dtype_(at::autocast::get_autocast_cpu_dtype()) {
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
}

CpuAutocastBf16::~CpuAutocastBf16() {
  at::autocast::set_cpu_enabled(was_enabled_);
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  if (!was_enabled_) at::autocast::clear_cache();
}

}  // namespace dloco
