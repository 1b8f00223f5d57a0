// The tensor half of fp16 dynamic loss scaling (the logic is parallel/loss_scaler.h): after backward of S·loss,
// find whether any gradient holds inf/NaN and divide every gradient by S. ATen's
// _amp_foreach_non_finite_check_and_unscale_ (what GradScaler.unscale_ calls) has no CPU kernel in LibTorch 1.13,
// so this is written here with plain tensor ops. In a job of several ranks (data, tensor or pipeline parallel)
// the flag must be the group's, not the rank's: a rank that skips its step while another applies its own leaves
// the replicas (or the shards of one model) out of step, so the overload with a Collective agrees on it.
// Deliberately not here: the decision (LossScaler::update takes the flag this returns).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "collective/process_group.h"

namespace dloco {

/// Multiplies every defined gradient in place by inv_scale = 1/S and returns whether any element of any of them
/// (before scaling) was inf or NaN. Undefined tensors are skipped. Gradients of any float dtype and shape, on any
/// device. Throws InputError when inv_scale is not finite and positive.
bool non_finite_check_and_unscale(std::vector<torch::Tensor>& gradients, double inv_scale);

/// The same on every rank of `group`, then one all-reduce (sum) of a 1-element fp32 tensor, this rank's flag as
/// 0 or 1: returns true on every rank when any rank found inf/NaN, so all of them pass the same flag to
/// LossScaler::update and skip (or take) the step together. A collective: every rank of the group calls it, with
/// its own gradients, in the same order relative to its other collectives. Throws InputError as above (before
/// any communication: inv_scale is the same on every rank), CollectiveError when the all-reduce fails.
bool non_finite_check_and_unscale(std::vector<torch::Tensor>& gradients, double inv_scale, Collective& group);

}  // namespace dloco
