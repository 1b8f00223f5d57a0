// The syncer process's service: the gRPC front of SyncerState (spec decoupled-diloco.md §4–§8).
// Threads: gRPC's handler threads (Join, GetFragment, Session readers), one writer thread per learner session,
// and one merger thread that ticks the state every few milliseconds, persists each merged fragment and only
// then broadcasts it. One mutex guards the state; no network call is made while holding it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/config.h"
#include "core/events.h"
#include "proto/dloco.grpc.pb.h"
#include "syncer/syncer_state.h"

namespace dloco {

/// What every peer must agree on (the handshake, spec §4 "Durability", issue: run id, protocol version,
/// secret, and hashes of the fragment layout, model config and tokenizer).
struct HandshakeExpectation {
  std::string run_id;
  std::string secret;
  uint64_t layout_hash = 0;
  uint64_t model_hash = 0;
  uint64_t tokenizer_hash = 0;
};

/// Checks a peer's handshake; returns "" when it matches, else a message naming the first mismatch.
std::string check_handshake(const v1::Handshake& got, const HandshakeExpectation& want);

class SyncerService final : public v1::Syncer::Service {
 public:
  /// `state` is owned by the service. `persist_dir` receives one safetensors file per fragment (Θ_p, v_p,
  /// version), written before the fragment is broadcast, and state.json (clock, cursors).
  SyncerService(const Config& config, std::unique_ptr<SyncerState> state, HandshakeExpectation expect,
                std::filesystem::path run_dir, EventLog* events);
  ~SyncerService() override;

  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest*, v1::JoinReply*) override;
  grpc::Status GetFragment(grpc::ServerContext*, const v1::FragmentRequest*, v1::Fragment*) override;
  grpc::Status GetSnapshot(grpc::ServerContext*, const v1::SnapshotRequest*, v1::Snapshot*) override;
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<v1::SyncerMessage, v1::LearnerMessage>*) override;
  grpc::Status Status(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusReply*) override;
  grpc::Status ReportEval(grpc::ServerContext*, const v1::EvalReport*, v1::StatusReply*) override;

  /// Starts the merger thread.
  void start();
  /// Stops the merger thread and closes every session (learners see the stream end).
  void stop();
  bool finished() const { return finished_.load(); }
  /// Writes a full checkpoint of Θ (model.safetensors + manifest) under run_dir/checkpoints. Thread-safe.
  std::filesystem::path write_checkpoint();

 private:
  struct Outbox {  // messages to one learner session, drained by its writer thread
    std::mutex mu;
    std::condition_variable cv;
    std::deque<v1::SyncerMessage> queue;
    bool closed = false;
    uint64_t session_id = 0;
  };

  void merger_loop();
  void send(int learner, v1::SyncerMessage msg);
  void persist_fragment(const MergedFragmentData& merged, const std::vector<float>& momentum);
  void persist_state();
  void restore();
  bool session_valid(uint64_t session_id, int* learner);
  /// The stream to lease to learner `id` for this Join, or -1 with `refusal` set (code and message).
  int64_t choose_stream(int id, const v1::JoinRequest& req, grpc::Status* refusal);
  void fill_status(v1::StatusReply* reply);
  double now_s() const;

  Config config_;
  HandshakeExpectation expect_;
  std::filesystem::path run_dir_;
  EventLog* events_;
  uint64_t generation_;
  std::chrono::steady_clock::time_point t0_;

  mutable std::mutex mu_;  // guards everything below
  std::unique_ptr<SyncerState> state_;
  std::map<uint64_t, int> sessions_;                  // session id -> learner slot (-1: evaluator)
  std::map<int, std::shared_ptr<Outbox>> outboxes_;   // learner id -> its live session's outbox
  // Data streams (spec §7): S leases. A learner holds one stream while it is live; a restarted learner gets its
  // stream back, a joiner gets a free one (never leased, released by a learner that left, or held by one whose
  // lease ran out). On one machine the stream log's file lock is what makes a lease exclusive (run_learner.cc).
  struct StreamLease {
    int holder = -1;      // learner id holding the lease; -1 = free
    std::string cursor;   // its persisted cursor ("" = the start of the stream)
  };
  std::vector<StreamLease> streams_;
  std::map<int, std::string> peers_;                  // learner id -> its peer server (diloco.bootstrap = "peers")
  double last_val_loss_ = NAN;
  int64_t last_eval_step_ = -1;
  int64_t last_checkpoint_step_ = 0;
  int64_t bytes_sent_ = 0, bytes_received_ = 0;

  std::atomic<bool> running_{false};
  std::atomic<bool> finished_{false};
  bool budget_spent_ = false;  // train.shared_budget: the learners' tokens reached train.total_tokens (under mu_)
  std::thread merger_;
};

}  // namespace dloco
