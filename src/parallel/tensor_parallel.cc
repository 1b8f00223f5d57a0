// Megatron's tensor-parallel operators and layers; see tensor_parallel.h. Dimension letters: B, T, N = B·T, C, V,
// t (the group's world), r (this rank).
#include "parallel/tensor_parallel.h"

#include <cstdint>
#include <vector>

#include "core/check.h"

namespace dloco {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

void TensorParallelGroup::count(TensorParallelCall call) {
  switch (call) {
    case TensorParallelCall::kF: ++counts_.f_backward; break;
    case TensorParallelCall::kG: ++counts_.g_forward; break;
    case TensorParallelCall::kCrossEntropy: ++counts_.cross_entropy; break;
    case TensorParallelCall::kGather: ++counts_.gather; break;
    case TensorParallelCall::kNorm: ++counts_.norm; break;
  }
}

void TensorParallelGroup::allreduce_sum(torch::Tensor tensor, TensorParallelCall call) {
  count(call);
  if (tensor.scalar_type() != torch::kBFloat16) return collective_->allreduce_sum(std::move(tensor));
  // Gloo 1.13 cannot all-reduce bf16 (docs/parallel.md): sum in fp32, round once.
  auto wide = tensor.to(torch::kFloat);
  collective_->allreduce_sum(wide);
  tensor.copy_(wide);
}

std::vector<torch::Tensor> TensorParallelGroup::all_gather(const torch::Tensor& local, TensorParallelCall call) {
  count(call);
  if (local.scalar_type() != torch::kBFloat16) return collective_->all_gather(local.contiguous());
  auto parts = collective_->all_gather(local.contiguous().view(torch::kHalf));  // copies only: bf16 as 2-byte words
  for (auto& part : parts) part = part.view(torch::kBFloat16);
  return parts;
}

torch::Tensor shard_of(const torch::Tensor& full, const ShardSpec& spec, int rank, int world) {
  torch::NoGradGuard no_grad;
  if (spec.replicated()) return full.detach().clone();
  DLOCO_CHECK_LT(spec.dim, full.dim());
  DLOCO_CHECK_GE(spec.blocks, 1);
  const int64_t size = full.size(spec.dim);
  if (size % (spec.blocks * world) != 0) {
    throw InputError("tensor parallelism: dimension " + std::to_string(spec.dim) + " of size " + std::to_string(size) +
                     " (" + std::to_string(spec.blocks) + " block(s)) cannot be split " + "evenly over " +
                     std::to_string(world) + " ranks; choose a degree that divides heads, " +
                     "the SwiGLU width and the vocabulary");
  }
  const int64_t block = size / spec.blocks, piece = block / world;
  std::vector<torch::Tensor> pieces;
  for (int64_t j = 0; j < spec.blocks; ++j)
    pieces.push_back(full.detach().narrow(spec.dim, j * block + rank * piece, piece));
  return torch::cat(pieces, spec.dim).contiguous();
}

torch::Tensor gather_shards(const torch::Tensor& local, const ShardSpec& spec, at::IntArrayRef full_sizes,
                            TensorParallelGroup& group) {
  torch::NoGradGuard no_grad;
  if (spec.replicated()) return local.detach().clone();
  const int64_t block = full_sizes[spec.dim] / spec.blocks, piece = block / group.world();
  DLOCO_CHECK_EQ(local.size(spec.dim), piece * spec.blocks);
  const auto from = group.all_gather(local.detach(), TensorParallelCall::kGather);  // t × local's shape
  // Block j of the full tensor is rank 0's j-th piece, then rank 1's, …, along dim (shard_of's order).
  std::vector<torch::Tensor> pieces;
  for (int64_t j = 0; j < spec.blocks; ++j) {
    for (const auto& rank_piece : from) pieces.push_back(rank_piece.narrow(spec.dim, j * piece, piece));
  }
  auto full = torch::cat(pieces, spec.dim);
  DLOCO_CHECK(full.sizes() == full_sizes);
  return full;
}

namespace {

// LibTorch's saved_data holds IValues; the group travels as its address in an int64. The group outlives the
// graph (documented on TensorParallelGroup).
int64_t handle_of(TensorParallelGroup& group) { return reinterpret_cast<intptr_t>(&group); }
TensorParallelGroup& group_at(int64_t handle) {
  return *reinterpret_cast<TensorParallelGroup*>(static_cast<intptr_t>(handle));
}
TensorParallelGroup& group_of(AutogradContext* ctx) { return group_at(ctx->saved_data["group"].toInt()); }

// f: identity forward, all-reduce backward.
struct CopyToTensorParallel : torch::autograd::Function<CopyToTensorParallel> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_output) {
    auto grad = grad_output[0].clone(torch::MemoryFormat::Contiguous);  // the all-reduce works in place
    group_of(ctx).allreduce_sum(grad, TensorParallelCall::kF);
    return {grad, torch::Tensor()};
  }
};

// g: all-reduce forward, identity backward.
struct ReduceFromTensorParallel : torch::autograd::Function<ReduceFromTensorParallel> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, int64_t group) {
    auto y = x.clone(torch::MemoryFormat::Contiguous);  // x stays intact: autograd may have saved it
    group_at(group).allreduce_sum(y, TensorParallelCall::kG);
    return y;
  }
  static tensor_list backward(AutogradContext*, tensor_list grad_output) { return {grad_output[0], torch::Tensor()}; }
};

// All-gather along the last dimension forward, this rank's columns of the gradient backward.
struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t group_handle) {
    ctx->saved_data["group"] = group_handle;
    auto& group = group_at(group_handle);
    return torch::cat(group.all_gather(x, TensorParallelCall::kGather), -1);  // t × (..., n) -> (..., t·n)
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_output) {
    auto& group = group_of(ctx);
    const int64_t n = grad_output[0].size(-1) / group.world();
    return {grad_output[0].narrow(-1, group.rank() * n, n), torch::Tensor()};
  }
};

// Megatron core's vocab-parallel cross-entropy, per token. logits (N, V/t), targets (N) -> (N).
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t group_handle) {
    auto& group = group_at(group_handle);
    const int64_t N = logits.size(0), Vt = logits.size(1), start = group.rank() * Vt;
    // 1. The maximum m_n over all V columns: each rank's row maxima in its row of a (t, N) zero tensor, summed.
    auto maxima = torch::zeros({group.world(), N}, logits.options());  // (t, N)
    maxima[group.rank()].copy_(std::get<0>(logits.max(1)));
    group.allreduce_sum(maxima, TensorParallelCall::kCrossEntropy);
    auto z = logits - std::get<0>(maxima.max(0)).unsqueeze(1);  // (N, V/t) z = logit − m
    // 2. The target logit z_n,target: held by the rank whose columns contain the target, 0 on the others.
    auto in_range = targets.ge(start).logical_and(targets.lt(start + Vt));         // (N) bool
    auto local_target = (targets - start).masked_fill(in_range.logical_not(), 0);  // (N) in [0, V/t)
    auto target_z = z.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill(in_range.logical_not(), 0.0);  // (N)
    group.allreduce_sum(target_z, TensorParallelCall::kCrossEntropy);
    // 3. The sum of exp over all V columns.
    auto exp_z = z.exp_();        // (N, V/t), in place: z is ours
    auto sum_exp = exp_z.sum(1);  // (N)
    group.allreduce_sum(sum_exp, TensorParallelCall::kCrossEntropy);
    auto loss = sum_exp.log() - target_z;                           // (N) nats
    ctx->saved_data["softmax"] = exp_z.div_(sum_exp.unsqueeze(1));  // (N, V/t); backward consumes it in place
    ctx->saved_data["local_target"] = local_target;
    ctx->saved_data["in_range"] = in_range;
    return loss;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_output) {
    auto grad = ctx->saved_data["softmax"].toTensor();                                  // (N, V/t)
    const auto local_target = ctx->saved_data["local_target"].toTensor().unsqueeze(1);  // (N, 1)
    const auto in_range = ctx->saved_data["in_range"].toTensor().unsqueeze(1);          // (N, 1)
    ctx->saved_data.clear();
    // softmax − one-hot(target), the one-hot only on the rank that holds the target's column.
    grad.scatter_add_(1, local_target, -in_range.to(grad.scalar_type()));
    grad.mul_(grad_output[0].unsqueeze(1));
    return {grad, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor copy_to_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group) {
  return CopyToTensorParallel::apply(x, handle_of(group));
}

torch::Tensor reduce_from_tensor_parallel(const torch::Tensor& x, TensorParallelGroup& group) {
  return ReduceFromTensorParallel::apply(x, handle_of(group));
}

torch::Tensor gather_last_dim(const torch::Tensor& x, TensorParallelGroup& group) {
  return GatherLastDim::apply(x, handle_of(group));
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup& group,
                                                   const ColumnParallelOptions& options)
    : group_(&group), options_(options) {
  weight = register_parameter("weight", shard_of(full->weight, shard_spec("weight"), group.rank(), group.world()));
  if (full->bias.defined()) {
    bias = register_parameter("bias", shard_of(full->bias, shard_spec("bias"), group.rank(), group.world()));
  }
}

ShardSpec ColumnParallelLinearImpl::shard_spec(const std::string& name) const {
  if (name == "weight" || name == "bias") return {0, options_.blocks};
  return {};
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  auto input = options_.copy_input ? copy_to_tensor_parallel(x, *group_) : x;  // (..., in)
  auto y = torch::linear(input, weight, bias);                                 // (..., out/t)
  return options_.gather_output ? gather_last_dim(y, *group_) : y;             // (..., out) or (..., out/t)
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::nn::Linear& full, TensorParallelGroup& group)
    : group_(&group) {
  weight = register_parameter("weight", shard_of(full->weight, shard_spec("weight"), group.rank(), group.world()));
  if (full->bias.defined()) bias = register_parameter("bias", full->bias.detach().clone());
}

ShardSpec RowParallelLinearImpl::shard_spec(const std::string& name) const {
  if (name == "weight") return {1, 1};
  return {};  // the bias is added after the reduction: replicated
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  auto y = reduce_from_tensor_parallel(torch::linear(x, weight), *group_);  // (..., out) = Σ_r X_r·A_rᵀ
  return bias.defined() ? y + bias : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::nn::Embedding& full, TensorParallelGroup& group)
    : group_(&group) {
  weight = register_parameter("weight", shard_of(full->weight, {0, 1}, group.rank(), group.world()));
  vocab_start_ = group.rank() * weight.size(0);
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& idx) {
  const int64_t Vt = weight.size(0);
  auto outside = idx.lt(vocab_start_).logical_or(idx.ge(vocab_start_ + Vt));            // (B, T) bool
  auto local = (idx - vocab_start_).masked_fill(outside, 0);                            // (B, T) in [0, V/t)
  auto rows = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);  // (B, T, C)
  return reduce_from_tensor_parallel(rows, *group_);                                    // (B, T, C)
}

torch::Tensor vocab_parallel_cross_entropy_per_token(const torch::Tensor& logits, const torch::Tensor& targets,
                                                     TensorParallelGroup& group) {
  DLOCO_CHECK_EQ(logits.dim(), 2);
  DLOCO_CHECK_EQ(targets.dim(), 1);
  DLOCO_CHECK_EQ(logits.size(0), targets.size(0));
  return VocabParallelCrossEntropy::apply(logits, targets, handle_of(group));
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           TensorParallelGroup& group) {
  return vocab_parallel_cross_entropy_per_token(logits, targets, group).mean();
}

}  // namespace dloco
