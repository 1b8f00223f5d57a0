// A learner's outer sync (docs/protocol.md "Learner loop", steps 3–6; the Decoupled DiLoCo paper §3): the
// per-fragment counters, the answers to the syncer's pull requests, merged fragments held back until τ steps
// after their capture, α-mixing, re-anchoring, the blocking (synchronous) mode, and the goodput accounting.
// It runs on the training thread at step boundaries and never waits on the network: it polls the link's inbox
// and posts to its outbox.
//
// Goodput (docs/protocol.md "Goodput"): a step's work on fragment p is kept when a merge includes the answer
// that carried it. An answer carries steps[m][p], the steps since p was last applied (its Δ is taken against
// that base), so "kept" counts exactly those; steps overwritten by a merge without this learner are "work_lost".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "learner/inner_job.h"
#include "learner/link.h"
#include "learner/peer.h"
#include "process/events.h"
#include "transport/codec.h"

namespace dloco {

struct OuterSyncConfig {
  int learner_id = 0;
  int fragments = 1;                    // P
  std::vector<int64_t> fragment_numel;  // numel of each fragment
  int64_t inner_steps = 1;              // H (blocking mode: which steps are due)
  int64_t overlap = 0;                  // τ: a merge of a round this learner answered is applied τ steps after
                                        // its capture
  double alpha = 0;                     // α: θ_p ← α·θ_p + (1 − α)·Θ_p on apply
  bool reanchor = true;                 // diloco.stale_policy = "reanchor": answer raw θ when the base is gone
  bool blocking = false;                // diloco.blocking: wait for pulls and merges (a synchronous configuration)
  wire::Codec codec = wire::Codec::kFp32;  // of the outer gradients Δ (diloco.wire_up); merged fragments arrive in
                                           // whatever codec the syncer names (diloco.wire_down)
  // Error feedback (issue 14 part 2): per fragment, what the codec dropped from the last Δ sent (e = Δ + e − x̂) is
  // added to the next Δ of that fragment; reset when the fragment is re-anchored (raw θ sent) and on a restart
  // (a new OuterSync). Applies to the lossy codecs (bf16, q8, q4, topk).
  bool error_feedback = false;
  double error_feedback_decay = 1.0;  // β: e is carried as β·e (diloco.error_feedback_decay)
  int64_t topk_density = 64;          // topk: one value kept in D of each chunk (diloco.topk_density)
};

/// What a step boundary found.
struct BoundaryOutcome {
  bool stop = false;          // the syncer ended the run
  bool budget_spent = false;  // the shared budget is spent: stop training, keep answering
  std::optional<wire::StreamOffer> offer;  // fixed shares: a stream to take over (the last one offered)
};

class OuterSync {
 public:
  /// `job` and `link` outlive it; `events` and `board` (the peer server's view) may be null.
  OuterSync(OuterSyncConfig config, InnerJob& job, LearnerLink& link, EventLog* events, FragmentBoard* board);

  /// Bootstrap: fragment p is Θ_p at `version`; writes it into the job.
  void adopt(int p, int64_t version, std::shared_ptr<const std::vector<float>> theta);
  /// Step 3: counters after an inner step of `tokens` tokens.
  void count_step(int64_t tokens);
  /// Step 4's per-fragment counters (steps[m][p], tokens[m][p]) and the newest version of each fragment it holds.
  void fill_counters(wire::Metadata& metadata) const;
  /// Steps 5–6 at the boundary after step `step`: answers pulls, queues merges, applies those due (all of them
  /// once `finished`: τ has nothing left to overlap with).
  BoundaryOutcome boundary(int64_t step, bool finished);
  /// Blocking mode: true while the pull of a round due at `step` has not arrived or a merge it waits for has not
  /// been applied.
  bool blocked(int64_t step) const;

  const std::vector<int64_t>& versions() const { return version_; }
  /// Steps overwritten by merges without this learner (its work_lost events, added up).
  int64_t lost_steps() const { return lost_steps_; }
  /// Merged fragments applied to the local copy so far (whole copies and updates).
  int64_t merges_applied() const { return merges_applied_; }
  /// The most steps any fragment has trained since it was last applied (lost if the learner leaves now).
  int64_t unmerged_steps() const;
  /// FNV-1a hashes of the job's own fragments now (the end-of-run check: every copy equals Θ).
  std::vector<std::string> parameter_hashes() const;

 private:
  struct Pending {  // a merged fragment waiting for its apply step
    int fragment = 0;
    int64_t version = 0;
    int64_t apply_at = 0;  // first boundary at which it may be applied
    bool participated = false;
    std::shared_ptr<const std::vector<float>> theta;
    bool whole = true;      // arrived as Θ_p itself, not as an update of the compressed downlink
    bool replaces = false;  // a whole copy asked for after a gap: applied even at a version not above this one
  };
  struct Answered {  // the last pull of p this learner answered
    int64_t round = 0;
    int64_t captured_step = 0;
    int64_t steps = 0;  // the work it carried (steps[m][p] at the capture)
    bool open = false;  // no merge of that round seen yet
  };

  void answer(const wire::PullRequest& pull, int64_t step);
  /// Δ_p (n values; with error feedback the residual is added in place) as the configured codec; a non-finite Δ
  /// goes as fp32 for the syncer to refuse and count (the integer codecs cannot carry it).
  wire::Payload encode_delta(int p, std::vector<float>& delta);
  void receive(wire::MergedFragment merged, int64_t step);
  uint64_t newest_hash(int p);  // newest_hash_[p], computed when first needed
  void apply(Pending& merge, int64_t step);
  void emit(const char* event, const nlohmann::json& fields) const;

  OuterSyncConfig config_;
  InnerJob& job_;
  LearnerLink& link_;
  EventLog* events_;
  FragmentBoard* board_;
  std::vector<std::shared_ptr<const std::vector<float>>> base_;  // Θ_p^base: the version last applied
  std::vector<int64_t> version_;
  // The newest Θ_p received (applied or pending) and its version: what an update of the compressed downlink
  // (diloco.wire_down) must be against; and whether a whole copy was asked for (LearnerLink::resync).
  std::vector<std::shared_ptr<const std::vector<float>>> newest_;
  std::vector<int64_t> newest_version_;
  std::vector<uint64_t> newest_hash_;  // FNV-1a of newest_ (0: not computed yet): an update names its base's
  std::vector<bool> resync_asked_;
  std::vector<int64_t> steps_since_, tokens_since_;  // since p was last applied
  std::map<int, Answered> answered_;
  std::vector<Pending> pending_;
  std::map<int, int64_t> awaiting_merge_;  // blocking mode: fragment -> step by which its merge must be applied
  int64_t lost_steps_ = 0;
  int64_t merges_applied_ = 0;
  std::vector<wire::ErrorFeedback> feedback_;  // error feedback: one per fragment
};

}  // namespace dloco
