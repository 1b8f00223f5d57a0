// The tensor half of fp16 dynamic loss scaling (the logic is parallel/loss_scaler.h): after backward of S·loss,
// find whether any gradient holds inf/NaN and divide every gradient by S. ATen's
// _amp_foreach_non_finite_check_and_unscale_ (what GradScaler.unscale_ calls) has no CPU kernel in LibTorch 1.13,
// so this is written here with plain tensor ops. Deliberately not here: the decision (LossScaler::update) and the
// all-reduce of the found flag across ranks (a caller with a Collective sums it).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace dloco {

/// Multiplies every defined gradient in place by inv_scale = 1/S and returns whether any element of any of them
/// (before scaling) was inf or NaN. Undefined tensors are skipped. Gradients of any float dtype and shape, on any
/// device. Throws InputError when inv_scale is not finite and positive.
bool non_finite_check_and_unscale(std::vector<torch::Tensor>& gradients, double inv_scale);

}  // namespace dloco
