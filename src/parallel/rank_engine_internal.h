// Internal to the rank engines (rank_engine.cc, pipeline_engine.cc): the step helpers they share and the pipeline
// engine's factory. Deliberately not for use outside src/parallel.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/hash.h"
#include "parallel/rank_engine.h"
#include "parallel/zero.h"
#include "train/trainer.h"

namespace dloco::rank_engine_detail {

// Inputs and targets of window w: (B, T) each, read from windows[w] (B·(T + 1)) as train/trainer.cc reads it.
inline std::pair<torch::Tensor, torch::Tensor> window_batch(const torch::Tensor& windows, int64_t w, int64_t B, int64_t T) {
  return dloco::window_batch(windows[w], B, T);
}

inline double max_norm_of(const TrainConfig& train) {
  return train.grad_clip > 0 ? train.grad_clip : std::numeric_limits<double>::infinity();
}

inline void set_lr(torch::optim::AdamW& adamw, double lr) {
  for (auto& group : adamw.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

inline void save_adamw(torch::optim::AdamW& adamw, const std::filesystem::path& file) { torch::save(adamw, file.string()); }

inline void load_adamw(torch::optim::AdamW& adamw, const std::filesystem::path& file) {
  try {
    torch::load(adamw, file.string());
  } catch (const c10::Error& e) {
    throw InputError("cannot load the optimizer state '" + file.string() + "': " + e.what_without_backtrace());
  }
}

// Copies `full` into `target` after checking the shape.
inline void copy_checked(torch::Tensor target, const torch::Tensor& full, const std::string& name) {
  if (target.sizes() != full.sizes()) {
    throw InputError("parameter '" + name + "' has shape " + c10::str(target.sizes()) + ", the value " +
                     c10::str(full.sizes()));
  }
  torch::NoGradGuard no_grad;
  target.copy_(full);
}

// The dp baseline over learner groups (RankEngine::set_replicas): `grads` (undefined ones skipped; the same set on
// every replica) and `loss` summed over `replicas` in one fp32 buffer and divided by its world, in place, as
// baselines/dp.cc's hook does for one-process workers. Returns the averaged loss; without replicas, `loss`.
inline double average_over_learners(Collective* replicas, const std::vector<torch::Tensor>& grads, double loss) {
  if (replicas == nullptr) return loss;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> parts;
  for (const auto& g : grads) {
    if (g.defined()) parts.push_back(g.reshape({-1}));
  }
  parts.push_back(torch::full({1}, loss, torch::kFloat));
  auto flat = torch::cat(parts);  // (Σ numel + 1)
  parts.clear();
  replicas->allreduce_sum(flat);
  flat.div_(static_cast<double>(replicas->world()));
  int64_t offset = 0;
  for (const auto& g : grads) {
    if (!g.defined()) continue;
    g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
    offset += g.numel();
  }
  return flat[offset].item<double>();
}

// The first tensor of `held` whose bytes differ between the ranks of `replicas` (null or one rank: none): each
// rank's FNV-1a 64 hashes all-gathered, compared with replica 0's. Returns "" or "<what>: tensor NAME differs:
// replica 0 hashes H0, replica j Hj". The same list of names and shapes on every replica.
inline std::string first_replica_mismatch(const std::vector<std::pair<std::string, torch::Tensor>>& held,
                                          Collective* replicas, const std::string& what) {
  if (replicas == nullptr || replicas->world() == 1 || held.empty()) return "";
  auto hashes = torch::empty({static_cast<int64_t>(held.size())}, torch::kLong);  // (n) the hash bits as int64
  for (size_t i = 0; i < held.size(); ++i) {
    const auto bytes = held[i].second.detach().cpu().contiguous();
    const uint64_t h = fnv1a64(std::string_view(static_cast<const char*>(bytes.data_ptr()), bytes.nbytes()));
    hashes[static_cast<int64_t>(i)] = static_cast<int64_t>(h);
  }
  const auto all = replicas->all_gather(hashes);
  for (size_t i = 0; i < held.size(); ++i) {
    for (int j = 1; j < replicas->world(); ++j) {
      const int64_t a = all[0][static_cast<int64_t>(i)].item<int64_t>(), b = all[j][static_cast<int64_t>(i)].item<int64_t>();
      if (a == b) continue;
      char buf[128];
      std::snprintf(buf, sizeof(buf), ": replica 0 hashes %016llx, replica %d %016llx", static_cast<unsigned long long>(a), j,
                    static_cast<unsigned long long>(b));
      return what + ": tensor " + held[i].first + " differs" + buf;
    }
  }
  return "";
}

// The gradients of `params` (undefined where a parameter has none), for average_over_learners.
inline std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& q : params) grads.push_back(q.grad());
  return grads;
}

// train/trainer.cc's guard: a non-finite loss or gradient norm skips the step (moments untouched, gradients
// dropped); else one AdamW step. Sets r.skipped.
inline void guard_and_step(torch::optim::AdamW& adamw, EngineStep& r) {
  r.skipped = !std::isfinite(r.loss) || !std::isfinite(r.grad_norm);
  if (r.skipped) {
    adamw.zero_grad();
  } else {
    adamw.step();
  }
}

}  // namespace dloco::rank_engine_detail

namespace dloco {
/// The engine of pipeline = p (× tensor = t) groups (pipeline_engine.cc).
std::unique_ptr<RankEngine> make_pipeline_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group);
/// The engine of zero = 3 × tensor = t groups (zero3_tp_engine.cc): from `full`, or (null) from `seed` by sharded
/// initialisation.
std::unique_ptr<RankEngine> make_zero3_tp_engine(const GPT* full, const ModelConfig& model, uint64_t seed,
                                                 const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group, const std::filesystem::path& offload_dir);
}  // namespace dloco
