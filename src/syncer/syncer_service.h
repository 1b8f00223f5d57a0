// The syncer process's service: SyncerState behind the transport interface (docs/protocol.md "Syncer").
// Threads: the transport's handler threads (join, fragment, session readers), one writer thread per session,
// and one merger thread that ticks the state every few milliseconds, persists each merged fragment and only
// then broadcasts it. One mutex guards the state; no network call is made while holding it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <thread>

#include "core/config.h"
#include "core/safetensors.h"
#include "monitor/history.h"
#include "process/events.h"
#include "syncer/stream_leases.h"
#include "syncer/syncer_state.h"
#include "syncer/syncer_store.h"
#include "transport/transport.h"

namespace dloco {

class SyncerService final : public wire::SyncerHandler {
 public:
  /// Writes a full checkpoint of Θ (tensors in layout order, the manifest) under the run folder; returns its path.
  using CheckpointWriter = std::function<std::filesystem::path(const std::vector<SafetensorsEntry>& tensors,
                                                               const nlohmann::json& manifest, int64_t step)>;

  /// `state` is owned by the service. run_dir/syncer receives one safetensors file per fragment (Θ_p, v_p,
  /// version), written before the fragment is handed out, and state.json (clock, cursors). `expect` is the
  /// syncer's own handshake, which every peer's must match.
  SyncerService(const Config& config, std::unique_ptr<SyncerState> state, wire::Handshake expect,
                std::filesystem::path run_dir, EventLog* events, CheckpointWriter write_checkpoint);
  ~SyncerService() override;

  wire::Result<wire::JoinReply> join(const wire::JoinRequest& request) override;
  wire::Result<wire::Fragment> fragment(uint64_t session_id, int p) override;
  wire::Result<wire::Snapshot> snapshot(uint64_t session_id) override;
  wire::Status session(uint64_t session_id, wire::SessionPeer& peer) override;
  wire::StatusReply status() override;
  /// Only the evaluator's session may report, with a step and versions no later than the syncer's and a loss ≥ 0 (NaN
  /// and +inf pass: a diverged global model is news); anything else is refused (kInvalid) and counted in reports_refused (docs/protocol.md §10).
  wire::Result<wire::StatusReply> report_eval(const wire::EvalReport& report) override;
  /// Counts a call the transport refused before it got here (docs/protocol.md §12), by reason; logged at the
  /// 1st, 10th, 100th … of each reason, with the RPC's name and nothing of the request.
  void refused_call(const char* rpc, const char* reason) override;

  /// Starts the merger thread.
  void start();
  /// Stops the merger thread and closes every session (learners see the stream end).
  void stop();
  /// After stop(): persists run_dir/syncer/state.json once more, so it agrees with the final checkpoint and the
  /// report (one source of truth for the global step, tokens and merges: issue 15, "Exact decoupled resume").
  void persist_final_state();
  /// Whether a merge happened since this syncer started (or restored): a resumed run stopped before any merge
  /// writes no checkpoint over the one it resumed from.
  bool merged_since_start();
  /// The version of every fragment's durable Θ_p (what write_checkpoint writes as "fragment_versions").
  std::vector<int64_t> published_versions();
  /// What the dashboard polls (docs/monitoring.md "status.json"): the run's counters, every learner with its state
  /// (live, absent, finished, left) and heartbeat age, the evaluations so far, goodput so far and the history of
  /// the counters and of each learner's loss and tokens/s (sampled every second, thinned as the run grows).
  /// Thread-safe.
  nlohmann::json monitor_status();
  /// The syncer's metrics in Prometheus text format (docs/monitoring.md "Metrics"). Thread-safe.
  std::string metrics_text();
  bool finished() const { return finished_.load(); }
  /// Writes a full checkpoint of the durable Θ (model.safetensors + manifest) under run_dir/checkpoints.
  /// Thread-safe.
  std::filesystem::path write_checkpoint();
  /// Test hook: called by the merger after a merge and before it is persisted (fragment, version). Returning false
  /// stands for the process dying there: the merger stops at once, nothing of that merge is persisted, published
  /// or broadcast. Set before start().
  void set_before_persist(std::function<bool(int, int64_t)> hook) { before_persist_ = std::move(hook); }

 private:
  struct Outbox {  // messages to one learner session, drained by its writer thread
    std::mutex mu;
    std::condition_variable cv;
    std::deque<wire::SyncerMessage> queue;
    bool closed = false;
    uint64_t session_id = 0;
    // diloco.wire_down: fragments this session has carried a merge of, or that the learner's first metadata said
    // it holds at the latest version (under the service's mu_). Until then a merge of p goes whole, afterwards as
    // an update against the version before (a session drops nothing).
    std::vector<bool> carried;
    bool greeted = false;  // the session's first metadata was read
  };

  // The merger thread (merger_thread.cc), one tick after another.
  struct Tick {
    SyncerActions actions;
    std::vector<std::vector<float>> momenta;  // v_p of each merged fragment, to persist with it
    bool checkpoint_due = false;
  };
  void merger_loop();
  /// Ticks the state and sends its pulls and re-fetches (under mu_).
  Tick tick_and_pull();
  /// Writes the tick's decision events to events/syncer.jsonl.
  void emit_decisions(const SyncerActions& actions);
  /// Persists each merged fragment, then publishes and broadcasts it. False when before_persist_ stopped it.
  bool persist_and_broadcast(Tick& tick);
  /// train.shared_budget: BudgetSpent to every unfinished learner, once a second from the moment it is spent.
  void notify_budget_spent(double now, double& last_notice);
  /// Take-over under fixed shares (docs/protocol.md §7): each learner that spent its share and asks for another
  /// stream is offered one whose holder left (StreamLeases::orphan), one stream per learner at a time; an offer not
  /// answered within kOfferTimeout_s is withdrawn. Holds the end while an offer is open, and for kDeclinedFor_s after
  /// a decline (its log is locked by a live process) while that stream is still orphaned with its share unspent.
  /// Nothing is offered outside the training phase or while learners re-attach to a restarted syncer. Under mu_.
  void offer_orphaned_streams(double now);
  /// An answer to learner `learner`'s open offer in its metadata: it trains the stream now, or declined it. Under mu_.
  void answer_offer(int learner, const wire::Metadata& m, double now);
  /// The final flush is done: the final_state event, Stop to every session.
  void finish();
  void send(int learner, const wire::SyncerMessage& msg);
  void on_metadata(int learner, const wire::Metadata& m);
  void on_answer(int learner, const wire::PullAnswer& a);
  void persist_state();
  void emit(const char* event, const nlohmann::json& fields) const;
  void restore();
  void restore_carried_errors(const nlohmann::json& state);  // part of restore()
  bool session_valid(uint64_t session_id, int* learner);
  wire::StatusReply fill_status();
  /// Goodput so far (docs/monitoring.md): 1 − tokens lost / (P · tokens trained), lost = thrown away by a learner
  /// (SyncerState::tokens_lost) or held by one that is not live now; in [0, 1], NaN before any token. Under mu_.
  double goodput(double now) const;
  /// Adds the counters and each live learner's loss and tokens/s to history_ (at most once a second). Under mu_.
  void sample_history(double now);
  double now_s() const;

  Config config_;
  wire::Handshake expect_;
  CheckpointWriter checkpoint_writer_;
  std::filesystem::path run_dir_;
  EventLog* events_;
  uint64_t generation_;
  std::chrono::steady_clock::time_point t0_;

  mutable std::mutex mu_;  // guards everything below
  std::unique_ptr<SyncerState> state_;
  std::map<uint64_t, int> sessions_;                  // session id -> learner slot (-1: evaluator)
  std::map<int, std::shared_ptr<Outbox>> outboxes_;   // learner id -> its live session's outbox
  std::set<int> reattaching_;  // learners that joined holding a stream (running processes re-attaching; under mu_)
  std::map<int, int64_t> bootstrap_bytes_;  // fragments fetched by a learner before its first metadata (under mu_)
  SyncerStore store_;
  StreamLeases streams_;  // data.streams leases (docs/protocol.md §7)
  // Θ_p as handed out: the newest durable version of each fragment (persisted before it appears here).
  struct Published {
    int64_t version = 0;
    std::shared_ptr<const std::vector<float>> theta;
  };
  std::vector<Published> published_;
  std::function<bool(int, int64_t)> before_persist_;
  std::map<int, int64_t> reports_refused_by_learner_;  // docs/protocol.md §10 (under mu_)
  std::map<std::string, int64_t> calls_refused_;        // reason -> calls the transport refused (§12, under mu_)
  std::map<int, std::string> peers_;                  // learner id -> its peer server (diloco.bootstrap = "peers")
  double last_val_loss_ = NAN;
  int64_t last_eval_step_ = -1;
  std::vector<std::pair<int64_t, double>> evals_;  // (global step, validation loss) of every evaluation reported
  MetricHistory history_;  // what the dashboard draws over time (seconds since this incarnation started)
  int64_t last_checkpoint_step_ = 0;
  int64_t bytes_sent_ = 0, bytes_received_ = 0;
  int64_t merges_at_start_ = 0;  // merges restored from an earlier incarnation
  double wall_before_s_ = 0;     // seconds earlier incarnations of this syncer ran

  std::atomic<bool> running_{false};
  std::atomic<bool> finished_{false};
  bool budget_spent_ = false;  // train.shared_budget: the learners' tokens reached train.total_tokens (under mu_)
  // Take-over (under mu_): the learners whose last metadata asked for a stream; each open offer (learner -> stream,
  // when sent); streams a learner declined, not offered again before the time given.
  std::set<int> takes_over_;
  struct Offer {
    int64_t stream = 0;
    double sent_s = 0;
  };
  std::map<int, Offer> offers_;
  std::map<int64_t, double> declined_until_;
  static constexpr double kOfferTimeout_s = 10.0;  // an offer unanswered this long is withdrawn (its learner is gone)
  static constexpr double kDeclinedFor_s = 5.0;    // a declined stream is not offered again for one liveness lease
  static constexpr double kNeverStartedGrace_s = 30.0;  // an untrained stream is not offered before this, s
  std::thread merger_;
};

}  // namespace dloco
