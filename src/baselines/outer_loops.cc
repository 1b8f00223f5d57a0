// The baselines' outer loops (diloco: whole model; streaming: fragments); see outer_loops.h.
#include "baselines/outer_loops.h"

#include <chrono>
#include <deque>

#include "collective/flat_model.h"
#include "core/check.h"
#include "core/fragments.h"
#include "core/merge.h"
#include "train/fragment_io.h"

namespace dloco {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Mixing on receive: θ ← α·θ + (1 − α)·Θ, in place (α = 0: θ ← Θ exactly).
void mix_toward(std::span<float> local, std::span<const float> theta, double alpha) {
  DLOCO_CHECK_EQ(local.size(), theta.size());
  if (alpha == 0) {
    std::copy(theta.begin(), theta.end(), local.begin());
    return;
  }
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<float>(alpha * local[i] + (1 - alpha) * theta[i]);
}

}  // namespace

double contribution_weight(WeightRule rule, int64_t tokens_since, int64_t steps_since,
                           int64_t tokens_per_step) {
  if (rule == WeightRule::kTokens) {
    DLOCO_CHECK_GT(tokens_per_step, 0);
    return token_weight(tokens_since, steps_since) / static_cast<double>(tokens_per_step);
  }
  if (steps_since < 0) throw InputError("contribution_weight: steps_since must be ≥ 0, got " + std::to_string(steps_since));
  return steps_since > 0 ? 1.0 : 0.0;  // uniform
}

AllReduceMerge::AllReduceMerge(Collective& group, std::span<const float> global, std::span<const float> local,
                               double weight) {
  if (global.size() != local.size()) {
    throw InputError("AllReduceMerge: Θ has " + std::to_string(global.size()) + " elements, θ " +
                     std::to_string(local.size()));
  }
  const size_t n = global.size();
  std::vector<float> delta(n);
  outer_gradient(global, local, delta);  // Δ_m = Θ − θ_m
  buffer_ = torch::empty({static_cast<int64_t>(n) + 1}, torch::kFloat);
  weighted_sum_contribution(delta, weight, std::span<float>(buffer_.data_ptr<float>(), n + 1));  // [w·Δ, w]
  work_ = group.allreduce_sum_async(buffer_);
}

bool AllReduceMerge::finish(std::span<float> merged) {
  work_.wait();
  return mean_from_weighted_sums(std::span<const float>(buffer_.data_ptr<float>(), buffer_.numel()), merged);
}

namespace {

// diloco: the whole model at once, every H steps, blocking (K = M, P = 1, τ = 0): every fragment concatenated
// into one flat vector (elementwise math: the order of the elements does not change Θ).
class DilocoSync final : public OuterSync {
 public:
  DilocoSync(const Config& config, FragmentReplica& replica, const FragmentLayout& layout, Collective& group,
             EventLog& events, double& wait_s, int64_t& syncs)
      : diloco_(config.diloco), tokens_per_step_(config.train.tokens_per_step(config.model)), replica_(replica),
        layout_(layout), group_(group), events_(events), wait_s_(wait_s), syncs_(syncs) {
    int64_t n = 0;
    for (const auto& f : layout_.fragments) {
      offsets_.push_back(n);
      n += f.numel;
    }
    theta_.resize(static_cast<size_t>(n));  // (N)
    read_local(theta_);
    momentum_.assign(theta_.size(), 0.0f);
  }

  void after_step(int64_t step, int64_t tokens) override {
    steps_since_ += 1;
    tokens_since_ += tokens;
    if (step % diloco_.inner_steps == 0) sync(step, step);
  }

  void flush(int64_t step) override {
    if (steps_since_ > 0) sync(step, -1);
  }

  void write_global(GPT& model) override {
    const auto params = layout_parameters(model, layout_);
    for (size_t p = 0; p < layout_.fragments.size(); ++p) scatter_parameters(params, layout_, static_cast<int>(p), part(theta_, p));
  }

  std::vector<int64_t> versions() const override { return {version_}; }

 private:
  std::span<float> part(std::vector<float>& flat, size_t p) {
    return std::span<float>(flat).subspan(static_cast<size_t>(offsets_[p]), static_cast<size_t>(layout_.fragments[p].numel));
  }
  void read_local(std::vector<float>& flat) {
    for (size_t p = 0; p < layout_.fragments.size(); ++p) replica_.read_fragment(static_cast<int>(p), part(flat, p));
  }

  void sync(int64_t step, int64_t round) {
    std::vector<float> theta_m(theta_.size());  // (N) θ_m
    read_local(theta_m);
    // 1. Δ_m = Θ − θ_m, [w·Δ_m, w] summed over every worker.
    AllReduceMerge merge(group_, theta_, theta_m,
                         contribution_weight(diloco_.weights, tokens_since_, steps_since_, tokens_per_step_));
    // 2. Δ = Σ w_m·Δ_m / Σ w_m.
    std::vector<float> delta(theta_.size());
    const auto t0 = Clock::now();
    const bool merged = merge.finish(delta);
    wait_s_ += seconds_since(t0);
    if (!merged) {
      events_.emit("round_skipped", {{"fragment", 0}, {"round", round}, {"reason", "no worker trained on it"}});
      return;
    }
    // 3. Nesterov outer step on Θ; 4. θ ← Θ (or mixed with α).
    nesterov_outer_step(theta_, momentum_, delta, static_cast<float>(diloco_.outer_lr),
                        static_cast<float>(diloco_.outer_momentum));
    mix_toward(theta_m, theta_, diloco_.alpha);
    for (size_t p = 0; p < layout_.fragments.size(); ++p) replica_.write_fragment(static_cast<int>(p), part(theta_m, p));
    ++version_;
    steps_since_ = tokens_since_ = 0;
    ++syncs_;
    events_.emit("applied", {{"step", step}, {"fragment", 0}, {"round", round}, {"version", version_},
                             {"outer_grad_norm", l2_norm(delta)}, {"whole_model", true}});
  }

  const DilocoConfig diloco_;
  const int64_t tokens_per_step_;
  FragmentReplica& replica_;
  const FragmentLayout layout_;
  Collective& group_;
  EventLog& events_;
  double& wait_s_;
  int64_t& syncs_;
  std::vector<int64_t> offsets_;                 // where fragment p starts in the flat vectors
  std::vector<float> theta_, momentum_;  // (N) Θ and its Nesterov buffer v, fragments concatenated
  int64_t version_ = 0, steps_since_ = 0, tokens_since_ = 0;
};

// streaming: fragment p from its due step u, applied at u + τ.
class StreamingSync final : public OuterSync {
 public:
  StreamingSync(const Config& config, FragmentReplica& replica, const FragmentLayout& layout, Collective& group,
                EventLog& events, double& wait_s, int64_t& syncs)
      : diloco_(config.diloco), tokens_per_step_(config.train.tokens_per_step(config.model)), layout_(layout),
        replica_(replica), group_(group), events_(events), wait_s_(wait_s), syncs_(syncs) {
    const size_t P = layout_.fragments.size();
    theta_.resize(P);
    momentum_.resize(P);
    for (size_t p = 0; p < P; ++p) {
      theta_[p].resize(static_cast<size_t>(layout_.fragments[p].numel));
      replica_.read_fragment(static_cast<int>(p), theta_[p]);
      momentum_[p].assign(theta_[p].size(), 0.0f);
    }
    version_.assign(P, 0);
    steps_since_.assign(P, 0);
    tokens_since_.assign(P, 0);
  }

  void after_step(int64_t step, int64_t tokens) override {
    const int P = static_cast<int>(theta_.size()), H = static_cast<int>(diloco_.inner_steps);
    for (int p = 0; p < P; ++p) {
      steps_since_[p] += 1;
      tokens_since_[p] += tokens;
    }
    for (int p = 0; p < P; ++p) {
      if (fragment_due(p, step, H, P)) start(p, step, step + diloco_.overlap);
    }
    while (!in_flight_.empty() && in_flight_.front().apply_at <= step) {
      finish(in_flight_.front(), step);
      in_flight_.pop_front();
    }
  }

  void flush(int64_t step) override {
    while (!in_flight_.empty()) {
      finish(in_flight_.front(), step);
      in_flight_.pop_front();
    }
    for (int p = 0; p < static_cast<int>(theta_.size()); ++p) {
      if (steps_since_[p] == 0) continue;  // lock-step: the same on every rank
      start(p, -1, step);
      finish(in_flight_.back(), step);
      in_flight_.pop_back();
    }
  }

  void write_global(GPT& model) override {
    const auto params = layout_parameters(model, layout_);
    for (int p = 0; p < static_cast<int>(theta_.size()); ++p) scatter_parameters(params, layout_, p, theta_[p]);
  }

  std::vector<int64_t> versions() const override { return version_; }

 private:
  struct InFlight {
    int fragment = 0;
    int64_t round = 0;     // due step u; -1 for the final flush
    int64_t apply_at = 0;  // step boundary at which the merged fragment is applied (u + τ)
    AllReduceMerge merge;
  };

  // At the due step u: Δ_{m,p} = Θ_p − θ_{m,p}, its [w·Δ, w] all-reduce started.
  void start(int p, int64_t round, int64_t apply_at) {
    std::vector<float> local(theta_[p].size());
    replica_.read_fragment(p, local);
    const double w = contribution_weight(diloco_.weights, tokens_since_[p], steps_since_[p], tokens_per_step_);
    in_flight_.push_back(InFlight{p, round, apply_at, AllReduceMerge(group_, theta_[p], local, w)});
  }

  // At u + τ: Δ_p = Σ w_m·Δ_{m,p} / Σ w_m, Nesterov on Θ_p, θ_p ← α·θ_p + (1 − α)·Θ_p.
  void finish(InFlight& f, int64_t step) {
    const int p = f.fragment;
    std::vector<float> delta(theta_[p].size());
    const auto t0 = Clock::now();
    const bool merged = f.merge.finish(delta);
    wait_s_ += seconds_since(t0);
    if (!merged) {
      events_.emit("round_skipped", {{"fragment", p}, {"round", f.round}, {"reason", "no worker trained on it"}});
      return;
    }
    nesterov_outer_step(theta_[p], momentum_[p], delta, static_cast<float>(diloco_.outer_lr),
                        static_cast<float>(diloco_.outer_momentum));
    std::vector<float> local(theta_[p].size());
    if (diloco_.alpha != 0) replica_.read_fragment(p, local);
    mix_toward(local, theta_[p], diloco_.alpha);
    replica_.write_fragment(p, local);
    version_[p] += 1;
    steps_since_[p] = tokens_since_[p] = 0;
    ++syncs_;
    events_.emit("applied", {{"step", step}, {"fragment", p}, {"round", f.round}, {"version", version_[p]},
                             {"outer_grad_norm", l2_norm(delta)}});
  }

  const DilocoConfig diloco_;
  const int64_t tokens_per_step_;
  const FragmentLayout layout_;
  FragmentReplica& replica_;  // θ_m
  Collective& group_;
  EventLog& events_;
  double& wait_s_;
  int64_t& syncs_;
  std::vector<std::vector<float>> theta_, momentum_;  // per fragment p: Θ_p and v_p (fragment numel each)
  std::vector<int64_t> version_, steps_since_, tokens_since_;
  std::deque<InFlight> in_flight_;  // in due order; the front lands first
};

}  // namespace

std::unique_ptr<OuterSync> make_outer_sync(const Config& config, FragmentReplica& replica, const FragmentLayout& layout,
                                           Collective& group, EventLog& events, double& wait_s, int64_t& syncs) {
  if (config.diloco.mode == Mode::kDiloco) {
    return std::make_unique<DilocoSync>(config, replica, layout, group, events, wait_s, syncs);
  }
  if (config.diloco.mode == Mode::kStreaming) {
    return std::make_unique<StreamingSync>(config, replica, layout, group, events, wait_s, syncs);
  }
  throw InputError(std::string("an outer sync is for diloco.mode = \"diloco\" or \"streaming\", not \"") + to_string(config.diloco.mode) + "\"");
}

}  // namespace dloco
