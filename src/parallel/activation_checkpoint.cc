// Activation checkpointing; see activation_checkpoint.h.
#include "parallel/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/custom_class.h>

#include <mutex>

#include "core/check.h"

namespace dloco {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// What backward needs besides tensors: the block to recompute and the parameters to differentiate (the same
// tensors the block reads, so their gradients are the ones autograd routes to the outer graph's edges). Exactly
// one of block and random_block is set.
struct CheckpointedCall : torch::CustomClassHolder {
  CheckpointedBlock block;                // draws from the global generator
  CheckpointedRandomBlock random_block;   // draws from `generator`
  c10::optional<at::Generator> generator;  // the caller's (random_block's forward)
  c10::optional<at::Generator> replay;     // owned: a copy of `generator` from before the forward
  std::vector<torch::Tensor> parameters;
};

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}
void set_cpu_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // Runs with grad mode off (Function::apply turns it off): nothing inside the block is saved for backward.
  static torch::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<CheckpointedCall> call,
                               const torch::Tensor& x, at::TensorList /*parameters: graph edges only*/) {
    ctx->saved_data["x_requires_grad"] = x.requires_grad();
    ctx->save_for_backward({x});  // the block input: the only activation kept
    torch::Tensor y;
    if (call->random_block) {
      at::Generator& gen = *call->generator;
      {
        std::lock_guard<std::mutex> lock(gen.mutex());
        call->replay = gen.clone();
      }
      y = call->random_block(x, gen);
      call->generator.reset();  // backward needs only the copy
    } else {
      // Keep the state only when the block drew from it: a block that draws nothing (every GPT block) leaves the
      // global generator alone in backward, so threads of this process drawing from it are never disturbed.
      auto before = cpu_rng_state();
      y = call->block(x);
      if (!torch::equal(before, cpu_rng_state())) ctx->saved_data["rng"] = std::move(before);
    }
    ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
    return y;
  }

  // The block again, with grad, under the forward's random state.
  static torch::Tensor recompute(AutogradContext* ctx, CheckpointedCall& call, const torch::Tensor& x) {
    torch::AutoGradMode grad_on(true);
    if (call.random_block) return call.random_block(x, *call.replay);  // the owned copy: nobody else draws from it
    if (ctx->saved_data.count("rng") == 0) return call.block(x);        // it drew nothing in forward
    const auto now = cpu_rng_state();
    set_cpu_rng_state(ctx->saved_data["rng"].toTensor());
    auto y = call.block(x);
    set_cpu_rng_state(now);
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_output) {
    auto call = c10::static_intrusive_pointer_cast<CheckpointedCall>(ctx->saved_data["call"].toCapsule());
    const bool x_requires_grad = ctx->saved_data["x_requires_grad"].toBool();
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(x_requires_grad);
    // 1. Recompute under the forward's RNG state (dropout masks equal); the global generator is put back.
    const torch::Tensor y = recompute(ctx, *call, x);
    ctx->saved_data.clear();
    // 2. Back-propagate grad_y through the recomputed graph to x and the parameters that need gradients.
    std::vector<torch::Tensor> inputs;
    if (x_requires_grad) inputs.push_back(x);
    for (const auto& p : call->parameters) {
      if (p.requires_grad()) inputs.push_back(p);
    }
    tensor_list grads;
    if (!inputs.empty() && y.requires_grad()) {
      grads = torch::autograd::grad({y}, inputs, {grad_output[0]}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    }
    // 3. One gradient per apply() argument: none for the call, then x, then each parameter.
    tensor_list out{torch::Tensor()};
    size_t next = 0;
    out.push_back(x_requires_grad && !grads.empty() ? grads[next++] : torch::Tensor());
    for (const auto& p : call->parameters) {
      out.push_back(p.requires_grad() && !grads.empty() ? grads[next++] : torch::Tensor());
    }
    return out;
  }
};

}  // namespace

torch::Tensor checkpoint(const CheckpointedBlock& block, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& parameters) {
  DLOCO_CHECK(x.defined());
  bool needs_grad = x.requires_grad();
  for (const auto& p : parameters) needs_grad = needs_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return block(x);
  auto call = c10::make_intrusive<CheckpointedCall>();
  call->block = block;
  call->parameters = parameters;
  return CheckpointFunction::apply(std::move(call), x, at::TensorList(parameters));
}

torch::Tensor checkpoint(const CheckpointedRandomBlock& block, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& parameters, at::Generator generator) {
  DLOCO_CHECK(x.defined());
  DLOCO_CHECK(generator.defined());
  bool needs_grad = x.requires_grad();
  for (const auto& p : parameters) needs_grad = needs_grad || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return block(x, generator);
  auto call = c10::make_intrusive<CheckpointedCall>();
  call->random_block = block;
  call->generator = std::move(generator);
  call->parameters = parameters;
  return CheckpointFunction::apply(std::move(call), x, at::TensorList(parameters));
}

}  // namespace dloco
