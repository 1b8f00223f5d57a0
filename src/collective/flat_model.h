// The whole model as one flat fp32 vector (model->parameters() order), for the baselines' whole-model collectives:
// dp's gradient all-reduce, diloco's outer sync, the initial broadcast. No fragments, no layout.
#pragma once

#include <torch/torch.h>

#include "model/gpt.h"

namespace dloco {

/// All parameters (or, with grads, their gradients; zeros where undefined) as one new (N) fp32 CPU tensor,
/// N = Σ numel, in model->parameters() order.
torch::Tensor flatten_parameters(GPT& model, bool grads);

/// The inverse of flatten_parameters: copies `flat` (N) back into the parameters (or their gradients, allocated
/// when undefined) in place, under NoGradGuard. InvariantError when flat has fewer than N elements.
void unflatten_into(GPT& model, const torch::Tensor& flat, bool grads);

}  // namespace dloco
