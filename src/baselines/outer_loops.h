// The outer loop of the diloco and streaming baselines (docs/protocol.md §11), replicated on every worker
// of one Gloo group. Two separate implementations behind one interface, so that the equivalence "streaming with
// P = 1, τ = 0 equals diloco" compares two code paths, not one path with itself:
//   diloco     every H steps, the whole model as one flat vector (every fragment of the layout, concatenated):
//              all-reduce [w·Δ, w], Nesterov, θ ← Θ, blocking
//   streaming  fragment p (core/fragments.h layout, LPT) from its due step u (u mod H = S_p): all-reduce started
//              at u, awaited and applied at u + τ, θ_p ← α·θ_p + (1 − α)·Θ_p
// Both merge through AllReduceMerge, the all-reduce form of the syncer's weighted mean (core/merge.h), and both end
// a run that spent its budget with the syncer's final flush. Deliberately not here: the inner step, data, status
// and checkpoints (baselines/run_worker.cc), how θ is held (a FragmentReplica: one process's GPT, or a learner group
// whose leader reads and writes fragments, learner/group_inner_job.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "collective/process_group.h"
#include "core/config.h"
#include "core/fragments.h"
#include "model/gpt.h"
#include "process/events.h"

namespace dloco {

/// θ_m, the replica an outer loop merges into, addressed by fragment of a layout (core/fragments.h): fragment p is
/// layout.fragments[p].numel fp32 values in layout order. A learner's inner job (learner/inner_job.h) is one.
class FragmentReplica {
 public:
  virtual ~FragmentReplica() = default;
  virtual void read_fragment(int p, std::span<float> out) = 0;
  virtual void write_fragment(int p, std::span<const float> values) = 0;
};

/// Weight w_m of one worker's outer gradient in a merge, from its counters since it last received the fragment:
/// "uniform": 1 if steps_since > 0, else 0; "tokens": token_weight(tokens_since, steps_since) / tokens_per_step
/// (tokens²/steps, scaled by the same constant on every rank so it stays small in the fp32 buffer; the scale
/// cancels in Σ w·Δ / Σ w). Throws InputError on an unknown rule or negative counters.
double contribution_weight(WeightRule rule, int64_t tokens_since, int64_t steps_since,
                           int64_t tokens_per_step);

/// One merge of n parameters across the group, in flight: the all-reduce form of core/merge.h's weighted mean.
/// Every rank calls it in the same order with the same n (a collective).
class AllReduceMerge {
 public:
  /// Starts the merge: Δ = Θ − θ (global − local, n each), buffer = [w·Δ, w, stop vote] (n + 2 fp32), summed over
  /// the group asynchronously. `stop_vote`: this worker was asked to stop (a signal); the sum tells every worker
  /// whether anyone was, so all stop after the same merge. Throws InputError on a size mismatch or an invalid
  /// weight, CollectiveError if the all-reduce cannot start.
  AllReduceMerge(Collective& group, std::span<const float> global, std::span<const float> local, double weight,
                 bool stop_vote = false);

  /// Waits for the sum and writes the merged outer gradient Σ w_m·Δ_m / Σ w_m into `merged` (n elements).
  /// Returns false, leaving `merged` untouched, when Σ w_m = 0 (no rank trained on it since it last received it:
  /// nothing to merge; the same answer on every rank). Throws CollectiveError when the all-reduce failed or passed
  /// its deadline. Call once.
  [[nodiscard]] bool finish(std::span<float> merged);

  /// After finish: how many workers voted to stop.
  int stop_votes() const;

 private:
  torch::Tensor buffer_;  // (n + 2) fp32: Σ w_m·Δ_m, Σ w_m, Σ stop votes once finished
  Collective::Pending work_;
};

/// What an outer loop holds between steps, for a resumable stop (docs/guide-resume.md): Θ and its Nesterov buffer
/// by part (diloco: one part, the whole model flat; streaming: fragment p), the versions and the counters since
/// each part was last received, and the merges started but not yet applied, already summed (`delta`: Σ w·Δ / Σ w,
/// empty when nobody trained on it) so that a resumed run applies them at the same step as an uninterrupted one.
struct OuterState {
  struct Landed {
    int fragment = 0;
    int64_t round = 0, apply_at = 0;
    bool merged = false;
    std::vector<float> delta;  // (fragment numel) when merged
  };
  std::vector<std::vector<float>> theta, momentum;  // per part
  std::vector<int64_t> versions, steps_since, tokens_since;
  std::vector<Landed> in_flight;  // in due order
};

/// The outer loop of one worker (diloco or streaming).
class OuterSync {
 public:
  virtual ~OuterSync() = default;

  /// After inner step number `step` (steps done so far, ≥ 1) that trained `tokens` tokens: counts them, starts the
  /// syncs due at `step` (with this worker's `stop_vote`) and applies those that land at `step`. Throws
  /// CollectiveError when the group fails.
  virtual void after_step(int64_t step, int64_t tokens, bool stop_vote = false) = 0;

  /// Whether a merge applied so far carried a stop vote: every worker of the group learns it at the same step, so
  /// they all stop there (diloco: at the next outer sync, ≤ H steps after the signal; streaming: ≤ H/P + τ).
  virtual bool stop_agreed() const = 0;

  /// The state to save (waits for the merges in flight to be summed, without applying them). Throws
  /// CollectiveError when such a merge failed.
  virtual OuterState state() = 0;

  /// Continues from a saved state. Throws InputError when its sizes do not fit this layout and mode.
  virtual void restore(OuterState state) = 0;

  /// The end of a run that spent its budget: applies what is in flight, then merges once more everything trained
  /// on since its last sync (the syncer's final flush). Throws CollectiveError.
  virtual void flush(int64_t step) = 0;

  /// Writes the global parameters Θ into `model` (a model of the layout's config; rank 0 evaluates and saves it).
  virtual void write_global(GPT& model) = 0;

  /// Version of every fragment (diloco: one), the number of merges applied to it.
  virtual std::vector<int64_t> versions() const = 0;
};

/// The outer loop of diloco.mode "diloco" or "streaming" over `replica` (θ) in `layout` (Θ starts as θ's current
/// value). `replica`, `wait_s`, `syncs` and `events` ("applied", "round_skipped") must outlive the result; `wait_s`
/// and `syncs` accumulate the seconds blocked in the all-reduce and the merges applied. Throws InputError on another
/// mode.
std::unique_ptr<OuterSync> make_outer_sync(const Config& config, FragmentReplica& replica, const FragmentLayout& layout,
                                           Collective& group, EventLog& events, double& wait_s, int64_t& syncs);

}  // namespace dloco
