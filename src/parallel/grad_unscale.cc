// Non-finite check and unscale of gradients; see grad_unscale.h.
#include "parallel/grad_unscale.h"

#include <cmath>

#include "core/check.h"

namespace dloco {

bool non_finite_check_and_unscale(std::vector<torch::Tensor>& gradients, double inv_scale) {
  if (!std::isfinite(inv_scale) || inv_scale <= 0) {
    throw InputError("unscale needs a finite, positive 1/S (got " + std::to_string(inv_scale) + ")");
  }
  torch::NoGradGuard no_grad;
  bool found = false;
  for (auto& g : gradients) {
    if (!g.defined()) continue;
    // isfinite is false for ±inf and NaN; one reduction per tensor, read once as a bool.
    if (!found && !torch::isfinite(g).all().item<bool>()) found = true;
    g.mul_(inv_scale);
  }
  return found;
}

bool non_finite_check_and_unscale(std::vector<torch::Tensor>& gradients, double inv_scale, Collective& group) {
  const bool mine = non_finite_check_and_unscale(gradients, inv_scale);
  auto ranks_found = torch::full({1}, mine ? 1.0f : 0.0f);  // (1): after the sum, how many ranks found one
  group.allreduce_sum(ranks_found);
  return ranks_found.item<float>() > 0.0f;
}

}  // namespace dloco
