// The baselines' outer loops (diloco: whole model; streaming: fragments); see outer_loops.h.
#include "baselines/outer_loops.h"

#include <chrono>
#include <cmath>
#include <deque>
#include <optional>

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
                               double weight, bool stop_vote) {
  if (global.size() != local.size()) {
    throw InputError("AllReduceMerge: Θ has " + std::to_string(global.size()) + " elements, θ " +
                     std::to_string(local.size()));
  }
  const size_t n = global.size();
  std::vector<float> delta(n);
  outer_gradient(global, local, delta);  // Δ_m = Θ − θ_m
  buffer_ = torch::empty({static_cast<int64_t>(n) + 2}, torch::kFloat);
  weighted_sum_contribution(delta, weight, std::span<float>(buffer_.data_ptr<float>(), n + 1));  // [w·Δ, w]
  buffer_.data_ptr<float>()[n + 1] = stop_vote ? 1.0f : 0.0f;
  work_ = group.allreduce_sum_async(buffer_);
}

bool AllReduceMerge::finish(std::span<float> merged) {
  work_.wait();
  return mean_from_weighted_sums(std::span<const float>(buffer_.data_ptr<float>(), buffer_.numel() - 1), merged);
}

int AllReduceMerge::stop_votes() const {
  return static_cast<int>(std::lround(buffer_.data_ptr<float>()[buffer_.numel() - 1]));
}

namespace {

// A saved state's part sizes against the live ones: InputError naming what differs.
void check_parts(const std::vector<std::vector<float>>& saved, const std::vector<size_t>& sizes, const char* what) {
  if (saved.size() != sizes.size()) {
    throw InputError(std::string("saved outer state: ") + std::to_string(saved.size()) + " parts of " + what +
                     ", this run has " + std::to_string(sizes.size()));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (saved[i].size() != sizes[i]) {
      throw InputError(std::string("saved outer state: part ") + std::to_string(i) + " of " + what + " has " +
                       std::to_string(saved[i].size()) + " values, this run's " + std::to_string(sizes[i]));
    }
  }
}

void check_counters(const OuterState& s, size_t parts) {
  if (s.versions.size() != parts || s.steps_since.size() != parts || s.tokens_since.size() != parts) {
    throw InputError("saved outer state: counters for another number of parts than this run's " +
                     std::to_string(parts));
  }
  for (const auto* counters : {&s.versions, &s.steps_since, &s.tokens_since}) {
    for (int64_t v : *counters) {
      if (v < 0) throw InputError("saved outer state: a negative version or counter (" + std::to_string(v) + ")");
    }
  }
}

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

  void after_step(int64_t step, int64_t tokens, bool stop_vote) override {
    steps_since_ += 1;
    tokens_since_ += tokens;
    if (step % diloco_.inner_steps == 0) sync(step, step, stop_vote);
  }

  bool stop_agreed() const override { return stop_agreed_; }

  OuterState state() override {  // blocking syncs: nothing is ever in flight between steps
    return OuterState{{theta_}, {momentum_}, {version_}, {steps_since_}, {tokens_since_}, {}};
  }

  void restore(OuterState s) override {
    check_parts(s.theta, {theta_.size()}, "Θ");
    check_parts(s.momentum, {theta_.size()}, "the momentum");
    check_counters(s, 1);
    if (!s.in_flight.empty()) throw InputError("saved outer state: diloco has no merge in flight");
    theta_ = std::move(s.theta[0]);
    momentum_ = std::move(s.momentum[0]);
    version_ = s.versions[0];
    steps_since_ = s.steps_since[0];
    tokens_since_ = s.tokens_since[0];
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

  void sync(int64_t step, int64_t round, bool stop_vote = false) {
    std::vector<float> theta_m(theta_.size());  // (N) θ_m
    read_local(theta_m);
    // 1. Δ_m = Θ − θ_m, [w·Δ_m, w] summed over every worker.
    AllReduceMerge merge(group_, theta_, theta_m,
                         contribution_weight(diloco_.weights, tokens_since_, steps_since_, tokens_per_step_),
                         stop_vote);
    // 2. Δ = Σ w_m·Δ_m / Σ w_m.
    std::vector<float> delta(theta_.size());
    const auto t0 = Clock::now();
    const bool merged = merge.finish(delta);
    wait_s_ += seconds_since(t0);
    stop_agreed_ = stop_agreed_ || merge.stop_votes() > 0;
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
  bool stop_agreed_ = false;
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

  void after_step(int64_t step, int64_t tokens, bool stop_vote) override {
    const int P = static_cast<int>(theta_.size()), H = static_cast<int>(diloco_.inner_steps);
    for (int p = 0; p < P; ++p) {
      steps_since_[p] += 1;
      tokens_since_[p] += tokens;
    }
    for (int p = 0; p < P; ++p) {
      if (fragment_due(p, step, H, P)) start(p, step, step + diloco_.overlap, stop_vote);
    }
    while (!in_flight_.empty() && in_flight_.front().apply_at <= step) {
      finish(in_flight_.front(), step);
      in_flight_.pop_front();
    }
  }

  bool stop_agreed() const override { return stop_agreed_; }

  OuterState state() override {
    OuterState s{theta_, momentum_, version_, steps_since_, tokens_since_, {}};
    for (auto& f : in_flight_) {
      land(f);
      s.in_flight.push_back({f.fragment, f.round, f.apply_at, f.merged, f.merged ? f.delta : std::vector<float>{}});
    }
    return s;
  }

  void restore(OuterState s) override {
    std::vector<size_t> sizes;
    for (const auto& t : theta_) sizes.push_back(t.size());
    check_parts(s.theta, sizes, "Θ");
    check_parts(s.momentum, sizes, "the momentum");
    check_counters(s, sizes.size());
    in_flight_.clear();
    for (auto& l : s.in_flight) {
      if (l.fragment < 0 || l.fragment >= static_cast<int>(sizes.size()) ||
          (l.merged && l.delta.size() != sizes[static_cast<size_t>(l.fragment)])) {
        throw InputError("saved outer state: a merge in flight of fragment " + std::to_string(l.fragment) +
                         " with " + std::to_string(l.delta.size()) + " values does not fit this layout");
      }
      InFlight f;
      f.fragment = l.fragment;
      f.round = l.round;
      f.apply_at = l.apply_at;
      f.landed = true;
      f.merged = l.merged;
      f.delta = std::move(l.delta);
      in_flight_.push_back(std::move(f));
    }
    theta_ = std::move(s.theta);
    momentum_ = std::move(s.momentum);
    version_ = std::move(s.versions);
    steps_since_ = std::move(s.steps_since);
    tokens_since_ = std::move(s.tokens_since);
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
    std::optional<AllReduceMerge> merge;  // until landed (none when restored already landed)
    bool landed = false, merged = false;
    std::vector<float> delta;  // Σ w·Δ / Σ w once landed and merged
    int stop_votes = 0;
  };

  // At the due step u: Δ_{m,p} = Θ_p − θ_{m,p}, its [w·Δ, w, stop vote] all-reduce started.
  void start(int p, int64_t round, int64_t apply_at, bool stop_vote = false) {
    std::vector<float> local(theta_[p].size());
    replica_.read_fragment(p, local);
    const double w = contribution_weight(diloco_.weights, tokens_since_[p], steps_since_[p], tokens_per_step_);
    InFlight f;
    f.fragment = p;
    f.round = round;
    f.apply_at = apply_at;
    f.merge.emplace(group_, theta_[p], local, w, stop_vote);
    in_flight_.push_back(std::move(f));
  }

  // Waits for the sum of a merge in flight (once): Δ_p = Σ w_m·Δ_{m,p} / Σ w_m.
  void land(InFlight& f) {
    if (f.landed) return;
    f.delta.resize(theta_[f.fragment].size());
    const auto t0 = Clock::now();
    f.merged = f.merge->finish(f.delta);
    wait_s_ += seconds_since(t0);
    f.stop_votes = f.merge->stop_votes();
    f.landed = true;
  }

  // At u + τ: Nesterov on Θ_p with the landed Δ_p, θ_p ← α·θ_p + (1 − α)·Θ_p.
  void finish(InFlight& f, int64_t step) {
    const int p = f.fragment;
    land(f);
    stop_agreed_ = stop_agreed_ || f.stop_votes > 0;
    const bool merged = f.merged;
    const std::vector<float>& delta = f.delta;
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
  bool stop_agreed_ = false;
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
