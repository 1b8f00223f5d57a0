// Pipeline stages of the GPT and the executor of one iteration; see pipeline_stage.h.
// Dimension letters: B, m, b = B/m, T, C, V; p stages, v chunks, K = p·v virtual stages, k virtual stage.
#include "parallel/pipeline_stage.h"

#include "core/check.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/rank_fault.h"

namespace dloco {

std::pair<int, int> virtual_stage_blocks(int k, int K, int L) {
  if (K < 1 || K > L) {
    throw InputError("a pipeline of " + std::to_string(K) + " virtual stages (stages × chunks) needs at least as " +
                     "many blocks, the model has n_layer = " + std::to_string(L));
  }
  DLOCO_CHECK(k >= 0 && k < K);
  const int base = L / K, extra = L % K;
  const int first = k * base + std::min(k, extra);
  return {first, first + base + (k < extra ? 1 : 0)};
}

namespace {
torch::Tensor copy_of(const torch::Tensor& t) { return t.detach().clone().requires_grad_(t.requires_grad()); }
}  // namespace

PipelineStage::PipelineStage(GPT& full, const PipelineStageOptions& options)
    : cfg_(full->config()), options_(options) {
  const int p = options.stages, s = options.stage, v = options.chunks;
  if (p < 1 || s < 0 || s >= p || v < 1) {
    throw InputError("pipeline stage " + std::to_string(s) + " of " + std::to_string(p) + " with " +
                     std::to_string(v) + " chunks: need 0 ≤ stage < stages and chunks ≥ 1");
  }
  torch::NoGradGuard no_grad;
  auto params = full->named_parameters();
  const int K = p * v, L = static_cast<int>(cfg_.n_layer);
  TensorParallelGroup* tp = options.tensor;
  // A parameter's piece on this rank: the whole of it, or its rows [r·V/t, (r+1)·V/t) with a TP group.
  const auto piece = [&](const std::string& name) {
    if (!tp) return copy_of(params[name]);
    specs_[name] = ShardSpec{0, 1};
    return shard_of(params[name], specs_[name], tp->rank(), tp->world()).requires_grad_(true);
  };
  chunks_.resize(v);
  tp_chunks_.resize(v);
  for (int c = 0; c < v; ++c) {
    const auto [first, last] = virtual_stage_blocks(c * p + s, K, L);
    for (int i = first; i < last; ++i) {
      if (tp) {
        TensorParallelBlock block(*full->h->ptr<BlockImpl>(static_cast<size_t>(i)), cfg_, *tp);
        for (const auto& module : block->named_modules("", /*include_self=*/false)) {
          const auto* sharded = dynamic_cast<const ShardedModule*>(module.value().get());
          for (const auto& q : module.value()->named_parameters(/*recurse=*/false)) {
            if (sharded && !sharded->shard_spec(q.key()).replicated()) {
              specs_["h." + std::to_string(i) + "." + module.key() + "." + q.key()] = sharded->shard_spec(q.key());
            }
          }
        }
        tp_chunks_[c].emplace_back(i, block);
        continue;
      }
      Block block(cfg_);
      for (auto& q : block->named_parameters()) q.value().copy_(params["h." + std::to_string(i) + "." + q.key()]);
      chunks_[c].emplace_back(i, block);
    }
  }
  if (first_stage()) {
    if (tp) {
      tp_wte_ = VocabParallelEmbedding(full->wte, *tp);
      wte_ = tp_wte_->weight;
      specs_["wte.weight"] = ShardSpec{0, 1};
    } else {
      wte_ = copy_of(params["wte.weight"]);
    }
  }
  if (last_stage()) {
    ln_f_ = RMSNorm(cfg_.d_model, cfg_.norm_eps);
    for (auto& q : ln_f_->parameters()) q.copy_(params["ln_f.weight"]);
    if (!cfg_.tie_embeddings) {
      head_ = piece("lm_head.weight");
    } else if (p == 1) {
      head_ = wte_;  // one tensor, as in the full model
    } else {
      tied_head_ = piece("wte.weight");
      head_ = tied_head_;
    }
  }
  auto buffers = full->named_buffers();
  cos_ = buffers["rope_cos"].clone();
  sin_ = buffers["rope_sin"].clone();
  causal_ = buffers["causal"].clone();
}

void PipelineStage::to_bf16() {
  torch::NoGradGuard no_grad;
  for (auto& q : parameters()) {  // in place: modules and aliases see it (an optimizer may have cast them already)
    if (q.scalar_type() != torch::kBFloat16) q.set_data(q.to(torch::kBFloat16));
  }
  cos_ = cos_.to(torch::kBFloat16);
  sin_ = sin_.to(torch::kBFloat16);
  causal_ = causal_.to(torch::kBFloat16);
}

std::vector<torch::Tensor> PipelineStage::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& chunk : chunks_) {
    for (const auto& [i, block] : chunk) {
      for (const auto& q : block->parameters()) out.push_back(q);
    }
  }
  for (const auto& chunk : tp_chunks_) {
    for (const auto& [i, block] : chunk) {
      for (const auto& q : block->parameters()) out.push_back(q);
    }
  }
  if (wte_.defined()) out.push_back(wte_);
  if (ln_f_) out.push_back(ln_f_->parameters()[0]);
  if (head_.defined() && !head_.is_same(wte_)) out.push_back(head_);
  return out;
}

std::map<std::string, torch::Tensor> PipelineStage::named_parameters() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& chunk : chunks_) {
    for (const auto& [i, block] : chunk) {
      for (const auto& q : block->named_parameters()) out["h." + std::to_string(i) + "." + q.key()] = q.value();
    }
  }
  for (const auto& chunk : tp_chunks_) {
    for (const auto& [i, block] : chunk) {
      for (const auto& q : block->named_parameters()) out["h." + std::to_string(i) + "." + q.key()] = q.value();
    }
  }
  if (wte_.defined()) out["wte.weight"] = wte_;
  if (ln_f_) out["ln_f.weight"] = ln_f_->parameters()[0];
  if (!cfg_.tie_embeddings && head_.defined()) out["lm_head.weight"] = head_;
  return out;
}

ShardSpec PipelineStage::shard_spec(const std::string& name) const {
  const auto it = specs_.find(name);
  return it == specs_.end() ? ShardSpec{} : it->second;
}

void PipelineStage::write_back(GPT& full) const {
  if (options_.tensor) throw InputError("write_back of a tensor-parallel stage: gather its shards first");
  torch::NoGradGuard no_grad;
  auto params = full->named_parameters();
  for (const auto& [name, tensor] : named_parameters()) params[name].copy_(tensor);
}

void PipelineStage::zero_grad() {
  for (auto& q : parameters()) {
    if (q.grad().defined()) q.mutable_grad().zero_();
  }
}

torch::Tensor PipelineStage::run_blocks(int chunk, torch::Tensor x) {
  const int64_t T = x.size(1);
  const auto cos = cos_.narrow(0, 0, T), sin = sin_.narrow(0, 0, T);   // (T, hs/2)
  const auto causal = causal_.narrow(0, 0, T).narrow(1, 0, T);          // (T, T)
  for (auto& [i, block] : tp_chunks_[chunk]) {
    if (options_.checkpoint_activations) {
      TensorParallelBlockImpl* impl = block.get();
      auto fn = [impl, cos, sin, causal](const torch::Tensor& in) { return impl->forward(in, cos, sin, causal); };
      x = checkpoint(fn, x, block->parameters());
    } else {
      x = block->forward(x, cos, sin, causal);
    }
  }
  for (auto& [i, block] : chunks_[chunk]) {
    if (options_.checkpoint_activations) {
      BlockImpl* impl = block.get();
      // By value: backward calls it again after this function has returned.
      auto fn = [impl, cos, sin, causal](const torch::Tensor& in) { return impl->forward(in, cos, sin, causal); };
      x = checkpoint(fn, x, block->parameters());
    } else {
      x = block->forward(x, cos, sin, causal);
    }
  }
  return x;  // (b, T, C)
}

torch::Tensor PipelineStage::forward_chunk(int chunk, const torch::Tensor& input, const torch::Tensor& targets) {
  const int p = options_.stages, K = p * options_.chunks, k = chunk * p + options_.stage;
  DLOCO_CHECK(chunk >= 0 && chunk < options_.chunks);
  TensorParallelGroup* tp = options_.tensor;
  auto x = k != 0 ? input : tp ? tp_wte_(input) : torch::embedding(wte_, input);  // (b, T, C), as nn::Embedding
  x = run_blocks(chunk, x);
  if (k != K - 1) return x;
  // The last virtual stage: ln_f, the head and the loss, as GPTImpl::forward / loss (or the TP GPT's) compute them.
  if (tp) {
    auto logits = torch::matmul(copy_to_tensor_parallel(ln_f_(x), *tp), head_.t());  // (b, T, V/t)
    return vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                        targets.reshape({-1}), *tp);
  }
  auto logits = torch::matmul(ln_f_(x), head_.t());  // (b, T, V)
  return cross_entropy(logits.view({-1, cfg_.vocab_size}).to(torch::kFloat), targets.reshape({-1}));  // fp32 loss
}

namespace {

// The messages of one iteration on one rank: activations and gradients to and from neighbouring virtual stages.
// Tags: activation into virtual stage k of micro-batch i: k·m + i; gradient into k: (K + k)·m + i; the tied
// gradient: 2·K·m. With p = 1 every virtual stage is on this rank and messages go through a local mailbox.
class StageLinks {
 public:
  StageLinks(Collective& group, int p, int m, torch::ScalarType dtype) : group_(group), p_(p), m_(m), dtype_(dtype) {}

  int activation_tag(int k, int i) const { return k * m_ + i; }
  int gradient_tag(int K, int k, int i) const { return (K + k) * m_ + i; }

  /// Sends t (b, T, C) to the rank of virtual stage k without waiting.
  void send(int k, int tag, const torch::Tensor& t) {
    const int dst = k % p_;
    auto data = t.detach().contiguous();
    if (dst == group_.rank()) {
      mailbox_[tag] = data;
    } else {
      in_flight_.push_back(group_.isend(data, dst, tag));
      keep_.push_back(data);
    }
  }
  /// Receives a tensor of `shape` from the rank of virtual stage k, blocking up to the group's deadline.
  torch::Tensor recv(int k, int tag, at::IntArrayRef shape) {
    const int src = k % p_;
    if (src == group_.rank()) {
      auto it = mailbox_.find(tag);
      if (it == mailbox_.end()) throw InputError("pipeline schedule reads a message of tag " + std::to_string(tag) +
                                                 " before this rank produced it (the order deadlocks)");
      auto t = it->second;
      mailbox_.erase(it);
      return t;
    }
    auto t = torch::empty(shape, dtype_);
    group_.recv(t, src, tag);
    return t;
  }
  /// Waits for every send of the iteration (their buffers may then be freed).
  void finish() {
    for (auto& pending : in_flight_) pending.wait();
    in_flight_.clear();
    keep_.clear();
  }

 private:
  Collective& group_;
  int p_, m_;
  torch::ScalarType dtype_;  // of the activations and their gradients: the stage's compute dtype
  std::map<int, torch::Tensor> mailbox_;
  std::vector<Collective::Pending> in_flight_;
  std::vector<torch::Tensor> keep_;  // the sent tensors, alive until finish()
};

void check_iteration(const PipelineStage& stage, const Collective& group, const PipelineSchedule& schedule,
                     const torch::Tensor& idx, const torch::Tensor& targets) {
  const auto& spec = schedule.spec;
  const auto& o = stage.options();
  if (spec.stages != o.stages || spec.chunks != o.chunks || group.world() != o.stages || group.rank() != o.stage) {
    throw InputError("pipeline schedule (p = " + std::to_string(spec.stages) + ", v = " +
                     std::to_string(spec.chunks) + ") and group (rank " + std::to_string(group.rank()) + " of " +
                     std::to_string(group.world()) + ") do not match stage " + std::to_string(o.stage) + " of " +
                     std::to_string(o.stages) + " with " + std::to_string(o.chunks) + " chunks");
  }
  if (idx.dim() != 2 || !idx.sizes().equals(targets.sizes()) || idx.size(0) % spec.micro_batches != 0) {
    throw InputError("pipeline batch: idx and targets must both be (B, T) with B a multiple of m = " +
                     std::to_string(spec.micro_batches));
  }
}

// Stage 0 and stage p − 1 add each other's gradient of the tied embedding: both end with wte.grad + head.grad.
void exchange_tied_gradient(PipelineStage& stage, Collective& group, int tag) {
  const int p = stage.options().stages;
  auto weight = stage.first_stage() ? stage.embedding() : stage.tied_head();  // (V, C)
  DLOCO_CHECK(weight.grad().defined());
  auto mine = weight.grad().clone();
  auto theirs = torch::empty_like(mine);
  const int peer = stage.first_stage() ? p - 1 : 0;
  auto sent = group.isend(mine, peer, tag);
  group.recv(theirs, peer, tag);
  sent.wait();
  weight.mutable_grad().add_(theirs);
}

}  // namespace

PipelineIterationStats run_pipeline_iteration(PipelineStage& stage, Collective& group,
                                              const PipelineSchedule& schedule, const torch::Tensor& idx,
                                              const torch::Tensor& targets) {
  validate_pipeline_schedule(schedule);
  check_iteration(stage, group, schedule, idx, targets);
  const int p = schedule.spec.stages, m = schedule.spec.micro_batches, v = schedule.spec.chunks, K = p * v;
  const int s = stage.options().stage;
  const int64_t b = idx.size(0) / m, T = idx.size(1), C = stage.config().d_model;
  const int64_t bytes_before = group.bytes_sent();
  StageLinks links(group, p, m, stage.dtype());
  // What a forward keeps for its backward: the received activation (a leaf whose .grad goes back upstream) and
  // the output (the activation sent downstream, or the micro-batch's loss / m on the last virtual stage).
  struct Stored {
    torch::Tensor input, output;
  };
  std::map<std::pair<int, int>, Stored> stored;  // by (micro-batch, chunk)
  PipelineIterationStats stats;
  double loss = 0;
  for (const auto& a : schedule.actions[s]) {
    const int k = a.chunk * p + s, i = a.micro_batch;
    const auto rows = [&](const torch::Tensor& t) { return t.narrow(0, i * b, b); };  // (b, T)
    if (a.forward()) {
      Stored st;
      if (k > 0) st.input = links.recv(k - 1, links.activation_tag(k, i), {b, T, C}).requires_grad_(true);
      rank_fault_point("forward");
      auto out = stage.forward_chunk(a.chunk, k == 0 ? rows(idx) : st.input, rows(targets));
      if (k == K - 1) {
        st.output = out / m;  // 1/m: the batch's mean over micro-batch means
        loss += st.output.item<double>();
      } else {
        links.send(k + 1, links.activation_tag(k + 1, i), out);  // (b, T, C)
        st.output = out;
      }
      stored[{i, a.chunk}] = st;
      stats.peak_stored_activations = std::max(stats.peak_stored_activations, static_cast<int>(stored.size()));
    } else {
      auto it = stored.find({i, a.chunk});
      DLOCO_CHECK(it != stored.end());  // validate_pipeline_schedule: a backward follows its forward
      Stored st = it->second;
      stored.erase(it);
      if (k == K - 1) {
        torch::autograd::backward({st.output});
      } else {
        auto grad = links.recv(k + 1, links.gradient_tag(K, k, i), {b, T, C});  // dL/d(output) (b, T, C)
        torch::autograd::backward({st.output}, {grad});
      }
      rank_fault_point("backward");  // the gradient formed, not yet sent
      if (k > 0) links.send(k - 1, links.gradient_tag(K, k - 1, i), st.input.grad());
    }
  }
  links.finish();
  if (p > 1 && stage.config().tie_embeddings && (stage.first_stage() || stage.last_stage())) {
    exchange_tied_gradient(stage, group, 2 * K * m);
  }
  auto loss_t = torch::tensor({loss}, torch::kDouble);
  if (p > 1) group.broadcast(loss_t, p - 1);
  stats.loss = loss_t.item<double>();
  stats.bytes_sent = group.bytes_sent() - bytes_before;
  return stats;
}

}  // namespace dloco
