// The tensor- and data-parallel learner-group ranks and the factory; see rank_engine.h (the pipeline one is in
// pipeline_engine.cc). Dimension letters: W windows (train.grad_accum), B sequences per window, T tokens, d
// data-parallel ranks.
#include "parallel/rank_engine.h"

#include <cmath>
#include <limits>
#include <map>

#include "collective/flat_model.h"
#include "core/check.h"
#include "parallel/mixed_precision.h"
#include "parallel/rank_engine_internal.h"
#include "parallel/sharded_init.h"
#include "parallel/tp_gpt.h"
#include "parallel/zero.h"
#include "train/trainer.h"

namespace dloco {

namespace {

using namespace rank_engine_detail;

// tensor = t: every rank holds its shards; the step is TensorParallelGPT's loss, backward, its global-norm clip.
class TensorParallelEngine final : public RankEngine {
 public:
  TensorParallelEngine(GPT full, const TrainConfig& train, Collective& group)
      : train_(train), group_(group), tp_group_(group), model_(full, tp_group_) {
    for (const auto& item : full->named_parameters()) full_shapes_[item.key()] = item.value().sizes().vec();
    adamw_ = make_inner_adamw(model_->parameters(), train);
  }

  EngineStep step(const torch::Tensor& windows, double lr) override {
    const int64_t W = windows.size(0), B = train_.batch_size, T = model_->config().seq_len;
    set_lr(*adamw_, lr);
    adamw_->zero_grad();
    EngineStep r;
    for (int64_t w = 0; w < W; ++w) {
      const auto [x, y] = window_batch(windows, w, B, T);
      auto loss = model_->loss(x, y);  // the same on every rank (vocab-parallel cross-entropy)
      (loss / static_cast<double>(W)).backward();
      r.loss += loss.item<double>() / static_cast<double>(W);
    }
    r.loss = average_over_learners(replicas_, grads_of(model_->parameters()), r.loss);
    r.grad_norm = model_->clip_grad_norm(max_norm_of(train_));
    guard_and_step(*adamw_, r);
    return r;
  }

  torch::Tensor gather_parameter(const std::string& name) override {
    auto full = gather_shards(local(name), model_->shard_spec(name), full_shapes_.at(name), tp_group_);
    return group_.rank() == 0 ? full : torch::Tensor();
  }

  void set_parameter(const std::string& name, const torch::Tensor& full) override {
    copy_checked(local(name), shard_of(full, model_->shard_spec(name), group_.rank(), group_.world()), name);
  }

  void save_state(const std::filesystem::path& file) override { save_adamw(*adamw_, file); }
  void load_state(const std::filesystem::path& file) override { load_adamw(*adamw_, file); }
  void reset_state() override { adamw_ = make_inner_adamw(model_->parameters(), train_); }
  std::string describe() const override { return "tensor-parallel t = " + std::to_string(group_.world()); }
  std::string replica_mismatch() override {  // the tensors every TP rank holds whole (norm gains)
    std::vector<std::pair<std::string, torch::Tensor>> whole;
    for (const auto& item : model_->named_parameters()) {
      if (model_->shard_spec(item.key()).replicated()) whole.emplace_back(item.key(), item.value());
    }
    return first_replica_mismatch(whole, &group_, "tensor-parallel ranks");
  }

 private:
  torch::Tensor local(const std::string& name) {
    auto params = model_->named_parameters();
    if (!params.contains(name)) throw InputError("the tensor-parallel model has no parameter '" + name + "'");
    return params[name];
  }

  TrainConfig train_;
  Collective& group_;
  TensorParallelGroup tp_group_;
  TensorParallelGPT model_;
  std::map<std::string, std::vector<int64_t>> full_shapes_;
  std::unique_ptr<torch::optim::AdamW> adamw_;
};

// data = d: rank r trains rows [r·B/d, (r+1)·B/d) of every window. zero = 0: a replica and AdamW per rank, the
// flat gradient all-reduced and averaged; zero ≥ 1: ZeroAdamW.
class DataParallelEngine final : public RankEngine {
 public:
  DataParallelEngine(GPT full, int zero, const TrainConfig& train, Collective& group,
                     const std::filesystem::path& offload_dir, torch::ScalarType compute_dtype)
      : train_(train), group_(group), model_(full) {
    if (zero == 0) {
      adamw_ = make_inner_adamw(model_->parameters(), train);
    } else {
      zero_ = std::make_unique<ZeroAdamW>(model_, group, zero_options(train, zero, offload_dir, compute_dtype));
    }
  }

  EngineStep step(const torch::Tensor& windows, double lr) override {
    const int64_t W = windows.size(0), B = train_.batch_size, T = model_->config().seq_len;
    const int64_t b = B / group_.world();  // rows per rank
    if (adamw_) {
      set_lr(*adamw_, lr);
      adamw_->zero_grad();
    } else {
      zero_->set_lr(lr);
    }
    auto loss_sum = torch::zeros({1}, torch::kDouble);  // Σ over windows of this rank's mean loss
    for (int64_t w = 0; w < W; ++w) {
      auto [x, y] = window_batch(windows, w, B, T);
      x = x.narrow(0, group_.rank() * b, b);  // (b, T)
      y = y.narrow(0, group_.rank() * b, b);  // (b, T)
      auto loss = adamw_ ? model_->loss(x, y) : zero_->loss(x, y);
      auto scaled = loss / static_cast<double>(W);
      if (adamw_) {
        scaled.backward();
      } else {
        zero_->backward(scaled);
      }
      loss_sum += loss.detach().to(torch::kDouble);
    }
    group_.allreduce_sum(loss_sum);  // the mean over d equal shares is the whole batch's mean
    EngineStep r;
    r.loss = loss_sum.item<double>() / static_cast<double>(W * group_.world());
    if (zero_) {
      r.loss = average_over_learners(replicas_, {}, r.loss);  // the gradient slices: inside ZeroAdamW::step
      zero_->set_replicas(replicas_);
      const ZeroStepStats s = zero_->step(max_norm_of(train_), !std::isfinite(r.loss));
      r.grad_norm = s.grad_norm;
      r.skipped = s.skipped;
      return r;
    }
    average_gradients();
    r.loss = average_over_learners(replicas_, grads_of(model_->parameters()), r.loss);
    r.grad_norm = torch::nn::utils::clip_grad_norm_(model_->parameters(), max_norm_of(train_));
    guard_and_step(*adamw_, r);
    return r;
  }

  torch::Tensor gather_parameter(const std::string& name) override {
    if (zero_) return zero_->gather_parameter(name, 0);
    return group_.rank() == 0 ? local(name).detach().clone() : torch::Tensor();
  }

  void set_parameter(const std::string& name, const torch::Tensor& full) override {
    if (zero_) {
      zero_->set_parameter(name, full);
    } else {
      copy_checked(local(name), full, name);
    }
  }

  void save_state(const std::filesystem::path& file) override {
    if (zero_) {
      zero_->save_state(file.string());
    } else {
      save_adamw(*adamw_, file);
    }
  }
  void load_state(const std::filesystem::path& file) override {
    if (zero_) {
      zero_->load_state(file.string());
    } else {
      load_adamw(*adamw_, file);
    }
  }
  void reset_state() override {
    if (zero_) {
      zero_->reset_state();
    } else {
      adamw_ = make_inner_adamw(model_->parameters(), train_);
    }
  }
  const ZeroAdamW* zero_optimizer() const override { return zero_.get(); }
  std::string replica_mismatch() override {  // ZeRO-3 holds disjoint slices: nothing replicated
    if (zero_ && zero_->stage() == 3) return "";
    std::vector<std::pair<std::string, torch::Tensor>> held;
    for (const auto& item : model_->named_parameters()) held.emplace_back(item.key(), item.value());
    return first_replica_mismatch(held, &group_, "data-parallel replicas");
  }
  std::string describe() const override {
    return (zero_ ? "ZeRO-" + std::to_string(zero_->stage()) : std::string("data-parallel")) + " over d = " +
           std::to_string(group_.world()) + (zero_ && zero_->compute_dtype() == torch::kBFloat16 ? ", bf16" : "") +
           (zero_ && zero_->offloaded() ? ", AdamW state offloaded" : "");
  }

 private:
  torch::Tensor local(const std::string& name) {
    auto params = model_->named_parameters();
    if (!params.contains(name)) throw InputError("the model has no parameter '" + name + "'");
    return params[name];
  }

  // Plain data parallelism: one all-reduce of every gradient, flattened (collective/flat_model.h, as the dp
  // baseline does), then / d.
  void average_gradients() {
    auto flat = flatten_parameters(model_, /*grads=*/true);  // (Ψ)
    group_.allreduce_sum(flat);
    flat.div_(group_.world());
    unflatten_into(model_, flat, /*grads=*/true);
  }

  TrainConfig train_;
  Collective& group_;
  GPT model_;
  std::unique_ptr<torch::optim::AdamW> adamw_;  // zero = 0
  std::unique_ptr<ZeroAdamW> zero_;             // zero ≥ 1
};

// data = d (≥ 1) in bf16 (parallel/mixed_precision.h): a bf16 replica per rank computes forward and backward;
// its fp32 gradients (main_grads) are all-reduced and averaged in fp32 (Gloo cannot all-reduce bf16), and the
// fp32 masters take the AdamW step (clipping and the guard in Bf16Optimizer::step). Fragments read and write the
// masters; a write also rounds into the bf16 copy.
class Bf16DataParallelEngine final : public RankEngine {
 public:
  Bf16DataParallelEngine(GPT full, const TrainConfig& train, Collective& group)
      : train_(train), group_(group), model_(full), optimizer_(*model_, train) {
    size_t i = 0;
    for (const auto& item : model_->named_parameters()) index_[item.key()] = i++;
  }

  EngineStep step(const torch::Tensor& windows, double lr) override {
    const int64_t W = windows.size(0), B = train_.batch_size, T = model_->config().seq_len;
    const int64_t b = B / group_.world();  // rows per rank
    optimizer_.zero_grad();
    auto loss_sum = torch::zeros({1}, torch::kDouble);  // Σ over windows of this rank's mean loss (fp32 loss)
    for (int64_t w = 0; w < W; ++w) {
      auto [x, y] = window_batch(windows, w, B, T);
      auto loss = model_->loss(x.narrow(0, group_.rank() * b, b), y.narrow(0, group_.rank() * b, b));
      (loss / static_cast<double>(W)).backward();
      loss_sum += loss.detach().to(torch::kDouble);
    }
    if (group_.world() > 1) {  // one all-reduce of the flat fp32 gradient, then / d
      torch::NoGradGuard no_grad;
      const auto& grads = optimizer_.main_grads();
      std::vector<torch::Tensor> flat_parts;
      for (const auto& g : grads) flat_parts.push_back(g.reshape({-1}));
      auto flat = torch::cat(flat_parts);  // (Ψ)
      flat_parts.clear();
      auto loss_and_flat = torch::cat({flat, loss_sum.to(torch::kFloat)});  // the loss rides along
      group_.allreduce_sum(loss_and_flat);
      loss_and_flat.div_(group_.world());
      int64_t offset = 0;
      for (const auto& g : grads) {
        g.copy_(loss_and_flat.narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
      loss_sum = loss_and_flat.narrow(0, offset, 1).to(torch::kDouble) * group_.world();
    }
    EngineStep r;
    r.loss = loss_sum.item<double>() / static_cast<double>(W * group_.world());
    r.loss = average_over_learners(replicas_, optimizer_.main_grads(), r.loss);
    const MixedStepResult s = optimizer_.step(lr, r.loss);
    r.grad_norm = s.grad_norm;
    r.skipped = s.skipped;
    return r;
  }

  torch::Tensor gather_parameter(const std::string& name) override {
    return group_.rank() == 0 ? optimizer_.masters().at(index(name)).detach().clone() : torch::Tensor();
  }
  void set_parameter(const std::string& name, const torch::Tensor& full) override {
    optimizer_.set_master(index(name), full);
  }
  void save_state(const std::filesystem::path& file) override { optimizer_.save_state(file.string()); }
  void load_state(const std::filesystem::path& file) override { optimizer_.load_state(file.string()); }
  void reset_state() override { optimizer_.reset_state(); }
  std::string describe() const override { return "bf16 data-parallel over d = " + std::to_string(group_.world()); }
  std::string replica_mismatch() override {  // the fp32 masters (the bf16 copy is their rounding)
    std::vector<std::pair<std::string, torch::Tensor>> held;
    for (const auto& [name, i] : index_) held.emplace_back(name, optimizer_.masters().at(i));
    return first_replica_mismatch(held, &group_, "bf16 data-parallel replicas");
  }

 private:
  size_t index(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) throw InputError("the model has no parameter '" + name + "'");
    return it->second;
  }

  TrainConfig train_;
  Collective& group_;
  GPT model_;
  Bf16Optimizer optimizer_;
  std::map<std::string, size_t> index_;  // parameter name -> position in masters()
};

// ZeRO-3 × TP (zero3_tp_engine.cc): the kind that can initialise its slices from the seed.
bool is_zero3_tp(const ParallelConfig& parallel) {
  return parallel.zero == 3 && parallel.tensor > 1 && parallel.pipeline == 1 && !parallel.skippipe();
}

// What both factories check before they build anything: the group's size, offload's folder.
void check_group(const ParallelConfig& parallel, const Collective& group, const std::filesystem::path& offload_dir) {
  if (group.world() != parallel.ranks()) {
    throw InputError("a group of " + std::to_string(parallel.ranks()) + " ranks (tensor · pipeline · data) over a " +
                     "collective of " + std::to_string(group.world()));
  }
  if (parallel.offload && (parallel.zero == 0 || offload_dir.empty())) {
    throw InputError("offload keeps ZeRO's sharded AdamW state in files: it needs zero ≥ 1 and a folder");
  }
}

}  // namespace

std::unique_ptr<RankEngine> make_rank_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                             Collective& group, const std::filesystem::path& offload_dir) {
  check_group(parallel, group, offload_dir);
  if (parallel.skippipe()) {
    throw InputError("a SkipPipe group (parallel.skippipe_schedule) has its own engine: skippipe/engine.h "
                     "(learner/group_engine.h picks it)");
  }
  const bool zero3_tp = is_zero3_tp(parallel);
  if ((parallel.tensor > 1 || parallel.pipeline > 1) && parallel.offload && !zero3_tp) {
    throw InputError("offload runs in ZeRO groups without pipeline parallelism only for now (zero ≥ 1 with "
                     "tensor = pipeline = 1, or zero = 3 with tensor > 1)");
  }
  if (parallel.pipeline > 1 && parallel.zero > 1) {
    throw InputError("ZeRO-" + std::to_string(parallel.zero) + " with pipeline parallelism is not built (DeepSpeed "
                     "refuses it too: a stage's gradients accumulate over micro-batches): zero = 1 or 0");
  }
  if (parallel.tensor > 1 && parallel.zero == 2) {
    throw InputError("ZeRO-2 with tensor parallelism is not built: zero = 3 (FSDP × TP), 1 (the distributed "
                     "optimizer) or 0");
  }
  if (zero3_tp) return make_zero3_tp_engine(&full, full->config(), 0, parallel, train, group, offload_dir);
  const bool bf16 = parallel.precision == Precision::kBf16;
  if (bf16 && parallel.zero == 0 && parallel.tensor == 1 && parallel.pipeline == 1) {
    return std::make_unique<Bf16DataParallelEngine>(full, train, group);
  }
  if (bf16 && parallel.zero == 2) throw InputError("bf16 with ZeRO-2 is not built: zero = 1 or 3");
  if (parallel.pipeline > 1 || (parallel.tensor > 1 && parallel.data > 1) || (bf16 && parallel.zero == 1)) {
    // bf16: bf16 stages and fp32 masters, sharded at zero = 1 (Megatron's distributed optimizer, also for p = t = 1)
    return make_pipeline_engine(full, parallel, train, group);
  }
  if (parallel.tensor > 1) return std::make_unique<TensorParallelEngine>(full, train, group);
  return std::make_unique<DataParallelEngine>(full, static_cast<int>(parallel.zero), train, group,
                                              parallel.offload ? offload_dir : std::filesystem::path(),
                                              bf16 ? torch::kBFloat16 : torch::kFloat);
}

std::unique_ptr<RankEngine> make_rank_engine(const ModelConfig& model, uint64_t seed, const ParallelConfig& parallel,
                                             const TrainConfig& train, Collective& group,
                                             const std::filesystem::path& offload_dir) {
  check_group(parallel, group, offload_dir);  // before any model is built
  if (is_zero3_tp(parallel)) return make_zero3_tp_engine(nullptr, model, seed, parallel, train, group, offload_dir);
  return make_rank_engine(seeded_gpt(model, seed), parallel, train, group, offload_dir);
}

}  // namespace dloco
