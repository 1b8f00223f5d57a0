// The dp baseline's piece of the inner step (docs/protocol.md §11 "DP"), shared by the worker process
// and the tests.
#pragma once

#include "collective/process_group.h"
#include "model/gpt.h"
#include "train/trainer.h"

namespace dloco {

/// Gradient hook for InnerTrainer (set_gradient_hook): all-reduces every parameter's gradient and the loss as one
/// fp32 buffer and divides by M, so every worker clips, guards and steps on the same averaged numbers: the same
/// update as one process training on the M workers' batches together. `wait_s` and `syncs` (may be null)
/// accumulate the seconds spent in the all-reduce and the number of all-reduces. With `stop_votes` (may be null),
/// the all-reduce also carries this rank's vote (*stop_votes ≥ 1 = stop after this step) and leaves the sum of
/// every rank's vote there, so all ranks agree to stop after the same step. The hook throws CollectiveError
/// when a peer fails.
InnerTrainer::GradientHook dp_gradient_hook(GPT model, Collective& group, double* wait_s, int64_t* syncs,
                                            double* stop_votes = nullptr);

}  // namespace dloco
