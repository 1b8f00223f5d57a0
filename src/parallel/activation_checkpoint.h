// Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; Megatron's and
// DeepSpeed's checkpoint function): a block runs forward without autograd, so none of its intermediate
// activations are kept; only its input and the CPU RNG state are. In backward the RNG state is restored, the block
// is recomputed with autograd on, and the incoming gradient is back-propagated through the recomputed graph to
// the block's input and parameters. Costs one more forward of the block (~+33% compute of fwd + bwd) for the
// memory of its activations.
// Deliberately not here: CUDA RNG states (this build is CPU-only; a CUDA build must also save the device
// generator), blocks with several tensor inputs that need gradients (ours take one: the residual stream),
// non-reentrant (saved-tensor-hook) checkpointing, and the per-layer policy (the model or stage decides).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace dloco {

/// A block as a function of its one differentiable input: x (B, T, C) -> y (any shape). Everything else it reads
/// (rotary tables, masks) is captured; its parameters are passed to checkpoint() so gradients reach them.
/// backward calls it again, so it must capture by value whatever does not outlive the backward pass.
using CheckpointedBlock = std::function<torch::Tensor(const torch::Tensor&)>;

/// Runs y = block(x) keeping only x and the CPU generator's state for backward (at::Generator::get_state). In
/// backward: saves the current RNG state, restores the forward's, recomputes block(x) with grad, computes
/// d/dx and d/d(parameters) of ⟨y, grad_y⟩, and puts the RNG state back. `parameters` are the tensors the block
/// reads that need gradients (its module's parameters()); they receive their gradients through autograd as if
/// the block had run plainly. Outputs and gradients equal the plain block's bitwise when the block is
/// deterministic given the RNG state (same kernels, same order).
/// x: (B, T, C) float (any shape the block takes). Returns block(x). Throws InvariantError when x is undefined.
/// Outside grad mode (or when neither x nor a parameter requires grad) it simply runs block(x).
torch::Tensor checkpoint(const CheckpointedBlock& block, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& parameters);

}  // namespace dloco
