// The syncer's state and its transitions (docs/protocol.md §4–§8), with no network and no clocks:
// the service (syncer_service.cc) feeds it metadata and pull answers with the current time, calls tick(), and
// carries out the actions it returns (send pull requests, persist then broadcast merged fragments).
// Everything here is deterministic for a given sequence of calls, so it is tested by driving it by hand.
//
// Declared states (core/state_machine.h; the moves are checked):
//   a round of fragment p (one open round per fragment at a time, rounds of p in due-step order):
//     due (the clock crossed u)  --quorum + grace-->  pulling (PullRequest sent to the participants)
//     due                        --final flush with no live learner-->  closed
//     pulling  --all answers in, or the answer window closed-->  closed (merged: version_p + 1, or skipped)
//   the syncer:
//     training  --every live learner spent its budget-->  flushing (every fragment merged once more)
//     flushing  --every fragment flushed-->  finished
// Deliberately not here: threads (the service holds one mutex around every call), I/O, tensors.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/decisions.h"
#include "core/fragments.h"
#include "core/lr_schedule.h"
#include "core/merge.h"
#include "core/state_machine.h"
#include "syncer/screening.h"
#include "transport/codec.h"

namespace dloco {

/// What a learner reports after each step (docs/protocol.md §3 step 4).
struct LearnerReport {
  int64_t step = 0;                 // t_m
  std::vector<int64_t> steps;       // steps[m][p], P entries
  std::vector<int64_t> tokens;      // tokens[m][p], P entries
  double step_time_s = 0;           // EMA of its step time
  int64_t tokens_trained = 0;       // tokens its stream has served in total (the stream's cursor)
  int64_t stream = -1;              // the data stream it trains (its lease); -1 = the learner's id; < -1 = a
                                    // stream it does not hold the lease of (its tokens do not count)
  std::string cursor_json;          // its data stream cursor
  double tokens_per_s = 0;
  double loss = 0;
  bool finished = false;            // spent its slot's token budget
};

/// A learner's answer to PullRequest(p, u), already decoded to fp32.
struct PullAnswerData {
  int fragment = 0;
  int64_t round_step = 0;
  int64_t captured_step = 0;
  int64_t base_version = 0;
  int64_t steps = 0;
  int64_t tokens = 0;
  std::vector<float> delta;  // Θ_p^base − θ_{m,p}, fragment-sized
  double codec_error = 0;    // wire::error_bound of its payload: with error feedback, ≥ the residual the learner
                             // carries into its next answer of this fragment (the norm screen allows for it, §10)
};

/// A merged fragment to persist and then broadcast.
struct MergedFragmentData {
  int fragment = 0;
  int64_t version = 0;
  int64_t round_step = 0;
  std::vector<int> participants;
  std::vector<float> theta;  // Θ_p after the outer step (with diloco.wire_down: Θ_p at the base + Û, canonical)
  // diloco.wire_down ≠ fp32: the outer update U = Θ_p − Θ_p^prev (+ the downlink residual) encoded, and the version
  // it applies to (version − 1); base_version −1 when the downlink sends Θ_p whole.
  int64_t base_version = -1;
  uint64_t base_hash = 0;  // FNV-1a 64 of Θ_p at base_version (core/hash.h)
  wire::Payload update;
};

/// What the service must do after a call, in order: send pulls; persist each merged fragment, then broadcast it.
struct SyncerActions {
  struct Pull {
    int fragment = 0;
    int64_t round_step = 0;
    std::vector<int> learners;
  };
  std::vector<Pull> pulls;
  std::vector<MergedFragmentData> merged;
  // Fragments of learners whose answers to pulls of that fragment were refused diloco.refetch_after times in a row
  // (no merged answer of theirs between): send Θ_p whole, to replace their parameters (docs/protocol.md §10). Each
  // is named once per refetch_after refusals.
  struct Refetch {
    int learner = 0;
    int fragment = 0;
    bool operator==(const Refetch&) const = default;
  };
  std::vector<Refetch> refetch;
  std::vector<nlohmann::json> events;  // structured decision events (quorum, grace, drop, absent …) with reasons
  bool clock_moved = false;
  bool finished_now = false;           // the final flush just completed: the run is over
};

enum class RoundPhase { kDue, kPulling, kClosed };
enum class SyncerPhase { kTraining, kFlushing, kFinished };
const char* to_string(RoundPhase phase);
const char* to_string(SyncerPhase phase);
inline constexpr std::array<std::pair<RoundPhase, RoundPhase>, 3> kRoundMoves = {{
    {RoundPhase::kDue, RoundPhase::kPulling},
    {RoundPhase::kDue, RoundPhase::kClosed},
    {RoundPhase::kPulling, RoundPhase::kClosed},
}};
inline constexpr std::array<std::pair<SyncerPhase, SyncerPhase>, 2> kSyncerMoves = {{
    {SyncerPhase::kTraining, SyncerPhase::kFlushing},
    {SyncerPhase::kFlushing, SyncerPhase::kFinished},
}};

/// Outcome of an incoming answer.
enum class AnswerOutcome { kAccepted, kDroppedLate, kRefused };

/// Why an answer was refused (docs/protocol.md §10): each kind is counted on its own (`answers_refused` by reason).
enum class RefusalKind {
  kMalformed,  // fragment out of range, wrong size, non-finite values, a payload that does not decode
  kCounters,   // steps or tokens impossible for what the learner can have trained since its last merge of p
  kStale,      // a delta against a base version the syncer no longer keeps (stale_policy "skip")
  kNorm,       // its outer gradient per step is diloco.screen_ratio × the round's and recent merges' median or more
};
const char* to_string(RefusalKind kind);

/// Per-learner bookkeeping the syncer keeps.
struct LearnerRecord {
  LearnerState state;
  LearnerReport last;
  bool was_live = false;
  int64_t bytes_sent = 0;      // syncer -> learner
  int64_t bytes_received = 0;  // learner -> syncer
  std::map<int, int> refused_in_a_row;  // fragment -> its answers to pulls of it refused since its last merged one
                                        // (diloco.refetch_after, §10)
  std::map<int, double> carried_error;  // fragment -> codec_error of its last merged answer of it (with error
                                        // feedback the residual it carries into the next one, §10); none after
                                        // a refused, raw or re-fetched one
  std::map<int, int64_t> merged_unapplied;  // fragment -> the tokens of this learner's answer of it that a merge took,
                                            // its counter not reset since (goodput: that reset is the apply)
  int64_t rewarm_until = -1;  // a fresh process joined a warm run at global step s: until s + train.warmup_steps it
                              // may be re-warming its lr (core/lr_schedule.h), and its answers then are screened but
                              // kept out of the reference others are compared with (§10); −1: none
};

class SyncerState {
 public:
  /// `theta` holds Θ fragment by fragment (P buffers of the layout's fragment sizes). Throws InputError if the
  /// sizes do not match the layout or the config is invalid.
  SyncerState(const Config& config, FragmentLayout layout, std::vector<std::vector<float>> theta,
              std::function<bool(const std::string&)> is_embedding);

  /// A learner (re)joined: it is live from now on with step = the global step it adopts. `fresh`: a new process (it
  /// held no stream when it joined), which re-warms its lr when its AdamW moments start fresh after step 0; a
  /// running learner re-attaching (after a syncer restart, a lost lease) is not fresh.
  void on_join(int learner, double now_s, bool fresh = true);
  /// Metadata from a learner (docs/protocol.md §3 step 4). Unknown learners are ignored.
  void on_report(int learner, const LearnerReport& report, double now_s);
  /// Checks a learner's metadata before on_report (docs/protocol.md §10): "" when it is possible, else why not (the
  /// caller ignores the report, counts it with count_report_refused and logs the reason). Bounds: step in
  /// [0, max_learner_step()], tokens_trained in [0, 2·train.total_tokens], per-fragment counters non-negative with
  /// tokens ≤ steps · B·T·grad_accum, step_time_s finite in [0, 3600] s, tokens_per_s finite ≥ 0.
  std::string screen_report(const LearnerReport& report) const;
  /// The largest step a learner can report: 3·⌈train.total_tokens / (B·T·grad_accum)⌉ + H + τ (a learner's step is
  /// its own count, or the global step it adopted at a join plus its own since; no learner trains the run's whole
  /// budget three times). Keeps one report from moving the clock (with K = 1) or enumerating 10^12 due rounds.
  int64_t max_learner_step() const;
  void count_report_refused() { ++reports_refused_; }
  int64_t reports_refused() const { return reports_refused_; }
  /// The learner left gracefully (docs/protocol.md §7, scavenging): absent from quorums at once, not after its lease.
  void on_leave(int learner);
  /// An answer to a pull. Late answers (round already merged, or never asked) are dropped; malformed ones
  /// (wrong size, non-finite, unknown base version under stale_policy "skip") and impossible ones (tokens above
  /// steps · B·T·grad_accum, more steps than its step count at the capture, a capture step ahead of its reported
  /// step: docs/protocol.md §10) are refused. `reason` says why.
  /// A refused answer from a learner the round is waiting for ends that wait at once.
  AnswerOutcome on_answer(int learner, PullAnswerData answer, double now_s, std::string* reason);
  /// Refuses an answer that did not reach on_answer (its payload did not decode): counted as kMalformed, and the
  /// round (fragment, round_step) stops waiting for the learner.
  void refuse_undecodable(int learner, int fragment, int64_t round_step);
  /// Advances the clock, opens due rounds, decides quorum/grace, closes answer windows and merges.
  SyncerActions tick(double now_s);

  // Read access for the service, status and persistence.
  const FragmentLayout& layout() const { return layout_; }
  int64_t global_step() const { return global_step_; }
  int64_t version(int p) const { return fragments_[p].version; }
  /// The oldest version of fragment p the syncer still holds as an anchor (docs/protocol.md §4, stale anchors): a
  /// learner whose base is older answers raw θ_p. Not version − (anchor_versions − 1): a restored fragment holds one
  /// anchor only, and a delta against a version before it cannot be merged.
  int64_t oldest_anchor(int p) const { return fragments_[p].anchors.front().first; }
  std::vector<int64_t> versions() const;
  const std::vector<float>& theta(int p) const { return fragments_[p].theta; }
  const std::vector<float>& momentum(int p) const { return fragments_[p].momentum; }
  const std::map<int, LearnerRecord>& learners() const { return learners_; }
  std::map<int, LearnerRecord>& learners() { return learners_; }
  int64_t merges() const { return merges_; }
  int64_t last_quorum() const { return last_quorum_; }
  int64_t answers_dropped() const { return answers_dropped_; }
  int64_t answers_refused() const { return answers_refused_; }
  /// answers_refused by kind (docs/protocol.md §10), every kind present (0 when none).
  std::map<std::string, int64_t> answers_refused_by_kind() const;
  /// Answers scaled down to diloco.clip_ratio × the median, and merges dropped because Θ_p or v_p came out
  /// non-finite (Θ_p and v_p were kept as they were).
  int64_t answers_clipped() const { return answers_clipped_; }
  int64_t merges_dropped() const { return merges_dropped_; }
  /// Times a learner was told to re-fetch Θ (SyncerActions::refetch).
  int64_t refetches() const { return refetches_; }
  /// Σ over merges of the tokens their answers carried (each answer: the learner's tokens since its last merge of
  /// that fragment). Divided by P · tokens_trained() it is the share of the work trained that some merge kept so far
  /// (goodput so far, in tokens; the final flush brings it to ≈ 1 unless work was lost).
  int64_t tokens_merged() const { return tokens_merged_; }
  /// Tokens of work a learner threw away, counted per fragment (P per token): a fragment's counter that went back in
  /// a report with no merge of that learner's answer of it since the counter last went back (merged without it: a
  /// late, refused or missing answer), and what a restarted learner's predecessor held that no merge took.
  /// Goodput is 1 − this / (P · tokens_trained()).
  int64_t tokens_lost() const { return tokens_lost_; }
  /// The tokens of fragment p that learner `rec` holds and no merge took (its counter less what a merge of its answer
  /// took since the counter last went back): lost if the learner never comes back with them.
  static int64_t unmerged_tokens(const LearnerRecord& rec, size_t p);
  /// A new process of a learner joined (not one re-attaching): what its predecessor held and no merge took is lost.
  void on_new_process(int learner);
  /// Σ over rounds of the seconds between reaching the quorum and pulling: time spent in grace windows, s.
  double grace_wait_s() const { return grace_wait_s_; }
  /// Tokens trained over all data streams: Σ_s of the furthest cursor reported for stream s (a stream trained
  /// by several learners in turn, after a kill or a handover, counts once).
  int64_t tokens_trained() const;
  /// True when each of the S data streams has had tokens trained on it (the fixed-share end waits for it).
  bool every_stream_started() const;
  /// Restores stream s's served tokens (after a syncer restart, from its persisted cursor).
  void restore_stream_tokens(int64_t stream, int64_t tokens);
  /// True from a restart (restore_clock) until one liveness lease (diloco's min lease, 5 s) has passed, while a
  /// stream that has trained has no live learner yet: the learners re-attach one by one, each after its own
  /// reconnect backoff, and one that has not yet is neither live nor finished, so an end decided without it would
  /// drop the last work it holds (docs/protocol.md §4). The end waits while this holds.
  bool awaiting_reattach(double now_s) const;
  /// Take-over under fixed shares (docs/protocol.md §7): while a stream offered to a learner is not answered, or was
  /// declined lately because its live holder keeps its log locked, the end waits. Set by the service before every
  /// tick.
  void hold_end(bool held) { end_held_ = held; }
  /// A syncer restarted after its run had finished (state.json says so: e.g. killed between its end and the
  /// launcher's noticing it) stays finished: the learners were told to stop and are gone, and a syncer back in
  /// training would wait for them for ever.
  void restore_finished();
  bool finished() const { return phase_.is(SyncerPhase::kFinished); }
  bool training() const { return phase_.is(SyncerPhase::kTraining); }
  bool is_live(int learner, double now_s) const;

  /// Restores persisted state (after a syncer restart): fragment p's Θ, momentum and version.
  void restore_fragment(int p, std::vector<float> theta, std::vector<float> momentum, int64_t version);
  void restore_clock(int64_t global_step);
  /// Merges of earlier incarnations, the tokens they kept and the tokens thrown away (a resumed run's counters and
  /// goodput cover the whole run).
  void restore_merges(int64_t merges, int64_t tokens_merged, int64_t tokens_lost) {
    merges_ = merges;
    tokens_merged_ = tokens_merged;
    tokens_lost_ = tokens_lost;
  }
  /// The error-feedback allowances to persist (§10): {"<learner id>": {"<fragment>": codec_error}} of every learner
  /// with one. A learner that re-attaches after a syncer restart still carries its residual into its next answer;
  /// without its allowance that answer was screened as if the residual were its own work.
  nlohmann::json carried_errors_json() const;
  /// Restores them from state.json: each learner's map is given to it when it re-joins as the same process
  /// (on_join with fresh = false); a fresh process carries no residual and gets none. Throws InputError naming
  /// the entry when an id or fragment is out of range or an error is not a finite number ≥ 0.
  void restore_carried_errors(const nlohmann::json& carried);

 private:
  /// Goodput's lost work seen in a report against the learner's last one (syncer_goodput.cc).
  void count_lost_work(LearnerRecord& rec, const LearnerReport& report);
  struct FragmentState {
    std::vector<float> theta;      // Θ_p
    std::vector<float> momentum;   // v_p
    int64_t version = 0;
    std::deque<std::pair<int64_t, std::vector<float>>> anchors;  // recent (version, Θ_p) for re-anchoring
    wire::ErrorFeedback down_feedback;  // diloco.wire_down with error feedback: what the last U's codec dropped
    std::deque<double> recent_norms;    // ‖Δ‖/Σlr of the last merged answers (screening's reference, §10)
  };
  struct Round {
    int64_t step = 0;  // u; -1 for the final flush
    RoundState decision_state;
    StateMachine<RoundPhase, 3> phase{RoundPhase::kDue, kRoundMoves};
    double pull_sent_s = 0;
    std::vector<int> requested;
    std::map<int, PullAnswerData> answers;
    std::vector<int> refused;  // requested learners whose answer was refused: not waited for
  };

  void open_rounds(double now_s, SyncerActions& actions);
  void advance_round(int p, Round& round, double now_s, SyncerActions& actions);
  /// One answer of a round on its way through the merge (syncer_merge.cc): its outer gradient anchored at Θ_p and
  /// what the screen and the bookkeeping need of it.
  struct MergeCandidate {
    int learner = 0;
    std::vector<float> grad;  // Δ_m = Θ_p − θ_m, fragment-sized
    double weight = 0;        // tokens² / steps, or 1 (uniform) for a learner that trained
    ScreenEntry screen;       // its steps, sizes per unit of lr and whether it is a raw θ
    double codec_error = 0;   // PullAnswerData::codec_error (the next error-feedback allowance)
    int64_t tokens = 0;
  };
  /// The paper's merge of fragment p's round (docs/protocol.md §4), steps 1–6 in syncer_merge.cc.
  void merge_round(int p, Round& round, double now_s, SyncerActions& actions);
  /// Step 1: each answer's outer gradient anchored at the current Θ_p (answers' deltas are moved out), weight and
  /// sizes for the screen.
  std::vector<MergeCandidate> outer_gradients(int p, Round& round) const;
  /// Step 2: refuses (counted, evented) and clips answers (screening.h); returns the largest ratio kept.
  double screen_round(int p, const Round& round, std::vector<MergeCandidate>& answers, SyncerActions& actions);
  /// Step 6: version_p + 1, the anchor, the screen's reference norms and the learners' records after a merge.
  void publish_merge(int p, const Round& round, const std::vector<MergeCandidate>& answers, double now_s);
  /// Counts a refusal of `kind`; if the learner was asked in fragment's open round `round_step`, stops waiting.
  /// `solicited`: the answer was taken into its round (a norm refusal at the merge); otherwise the refusal counts
  /// towards a re-fetch only if the learner was pulled in that round and had not answered it.
  void refuse(int learner, int fragment, int64_t round_step, RefusalKind kind, bool solicited = false);
  std::vector<LearnerState> learner_states() const;
  double slowest_step_s(double now_s) const;

  Config config_;
  QuorumConfig quorum_;  // K, grace window, γ, τ and lease, from config_.diloco
  LrSchedule schedule_;  // the learners' inner lr schedule (screening compares answers per unit of lr, §10)
  FragmentLayout layout_;
  std::function<bool(const std::string&)> is_embedding_;
  std::vector<FragmentState> fragments_;
  std::map<int, LearnerRecord> learners_;
  std::map<int64_t, int64_t> stream_tokens_;  // stream -> furthest tokens_served reported
  bool end_held_ = false;  // hold_end
  bool restored_ = false;                     // restarted from persisted state (restore_clock, restore_fragment)
  std::map<int, std::map<int, double>> restored_carried_;  // learner -> its allowances, until it re-joins
  double first_join_after_restore_s_ = -1;    // when the first learner joined after the restart; -1 = none yet
  std::deque<DueRound> pending_;
  std::map<int, Round> open_;  // fragment -> its open round
  int64_t global_step_ = 0;
  Ema quorum_ema_, sync_ema_;
  int64_t merges_ = 0, last_quorum_ = 0, answers_dropped_ = 0, answers_refused_ = 0, tokens_merged_ = 0,
          tokens_lost_ = 0;
  int64_t reports_refused_ = 0, answers_clipped_ = 0, merges_dropped_ = 0, refetches_ = 0;
  std::vector<SyncerActions::Refetch> refetch_due_;  // reached diloco.refetch_after since the last tick
  std::map<RefusalKind, int64_t> refused_by_kind_;
  double grace_wait_s_ = 0;
  StateMachine<SyncerPhase, 2> phase_{SyncerPhase::kTraining, kSyncerMoves};
  std::vector<bool> flushed_;
};

}  // namespace dloco
