// ZeroAdamW's access to single parameters (the learner group's fragment reads and writes, parallel/rank_engine.h)
// and its state files; see zero.h.
#include <algorithm>

#include "core/check.h"
#include "parallel/zero.h"
#include "parallel/zero_unit.h"

namespace dloco {

std::pair<ZeroAdamW::Unit*, size_t> ZeroAdamW::find(const std::string& name) {
  for (auto& u : units_) {
    for (size_t i = 0; i < u.names.size(); ++i) {
      if (u.names[i] == name) return {&u, i};
    }
  }
  throw InputError("the ZeRO model has no parameter '" + name + "'");
}

torch::Tensor ZeroAdamW::gather_parameter(const std::string& name, int root) {
  auto [u, i] = find(name);
  const int64_t n = c10::multiply_integers(u->shapes[i]);
  const bool mine = group_.rank() == root;
  if (options_.stage < 3) {
    return mine ? u->flat.narrow(0, u->offsets[i], n).view(u->shapes[i]).clone() : torch::Tensor();
  }
  auto full = torch::empty({u->padded});  // (padded) the parameter's unit
  group_.all_gather_flat(full, u->slice);
  return mine ? full.narrow(0, u->offsets[i], n).view(u->shapes[i]).clone() : torch::Tensor();
}

std::vector<std::pair<std::string, torch::Tensor>> ZeroAdamW::replicated_slices() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (!tp_model_) return out;
  for (const auto& u : units_) {
    const int64_t begin = group_.rank() * u.shard;
    for (size_t i = 0; i < u.names.size(); ++i) {
      if (!tp_model_->shard_spec(u.names[i]).replicated()) continue;
      const int64_t n = c10::multiply_integers(u.shapes[i]);
      const int64_t a = std::max(begin, u.offsets[i]), b = std::min(begin + u.shard, u.offsets[i] + n);
      if (a >= b) continue;
      out.emplace_back(u.names[i] + "[" + std::to_string(a - u.offsets[i]) + ", " + std::to_string(b - u.offsets[i]) + ")",
                       u.slice.narrow(0, a - begin, b - a));
    }
  }
  return out;
}

void ZeroAdamW::set_parameter(const std::string& name, const torch::Tensor& full) {
  auto [u, i] = find(name);
  if (full.sizes().vec() != u->shapes[i]) {
    throw InputError("set_parameter('" + name + "'): the tensor has another shape than the model's parameter");
  }
  torch::NoGradGuard no_grad;
  const auto values = full.reshape({-1});  // (n)
  if (options_.stage < 3) {
    u->flat.narrow(0, u->offsets[i], values.numel()).copy_(values);
    return;
  }
  // Stage 3: the intersection of [offset, offset + n) with this rank's slice [r·S, (r+1)·S).
  const int64_t begin = group_.rank() * u->shard, a = std::max(begin, u->offsets[i]),
                b = std::min(begin + u->shard, u->offsets[i] + values.numel());
  if (a < b) u->slice.narrow(0, a - begin, b - a).copy_(values.narrow(0, a - u->offsets[i], b - a));
}

void ZeroAdamW::save_state(const std::string& file) const {
  std::vector<torch::Tensor> state{torch::tensor({static_cast<int64_t>(options_.stage), int64_t{group_.world()},
                                                  int64_t{group_.rank()}, parameter_count_, step_count_,
                                                  int64_t{tp_ ? tp_->world() : 1}, int64_t{tp_ ? tp_->rank() : 0}})};
  for (const auto& u : units_) {
    state.push_back(u.exp_avg);
    state.push_back(u.exp_avg_sq);
  }
  torch::save(state, file);
}

void ZeroAdamW::load_state(const std::string& file) {
  std::vector<torch::Tensor> state;
  try {
    torch::load(state, file);
  } catch (const c10::Error& e) {
    throw InputError("cannot read the ZeRO state '" + file + "': " + e.what_without_backtrace());
  }
  if (state.size() != 1 + 2 * units_.size() || state[0].numel() != 7) {
    throw InputError("the ZeRO state '" + file + "' was written for another model or stage");
  }
  const auto meta = state[0];
  const int64_t tp_world = tp_ ? tp_->world() : 1, tp_rank = tp_ ? tp_->rank() : 0;
  if (meta[0].item<int64_t>() != options_.stage || meta[1].item<int64_t>() != group_.world() ||
      meta[2].item<int64_t>() != group_.rank() || meta[3].item<int64_t>() != parameter_count_ ||
      meta[5].item<int64_t>() != tp_world || meta[6].item<int64_t>() != tp_rank) {
    throw InputError("the ZeRO state '" + file + "' was written by stage " + std::to_string(meta[0].item<int64_t>()) +
                     ", DP rank " + std::to_string(meta[2].item<int64_t>()) + " of " +
                     std::to_string(meta[1].item<int64_t>()) + ", TP rank " + std::to_string(meta[6].item<int64_t>()) +
                     " of " + std::to_string(meta[5].item<int64_t>()) + " for " +
                     std::to_string(meta[3].item<int64_t>()) + " parameters; this is stage " +
                     std::to_string(options_.stage) + ", DP rank " + std::to_string(group_.rank()) + " of " +
                     std::to_string(group_.world()) + ", TP rank " + std::to_string(tp_rank) + " of " +
                     std::to_string(tp_world));
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    if (state[1 + 2 * k].sizes() != units_[k].exp_avg.sizes() ||
        state[2 + 2 * k].sizes() != units_[k].exp_avg_sq.sizes()) {
      throw InputError("the ZeRO state '" + file + "' has slices of another size");
    }
  }
  torch::NoGradGuard no_grad;
  step_count_ = meta[4].item<int64_t>();
  for (size_t k = 0; k < units_.size(); ++k) {
    units_[k].exp_avg.copy_(state[1 + 2 * k]);
    units_[k].exp_avg_sq.copy_(state[2 + 2 * k]);
    if (units_[k].offload) units_[k].offload->release_all();
  }
}

void ZeroAdamW::reset_state() {
  torch::NoGradGuard no_grad;
  step_count_ = 0;
  for (auto& u : units_) {
    u.exp_avg.zero_();
    u.exp_avg_sq.zero_();
    if (u.offload) u.offload->release_all();
  }
}

}  // namespace dloco
