// The whole model as one flat vector; see flat_model.h.
#include "collective/flat_model.h"

#include "core/check.h"

namespace dloco {

torch::Tensor flatten_parameters(GPT& model, bool grads) {
  std::vector<torch::Tensor> parts;
  for (auto& p : model->parameters()) {
    const auto& t = grads ? p.grad() : p;
    parts.push_back(t.defined() ? t.detach().reshape({-1}).to(torch::kCPU, torch::kFloat) : torch::zeros({p.numel()}));
  }
  return torch::cat(parts);
}

void unflatten_into(GPT& model, const torch::Tensor& flat, bool grads) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : model->parameters()) {
    DLOCO_CHECK_LE(offset + p.numel(), flat.numel());
    auto slice = flat.narrow(0, offset, p.numel()).view(p.sizes());
    if (grads) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      p.mutable_grad().copy_(slice);
    } else {
      p.copy_(slice);
    }
    offset += p.numel();
  }
}

}  // namespace dloco
