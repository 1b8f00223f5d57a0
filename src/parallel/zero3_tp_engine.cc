// ZeRO-3 × tensor parallelism (FSDP × TP, torchtitan's 2D layout; docs/parallel.md "ZeRO-3 × tensor parallelism"):
// R = t·d ranks, TP innermost (parallel/layout.h: rank = tp + t·dp). Rank (tp, dp) holds TP part tp of every unit
// (parallel/tp_gpt.h), sharded over the d ranks of its TP index (parallel/zero.h): no rank holds a whole layer
// between steps. DP index dp trains rows [dp·B/d, (dp+1)·B/d) of every window; the t ranks of one DP index the same
// rows. Built from a full GPT, or from the seed alone (sharded initialisation, parallel/sharded_init.h).
// Dimension letters: W windows, B sequences per window, T tokens, t TP degree, d DP degree.
#include "parallel/rank_engine_internal.h"
#include "parallel/sharded_init.h"
#include "parallel/tp_gpt.h"
#include "parallel/zero.h"

namespace dloco {

namespace {

using namespace rank_engine_detail;

class Zero3TensorParallelEngine final : public RankEngine {
 public:
  // `full`: the model to shard, or null for sharded initialisation from `seed`.
  Zero3TensorParallelEngine(const GPT* full, const ModelConfig& model, uint64_t seed, const ParallelConfig& parallel,
                            const TrainConfig& train, Collective& group, const std::filesystem::path& offload_dir)
      : train_(train), group_(group), t_(static_cast<int>(parallel.tensor)), d_(static_cast<int>(parallel.data)) {
    const int tp = group.rank() % t_;
    dp_index_ = group.rank() / t_;
    std::vector<int> tp_ranks, dp_ranks;
    for (int j = 0; j < t_; ++j) tp_ranks.push_back(j + t_ * dp_index_);
    for (int j = 0; j < d_; ++j) dp_ranks.push_back(tp + t_ * j);
    tp_comm_ = group.subgroup(tp_ranks, "tp");
    tp_group_ = std::make_unique<TensorParallelGroup>(*tp_comm_);
    dp_comm_ = group.subgroup(dp_ranks, "dp");
    const ZeroOptions o = zero_options(train, 3, parallel.offload ? offload_dir : std::filesystem::path(),
                                          parallel.precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat);
    sharded_init_ = full == nullptr;
    if (full != nullptr) {
      zero_ = std::make_unique<ZeroAdamW>(TensorParallelGPT(*full, *tp_group_), *tp_group_, *dp_comm_, o);
    } else {
      zero_ = make_sharded_zero3(model, seed, *tp_group_, *dp_comm_, o);
    }
  }

  EngineStep step(const torch::Tensor& windows, double lr) override {
    const int64_t W = windows.size(0), B = train_.batch_size, T = zero_->config().seq_len;
    const int64_t b = B / d_;  // rows per DP index
    zero_->set_lr(lr);
    auto loss_sum = torch::zeros({1}, torch::kDouble);  // Σ over windows of this DP index's mean loss
    for (int64_t w = 0; w < W; ++w) {
      auto [x, y] = window_batch(windows, w, B, T);
      auto loss = zero_->loss(x.narrow(0, dp_index_ * b, b), y.narrow(0, dp_index_ * b, b));  // equal over TP
      zero_->backward(loss / static_cast<double>(W));
      loss_sum += loss.detach().to(torch::kDouble);
    }
    dp_comm_->allreduce_sum(loss_sum);  // the mean over d equal shares is the whole batch's mean
    EngineStep r;
    r.loss = average_over_learners(replicas_, {}, loss_sum.item<double>() / static_cast<double>(W * d_));
    zero_->set_replicas(replicas_);
    const ZeroStepStats s = zero_->step(max_norm_of(train_), !std::isfinite(r.loss));
    r.grad_norm = s.grad_norm;
    r.skipped = s.skipped;
    return r;
  }

  torch::Tensor gather_parameter(const std::string& name) override {
    const auto local = zero_->gather_parameter(name, 0);  // its TP part, whole, on DP rank 0 (= DP index 0)
    if (dp_index_ != 0) return torch::Tensor();           // DP index 0's TP ranks assemble it
    auto full = gather_shards(local, tp_model().shard_spec(name), tp_model().full_size(name), *tp_group_);
    return group_.rank() == 0 ? full : torch::Tensor();
  }

  void set_parameter(const std::string& name, const torch::Tensor& full) override {
    const auto sizes = tp_model().full_size(name);  // throws InputError for an unknown name
    if (full.sizes().vec() != sizes) {
      throw InputError("parameter '" + name + "' has shape " + c10::str(at::IntArrayRef(sizes)) + ", the value " +
                       c10::str(full.sizes()));
    }
    zero_->set_parameter(name, shard_of(full, tp_model().shard_spec(name), tp_group_->rank(), t_));
  }

  void save_state(const std::filesystem::path& file) override { zero_->save_state(file.string()); }
  void load_state(const std::filesystem::path& file) override { zero_->load_state(file.string()); }
  void reset_state() override { zero_->reset_state(); }
  const ZeroAdamW* zero_optimizer() const override { return zero_.get(); }
  void set_step_timeout(double seconds) override {
    tp_comm_->set_timeout(seconds);
    dp_comm_->set_timeout(seconds);
  }
  // DP slices are disjoint; the TP ranks of one DP index hold the same slices of the replicated norm gains.
  std::string replica_mismatch() override {
    return first_replica_mismatch(zero_->replicated_slices(), tp_comm_.get(), "tensor-parallel ranks");
  }
  std::string describe() const override {
    return "ZeRO-3 × tensor t = " + std::to_string(t_) + " over d = " + std::to_string(d_) +
           (zero_->compute_dtype() == torch::kBFloat16 ? ", bf16" : "") +
           (sharded_init_ ? ", sharded initialisation" : "") + (zero_->offloaded() ? ", AdamW state offloaded" : "");
  }

 private:
  const TensorParallelGPTImpl& tp_model() const { return *zero_->tensor_parallel_model(); }  // split rules, shapes

  TrainConfig train_;
  Collective& group_;
  int t_, d_, dp_index_ = 0;
  bool sharded_init_ = false;
  std::unique_ptr<Collective> tp_comm_, dp_comm_;
  std::unique_ptr<TensorParallelGroup> tp_group_;
  std::unique_ptr<ZeroAdamW> zero_;
};

}  // namespace

std::unique_ptr<RankEngine> make_zero3_tp_engine(const GPT* full, const ModelConfig& model, uint64_t seed,
                                                 const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group, const std::filesystem::path& offload_dir) {
  return std::make_unique<Zero3TensorParallelEngine>(full, model, seed, parallel, train, group, offload_dir);
}

}  // namespace dloco
