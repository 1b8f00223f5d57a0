// The pipeline-parallel (and pipeline × tensor-parallel) learner-group rank; see rank_engine.h. Dimension letters:
// W windows, B sequences per window, T tokens, p stages, t TP ranks per stage, m micro-batches.
#include <cmath>
#include <map>

#include "parallel/distributed_optimizer.h"
#include "parallel/pipeline_stage.h"
#include "parallel/rank_engine_internal.h"
#include "parallel/rank_fault.h"
#include "train/trainer.h"

namespace dloco {

namespace {

using namespace rank_engine_detail;

// pipeline = p × tensor = t × data = d (any of them 1): this rank's stage of its replica, rank
// g = tp + t·(dp + d·pp) (Megatron's order: TP ranks adjacent, pipeline outermost). Each window's B sequences are
// split over the d replicas; a replica runs one pipeline iteration of m micro-batches over the PP group of its TP
// index, and the replicas' gradients are averaged over the DP group: zero = 0 one all-reduce of the flat gradient
// and AdamW replicated on every replica; zero = 1 Megatron's distributed optimizer (parallel/distributed_optimizer.h:
// reduce-scatter, AdamW on this rank's slice, all-gather).
class PipelineEngine final : public RankEngine {
 public:
  PipelineEngine(GPT full, const ParallelConfig& parallel, const TrainConfig& train, Collective& group)
      : train_(train), group_(group), t_(static_cast<int>(parallel.tensor)), d_(static_cast<int>(parallel.data)) {
    const int p = static_cast<int>(parallel.pipeline), tp = group.rank() % t_, dp = (group.rank() / t_) % d_,
              pp = group.rank() / (t_ * d_);
    const auto rank_of = [&](int tp_, int dp_, int pp_) { return tp_ + t_ * (dp_ + d_ * pp_); };
    std::vector<int> tp_ranks, pp_ranks, dp_ranks;
    for (int j = 0; j < t_; ++j) tp_ranks.push_back(rank_of(j, dp, pp));
    for (int s = 0; s < p; ++s) pp_ranks.push_back(rank_of(tp, dp, s));
    for (int j = 0; j < d_; ++j) dp_ranks.push_back(rank_of(tp, j, pp));
    dp_index_ = dp;
    if (t_ > 1) {
      tp_comm_ = group.subgroup(tp_ranks, "tp");
      tp_group_ = std::make_unique<TensorParallelGroup>(*tp_comm_);
    }
    if (static_cast<int>(pp_ranks.size()) < group.world()) pp_comm_ = group.subgroup(pp_ranks, "pp");
    if (d_ > 1) dp_comm_ = group.subgroup(dp_ranks, "dp");
    stage_ = std::make_unique<PipelineStage>(
        full, PipelineStageOptions{pp, p, static_cast<int>(parallel.chunks), parallel.checkpoint_activations,
                                   tp_group_.get()});
    schedule_ = make_pipeline_schedule(PipelineScheduleSpec{
        parallel.schedule == PipelineScheduleChoice::kGPipe  ? PipelineScheduleKind::kGPipe
        : parallel.schedule == PipelineScheduleChoice::k1F1B ? PipelineScheduleKind::k1F1B
                                                             : PipelineScheduleKind::kInterleaved,
        p, static_cast<int>(parallel.micro_batches), static_cast<int>(parallel.chunks)});
    const int L = static_cast<int>(full->config().n_layer), K = p * static_cast<int>(parallel.chunks);
    for (int k = 0; k < K; ++k) {
      const auto [first, last] = virtual_stage_blocks(k, K, L);
      for (int i = first; i < last; ++i) block_owner_[i] = k % p;
    }
    for (const auto& item : full->named_parameters()) full_shapes_[item.key()] = item.value().sizes().vec();
    const bool bf16 = parallel.precision == Precision::kBf16;
    if (parallel.zero == 1 || bf16) {
      make_distributed_optimizer(parallel.zero == 1, bf16 ? torch::kBFloat16 : torch::kFloat);
      if (bf16) stage_->to_bf16();  // the rotary tables and the mask; the tensors were cast by the optimizer
    } else {
      adamw_ = make_inner_adamw(stage_->parameters(), train);
    }
  }

  EngineStep step(const torch::Tensor& windows, double lr) override {
    rank_fault_step(group_.rank());
    if (distributed_) return distributed_step(windows, lr);
    const int64_t W = windows.size(0);
    set_lr(*adamw_, lr);
    stage_->zero_grad();
    EngineStep r;
    auto params = stage_->parameters();
    // An iteration ends with the tied-embedding exchange, which adds the peer's whole .grad: each window's
    // gradients are therefore taken out of .grad before the next (else the first window's would be added twice).
    std::vector<torch::Tensor> sum(params.size());
    for (int64_t w = 0; w < W; ++w) {
      r.loss += run_window(windows, w) / static_cast<double>(W);
      if (W == 1) break;
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].grad().defined()) continue;
        sum[i] = sum[i].defined() ? sum[i].add_(params[i].grad()) : params[i].grad().clone();
      }
      stage_->zero_grad();
    }
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      if (W > 1 && sum[i].defined()) params[i].mutable_grad() = sum[i].div_(static_cast<double>(W));  // window mean
    }
    rank_fault_point("reduce");
    if (dp_comm_) r.loss = average_over_replicas(params, r.loss);
    r.loss = average_over_learners(replicas_, grads_of(params), r.loss);
    // ‖g‖² over the whole model: the owned parameters (not the tied head's copy of wte), a replicated one (norm
    // gains) counted on TP rank 0 only.
    auto square_sum = torch::zeros({1}, torch::kDouble);
    for (const auto& [name, q] : stage_->named_parameters()) {
      if (!q.grad().defined() || (stage_->shard_spec(name).replicated() && group_.rank() % t_ != 0)) continue;
      square_sum += q.grad().to(torch::kDouble).square().sum();
    }
    group_.allreduce_sum(square_sum);
    r.grad_norm = std::sqrt(square_sum.item<double>() / d_);  // every replica holds the same averaged gradient
    r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
    if (r.skipped) {
      stage_->zero_grad();
      return r;
    }
    if (const double coef = max_norm_of(train_) / (r.grad_norm + 1e-6); coef < 1) {
      for (auto& q : params) {
        if (q.grad().defined()) q.grad().mul_(coef);
      }
    }
    rank_fault_point("optimizer");
    adamw_->step();
    sync_tied_copy();
    return r;
  }

  torch::Tensor gather_parameter(const std::string& name) override {
    const int owner = owner_of(name), pp = group_.rank() / (t_ * d_);
    torch::Tensor local;
    if (pp == owner) {  // bf16: the fp32 master, which the d ranks of a sharded optimizer assemble first
      const auto held = stage_->named_parameters().at(name);
      local = held.scalar_type() == torch::kFloat
                  ? held.detach()
                  : distributed_->full_master(distributed_index_.at(held.unsafeGetTensorImpl()));
    }
    if (dp_index_ != 0) return torch::Tensor();  // replica 0 answers (the replicas are identical)
    torch::Tensor out;
    if (pp == owner) {  // the owner stage's t ranks assemble it; its TP rank 0 holds it then
      out = tp_group_ ? gather_shards(local, stage_->shard_spec(name), full_shapes_.at(name), *tp_group_)
                      : local.clone();
    }
    if (owner != 0) {
      constexpr int kGatherTag = 1 << 24;  // above every tag of an iteration (pipeline_stage.cc)
      const int holder = t_ * d_ * owner;  // (tp 0, dp 0, pp owner)
      if (group_.rank() == holder) group_.send(out, 0, kGatherTag);
      if (group_.rank() == 0) {
        out = torch::empty(full_shapes_.at(name));
        group_.recv(out, holder, kGatherTag);
      }
    }
    return group_.rank() == 0 ? out : torch::Tensor();
  }

  void set_parameter(const std::string& name, const torch::Tensor& full) override {
    (void)owner_of(name);  // throws for an unknown name
    const auto piece = [&](const ShardSpec& spec) {
      return tp_group_ ? shard_of(full, spec, tp_group_->rank(), t_) : full;
    };
    const auto write = [&](const torch::Tensor& target, const torch::Tensor& value) {
      if (!distributed_) return copy_checked(target, value, name);
      if (target.sizes() != value.sizes()) copy_checked(target, value, name);  // throws with both shapes
      distributed_->set_parameter(distributed_index_.at(target.unsafeGetTensorImpl()), value);
    };
    const auto params = stage_->named_parameters();
    if (const auto it = params.find(name); it != params.end()) write(it->second, piece(stage_->shard_spec(name)));
    if (name == "wte.weight" && stage_->tied_head().defined()) write(stage_->tied_head(), piece(ShardSpec{0, 1}));
  }

  void save_state(const std::filesystem::path& file) override {
    if (distributed_) return distributed_->save_state(file.string());
    save_adamw(*adamw_, file);
  }
  void load_state(const std::filesystem::path& file) override {
    if (distributed_) return distributed_->load_state(file.string());
    load_adamw(*adamw_, file);
  }
  void reset_state() override {
    if (distributed_) return distributed_->reset_state();
    adamw_ = make_inner_adamw(stage_->parameters(), train_);
  }
  const DistributedAdamW* distributed_optimizer() const override { return distributed_.get(); }
  void set_step_timeout(double seconds) override {
    for (auto* comm : {tp_comm_.get(), pp_comm_.get(), dp_comm_.get()}) {
      if (comm != nullptr) comm->set_timeout(seconds);
    }
  }
  std::string replica_mismatch() override {
    std::vector<std::pair<std::string, torch::Tensor>> held, whole;  // the stage's tensors; those TP ranks share
    for (const auto& [name, q] : stage_->named_parameters()) {
      held.emplace_back(name, q);
      if (stage_->shard_spec(name).replicated()) whole.emplace_back(name, q);
    }
    if (stage_->tied_head().defined()) held.emplace_back("the last stage's tied copy of wte.weight", stage_->tied_head());
    std::string found = first_replica_mismatch(held, dp_comm_.get(), "data-parallel replicas");
    const std::string across_tp = first_replica_mismatch(whole, tp_comm_.get(), "tensor-parallel ranks");
    const std::string tied = tied_copy_mismatch();
    return !found.empty() ? found : !across_tp.empty() ? across_tp : tied;
  }
  std::string describe() const override {
    return "pipeline p = " + std::to_string(schedule_.spec.stages) +
           (t_ > 1 ? " × tensor t = " + std::to_string(t_) : std::string()) +
           (d_ > 1 ? " × data d = " + std::to_string(d_) : std::string()) +
           (stage_->dtype() == torch::kBFloat16 ? ", bf16" : "") +
           (distributed_ && !replicated_ && d_ > 1 ? " + distributed optimizer (ZeRO-1)" : "") + " (" +
           to_string(schedule_.spec.kind) +
           ", m = " + std::to_string(schedule_.spec.micro_batches) + ", v = " + std::to_string(schedule_.spec.chunks) +
           (stage_->options().checkpoint_activations ? ", checkpointed" : "") + ")";
  }

 private:
  Collective& pipeline() { return pp_comm_ ? *pp_comm_ : group_; }

  // Tied embeddings over p > 1 stages: after an optimizer step the last stage's copy takes the first stage's wte
  // (send/recv between them, the same TP and DP index), where the copies could drift: their steps are the same math
  // on the same summed gradient, but a ring all-reduce over ≥ 3 replicas (d, or the dp baseline's learners) adds a
  // tensor at another offset of another buffer in another order, an ulp apart. Not needed (not sent) otherwise.
  void sync_tied_copy() {
    const int p = schedule_.spec.stages;
    const bool drift = d_ >= 3 || (replicas_ != nullptr && replicas_->world() >= 3);
    if (p == 1 || !stage_->config().tie_embeddings || !drift) return;
    constexpr int kTiedSyncTag = (1 << 24) + 2;  // above every tag of an iteration, gather_parameter and the check
    torch::NoGradGuard no_grad;
    if (stage_->first_stage()) {
      pipeline().send(stage_->embedding().detach().contiguous(), p - 1, kTiedSyncTag);
    } else if (stage_->last_stage()) {
      auto copy = torch::empty_like(stage_->tied_head());
      pipeline().recv(copy, 0, kTiedSyncTag);
      stage_->tied_head().detach().copy_(copy);
    }
  }

  // Tied embeddings over p > 1 stages: the first stage's wte and the last stage's copy (same TP and DP index) are
  // stepped separately, at different offsets of their DP groups' flat buffers; they must stay bitwise equal.
  // Their hashes are exchanged between the two stages: "" or what differs (on both stages).
  std::string tied_copy_mismatch() {
    const int p = schedule_.spec.stages;
    const bool first = stage_->first_stage();
    if (p == 1 || !stage_->config().tie_embeddings || !(first || stage_->last_stage())) return "";
    const auto bytes = (first ? stage_->embedding() : stage_->tied_head()).detach().cpu().contiguous();
    auto mine = torch::tensor(
        {static_cast<int64_t>(fnv1a64(std::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes())))},
        torch::kLong);
    auto theirs = torch::empty({1}, torch::kLong);
    constexpr int kTiedCheckTag = (1 << 24) + 1;  // above every tag of an iteration and of gather_parameter
    auto sent = pipeline().isend(mine, first ? p - 1 : 0, kTiedCheckTag);
    pipeline().recv(theirs, first ? p - 1 : 0, kTiedCheckTag);
    sent.wait();
    if (torch::equal(mine, theirs)) return "";
    const auto wte = static_cast<unsigned long long>((first ? mine : theirs).item<int64_t>());
    const auto copy = static_cast<unsigned long long>((first ? theirs : mine).item<int64_t>());
    char buf[160];
    std::snprintf(buf, sizeof(buf), "the tied embedding: stage 0's wte.weight hashes %016llx, the last stage's copy %016llx",
                  wte, copy);
    return buf;
  }

  // zero = 1 (or bf16): the stage's tensors (the tied copy of wte included, outside the norm) under the distributed
  // optimizer, sharded over the DP group or (`sharded` false: bf16 with zero = 0) replicated on every replica; a
  // replicated tensor (norm gains) counts in the norm on TP rank 0 only.
  void make_distributed_optimizer(bool sharded, torch::ScalarType compute) {
    std::map<const void*, std::string> names;
    for (const auto& [name, q] : stage_->named_parameters()) names[q.unsafeGetTensorImpl()] = name;
    std::vector<DistributedParameter> list;
    for (const auto& q : stage_->parameters()) {
      const auto it = names.find(q.unsafeGetTensorImpl());
      const bool counted = it != names.end() && (!stage_->shard_spec(it->second).replicated() || group_.rank() % t_ == 0);
      distributed_index_[q.unsafeGetTensorImpl()] = list.size();
      list.push_back({q, q.dim() >= 2, counted});
    }
    distributed_ =
        std::make_unique<DistributedAdamW>(std::move(list), sharded ? dp_comm_.get() : nullptr, train_, compute);
    replicated_ = !sharded && dp_comm_ != nullptr;
    if (compute == torch::kBFloat16) hook_main_grads();
  }

  // bf16: each micro-batch's gradient of a tensor goes into its fp32 main gradient as autograd forms it (Megatron's
  // main_grad accumulation), scaled by 1/W; the bf16 .grad only ever receives zeros. Not the tied pair (the first
  // stage's wte and the last stage's copy): the pipeline's exchange adds their .grad after backward, so those two
  // accumulate in bf16 .grad within a window and reach the main gradient after the exchange.
  void hook_main_grads() {
    const auto params = stage_->parameters();
    const bool tied = schedule_.spec.stages > 1 && stage_->config().tie_embeddings;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& q = params[i];
      if (tied && (q.is_same(stage_->embedding()) || q.is_same(stage_->tied_head()))) continue;
      torch::Tensor main = distributed_->main_grads()[i];
      q.register_hook([main, this](const torch::Tensor& g) {
        main.add_(g, window_scale_);
        return torch::zeros_like(g);
      });
    }
  }

  // One pipeline iteration over this replica's rows [dp·B/d, (dp+1)·B/d) of window w; returns its mean loss.
  double run_window(const torch::Tensor& windows, int64_t w) {
    const int64_t B = train_.batch_size, b = B / d_;
    const auto [x, y] = window_batch(windows, w, B, stage_->config().seq_len);
    return run_pipeline_iteration(*stage_, pipeline(), schedule_, x.narrow(0, dp_index_ * b, b),
                                  y.narrow(0, dp_index_ * b, b))
        .loss;
  }

  // One step under the distributed optimizer: each window's gradients go into the fp32 main gradients (so the
  // tied-embedding exchange's .grad never carries an earlier window), the loss is averaged over the replicas, the
  // gradient reduce-scattered over them, ‖g‖² summed over every rank's slice, then clip and AdamW on the slices.

  EngineStep distributed_step(const torch::Tensor& windows, double lr) {
    const int64_t W = windows.size(0);
    auto params = stage_->parameters();
    const auto& main = distributed_->main_grads();
    distributed_->zero_grad();
    stage_->zero_grad();
    window_scale_ = 1.0 / static_cast<double>(W);
    EngineStep r;
    for (int64_t w = 0; w < W; ++w) {
      r.loss += run_window(windows, w) / static_cast<double>(W);
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].grad().defined()) continue;
        main[i].add_(params[i].grad(), window_scale_);  // bf16: zeros, but for the tied pair (hook_main_grads)
        params[i].mutable_grad().reset();  // freed: only the main gradients persist between windows and steps
      }
    }
    rank_fault_point("reduce");
    if (dp_comm_) {
      auto loss = torch::tensor({r.loss}, torch::kDouble);
      dp_comm_->allreduce_sum(loss);
      r.loss = loss.item<double>() / d_;
    }
    r.loss = average_over_learners(replicas_, {}, r.loss);
    if (replicated_) distributed_->average_main_grads(*dp_comm_);
    auto square_sum = torch::tensor({distributed_->reduce_gradients(replicas_)}, torch::kDouble);
    group_.allreduce_sum(square_sum);  // sharded: the d slices of a (TP, PP) coordinate are disjoint; replicated:
                                       // every replica counted the whole gradient
    r.grad_norm = std::sqrt(square_sum.item<double>() / (replicated_ ? d_ : 1));
    r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
    if (r.skipped) {
      distributed_->drop_gradients();
      return r;
    }
    rank_fault_point("optimizer");
    distributed_->step(lr, std::min(1.0, max_norm_of(train_) / (r.grad_norm + 1e-6)));
    sync_tied_copy();
    return r;
  }

  // Plain data parallelism across the d replicas: one all-reduce over the DP group of every gradient, flattened,
  // and of the loss, then / d. Returns the mean loss.
  double average_over_replicas(std::vector<torch::Tensor>& params, double loss) {
    std::vector<torch::Tensor> parts;
    for (auto& q : params) parts.push_back(q.grad().defined() ? q.grad().reshape({-1}) : torch::zeros({q.numel()}));
    parts.push_back(torch::tensor({static_cast<float>(loss)}));
    auto flat = torch::cat(parts);  // (Ψ_stage + 1)
    parts.clear();
    dp_comm_->allreduce_sum(flat);
    flat.div_(d_);
    int64_t offset = 0;
    for (auto& q : params) {
      if (!q.grad().defined()) q.mutable_grad() = torch::zeros_like(q);
      q.grad().copy_(flat.narrow(0, offset, q.numel()).view_as(q));
      offset += q.numel();
    }
    return flat[offset].item<double>();
  }

  // The stage that owns parameter `name`: its block's virtual stage mod p; wte the first, ln_f and lm_head the last.
  int owner_of(const std::string& name) const {
    if (!full_shapes_.contains(name)) throw InputError("the model has no parameter '" + name + "'");
    if (name.rfind("h.", 0) == 0) return block_owner_.at(std::stoi(name.substr(2, name.find('.', 2) - 2)));
    return name == "wte.weight" ? 0 : schedule_.spec.stages - 1;
  }

  TrainConfig train_;
  Collective& group_;
  int t_, d_, dp_index_ = 0;
  std::unique_ptr<Collective> tp_comm_, pp_comm_, dp_comm_;  // this rank's TP, PP and DP sub-groups (when > 1 rank
                                                            // and not the whole group)
  std::unique_ptr<TensorParallelGroup> tp_group_;
  std::unique_ptr<PipelineStage> stage_;
  PipelineSchedule schedule_;
  std::map<int, int> block_owner_;  // block index -> stage
  std::map<std::string, std::vector<int64_t>> full_shapes_;
  std::unique_ptr<torch::optim::AdamW> adamw_;        // zero = 0
  std::unique_ptr<DistributedAdamW> distributed_;      // zero = 1
  std::map<const void*, size_t> distributed_index_;   // a stage tensor -> its index in distributed_
  bool replicated_ = false;  // distributed_ not sharded over the DP group (bf16, zero = 0): main gradients averaged
  double window_scale_ = 1;  // 1/W of the step running: what hook_main_grads scales a micro-batch's gradient by
};

}  // namespace

std::unique_ptr<RankEngine> make_pipeline_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group) {
  return std::make_unique<PipelineEngine>(full, parallel, train, group);
}

}  // namespace dloco
