// Inner steps and evaluation; see trainer.h. Dimension letters: B batch, T sequence length.
#include "train/trainer.h"

#include <cmath>
#include <map>

#include "core/check.h"
#include "model/stages.h"

namespace dloco {

InnerTrainer::InnerTrainer(GPT model, const TrainConfig& train, LrSchedule schedule, torch::Device device)
    : model_(std::move(model)), train_(train), schedule_(schedule), device_(device) {
  optimizer_ = make_inner_adamw(model_->parameters(), train);
  const int64_t T = model_->config().seq_len;
  window_ = torch::empty({window_tokens(train.batch_size, T)}, torch::kLong);
}

StepResult InnerTrainer::step(DataStream& stream, int64_t step) {
  const int64_t B = train_.batch_size, T = model_->config().seq_len;
  StepResult r;
  r.lr = schedule_.at(step);
  for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(r.lr);

  model_->train();
  optimizer_->zero_grad();
  last_paths_.clear();
  std::vector<std::vector<bool>> masks;  // per micro-batch: its path's active blocks
  const bool full_depth = skip_.full_depth_every > 0 && (step + 1) % skip_.full_depth_every == 0;
  if (skip_.stages > 0 && !full_depth) {
    // splitmix64 of (seed, step): the paths depend on nothing else, so a resumed run draws the same ones.
    uint64_t z = skip_seed_ + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    std::mt19937_64 rng(z ^ (z >> 31));
    last_paths_ =
        path_source_ ? path_source_(step) : balanced_stage_paths(skip_.stages, skip_.skip, train_.grad_accum, rng);
    DLOCO_CHECK_EQ(static_cast<int64_t>(last_paths_.size()), train_.grad_accum);
    // Every mask before the first micro-batch: a bad path throws (InputError) before the stream or a gradient moves.
    for (const auto& path : last_paths_) masks.push_back(stage_blocks(model_->config().n_layer, skip_.stages, path));
  }
  struct FullDepthAgain {  // also when a micro-batch throws
    GPT& model;
    ~FullDepthAgain() { model->set_active_blocks({}); }
  } full_depth_again{model_};
  double loss_sum = 0;
  for (int64_t micro = 0; micro < train_.grad_accum; ++micro) {
    if (!masks.empty()) model_->set_active_blocks(masks[static_cast<size_t>(micro)]);
    stream.next(std::span<int64_t>(window_.data_ptr<int64_t>(), static_cast<size_t>(window_.numel())));
    auto on_device = window_.to(device_);
    const auto [x, y] = window_batch(on_device, B, T);  // (B, T) inputs and targets
    auto loss = model_->loss(x, y);
    (loss / static_cast<double>(train_.grad_accum)).backward();
    loss_sum += loss.item<double>();
    r.tokens += B * T;
  }
  r.loss = loss_sum / static_cast<double>(train_.grad_accum);
  if (!last_paths_.empty()) average_stage_gradients(last_paths_);
  if (gradient_hook_) r.loss = gradient_hook_(r.loss);

  const double max_norm = train_.grad_clip > 0 ? train_.grad_clip : std::numeric_limits<double>::infinity();
  r.grad_norm = torch::nn::utils::clip_grad_norm_(model_->parameters(), max_norm);
  if (!std::isfinite(r.loss) || !std::isfinite(r.grad_norm)) {
    r.skipped = true;  // the guard: no update, moments untouched
    optimizer_->zero_grad();
    return r;
  }
  optimizer_->step();
  return r;
}

void InnerTrainer::set_skip(const SkipConfig& skip, uint64_t seed) {
  skip_ = skip;
  skip_seed_ = seed;
  param_stage_.clear();
  if (skip.stages == 0) return;
  const int64_t L = model_->config().n_layer;
  DLOCO_CHECK(skip.stages >= 2 && L % skip.stages == 0);
  // By module, not by name: block i's tensors are the parameters of model_->h[i]; everything else is stage 0's.
  std::map<const void*, int64_t> stage_of;
  for (int64_t i = 0; i < L; ++i) {
    for (const auto& p : model_->h[i]->parameters()) stage_of[p.unsafeGetTensorImpl()] = stage_of_block(i, L, skip.stages);
  }
  std::vector<int64_t> owned(static_cast<size_t>(skip.stages), 0);
  for (const auto& p : model_->parameters()) {
    const auto it = stage_of.find(p.unsafeGetTensorImpl());
    param_stage_.push_back(it == stage_of.end() ? 0 : it->second);
    ++owned[static_cast<size_t>(param_stage_.back())];
  }
  for (int64_t s = 0; s < skip.stages; ++s) DLOCO_CHECK_GT(owned[static_cast<size_t>(s)], 0);
}

void InnerTrainer::average_stage_gradients(const std::vector<std::vector<int64_t>>& paths) {
  std::vector<int64_t> visits(static_cast<size_t>(skip_.stages), 0);
  for (const auto& path : paths) {
    for (int64_t s : path) ++visits[static_cast<size_t>(s)];
  }
  const auto params = model_->parameters();
  DLOCO_CHECK_EQ(params.size(), param_stage_.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = visits[static_cast<size_t>(param_stage_[i])];
    auto& grad = params[i].mutable_grad();
    if (n == 0) {  // only a path source can leave a stage out: no gradient, so AdamW leaves it (and its decay) alone
      grad = torch::Tensor();
      continue;
    }
    // Each micro-batch's loss was divided by grad_accum: G/n turns the sum over the visitors into their mean.
    if (n != train_.grad_accum && grad.defined()) grad.mul_(static_cast<double>(train_.grad_accum) / n);
  }
}

std::unique_ptr<torch::optim::AdamW> make_inner_adamw(const std::vector<torch::Tensor>& params,
                                                      const TrainConfig& train) {
  // Weight decay on matrices only (embedding included), never on norm gains: the usual GPT recipe.
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = torch::optim::AdamWOptions(train.lr)
                     .betas({train.beta1, train.beta2})
                     .eps(train.adam_eps)
                     .weight_decay(train.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
  auto no_decay_options = options;
  no_decay_options.weight_decay(0.0);
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(no_decay_options));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

double evaluate_loss(GPT& model, const TokenSplit& split, int64_t max_tokens, int64_t batch_size,
                     torch::Device device) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const int64_t T = model->config().seq_len;
  int64_t usable = split.size() - 1;
  if (max_tokens > 0) usable = std::min(usable, max_tokens);
  const int64_t sequences = usable / T;
  DLOCO_CHECK_GT(sequences, 0);
  double loss_sum = 0;
  int64_t counted = 0;
  for (int64_t first = 0; first < sequences; first += batch_size) {
    const int64_t B = std::min(batch_size, sequences - first);
    auto window = torch::empty({B * T + 1}, torch::kLong);
    split.copy(first * T, std::span<int64_t>(window.data_ptr<int64_t>(), static_cast<size_t>(window.numel())));
    window = window.to(device);
    auto x = window.narrow(0, 0, B * T).view({B, T});
    auto y = window.narrow(0, 1, B * T).view({B, T});
    loss_sum += model->loss(x, y).item<double>() * static_cast<double>(B * T);
    counted += B * T;
  }
  if (was_training) model->train();
  return loss_sum / static_cast<double>(counted);
}

}  // namespace dloco
