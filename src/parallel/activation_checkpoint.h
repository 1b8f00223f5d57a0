// Activation checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; Megatron's and
// DeepSpeed's checkpoint function): a block runs forward without autograd, so none of its intermediate
// activations are kept; only its input (and, for a block that draws random numbers, the state it drew from) is.
// In backward that state is restored, the block is recomputed with autograd on, and the incoming gradient is back-propagated through the recomputed graph to
// the block's input and parameters. Costs one more forward of the block (~+33% compute of fwd + bwd) for the
// memory of its activations.
// Randomness. Ranks may be threads of one process (tests, a learner's group in-process), and the CPU generator
// torch::dropout draws from is process-global, so the checkpoint never swaps it unless it must:
//   (1) a block that draws from a generator it is given (checkpoint(..., generator)): the checkpoint keeps its own
//       copy of that generator from before the forward and recomputes from the copy. Nothing global is read or
//       written and no lock is taken: threads with generators of their own cannot disturb each other. The way
//       for dropout under checkpointing with ranks as threads;
//   (2) a block without one (checkpoint(block, x, parameters)): the global generator's state before the forward
//       is compared with the state after it. Unchanged (a block that draws nothing: every GPT block, the tensor-
//       parallel ones with their collectives included) means nothing is kept and backward neither reads nor
//       writes the generator, so other threads' draws are never disturbed. Changed means the block drew (or
//       another thread did meanwhile): the state is kept and swapped in around the recompute, which is exact in a
//       process where no other thread draws from the global generator at the same time, and races otherwise.
// No lock is held across a block in either way: a block may run collectives, and its peers may be threads of
// this process running the same block (a lock there deadlocks them).
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
/// A block that draws its random numbers (dropout masks: torch::bernoulli(p, generator), …) from `generator` only.
using CheckpointedRandomBlock = std::function<torch::Tensor(const torch::Tensor& x, at::Generator& generator)>;

/// Runs y = block(x) keeping only x for backward, and the global CPU generator's state from before the forward
/// (at::Generator::get_state) when the forward changed it. In backward: if a state was kept, saves the current
/// one, restores the kept one, recomputes block(x) with grad and puts the current state back (otherwise it just
/// recomputes); then computes d/dx and d/d(parameters) of ⟨y, grad_y⟩. See the top of this file for threads.
/// `parameters` are the tensors the block reads that need gradients (its module's parameters()); they receive
/// their gradients through autograd as if the block had run plainly. Outputs and gradients equal the plain block's bitwise when the block is
/// deterministic given the RNG state (same kernels, same order).
/// x: (B, T, C) float (any shape the block takes). Returns block(x). Throws InvariantError when x is undefined.
/// Outside grad mode (or when neither x nor a parameter requires grad) it simply runs block(x).
torch::Tensor checkpoint(const CheckpointedBlock& block, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& parameters);

/// The same for a block that draws from `generator` (a CPU generator this thread owns, e.g.
/// at::make_generator<at::CPUGeneratorImpl>(seed)): y = block(x, generator), advancing `generator` exactly as the
/// plain call would; the checkpoint keeps its own copy of the generator as it was before the forward and
/// recomputes from that copy in backward. Takes no lock and touches neither `generator` nor the global generator
/// in backward. Outputs and gradients equal the plain block's bitwise (same kernels, same order). Draws the block
/// makes from the global generator are not replayed. Throws InvariantError when x is undefined.
torch::Tensor checkpoint(const CheckpointedRandomBlock& block, const torch::Tensor& x,
                         const std::vector<torch::Tensor>& parameters, at::Generator generator);

}  // namespace dloco
