// The learner's link to the syncer: all networking on background threads (docs/protocol.md "Learner loop").
// The training thread only calls post() and poll(), which take a mutex for a queue push/pop and never wait on the
// network. The link joins (handshake), keeps one session open, and when the session breaks it re-joins with
// jittered backoff while training goes on. It sees the syncer through wire::SyncerClient only (any transport).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backoff.h"
#include "core/check.h"
#include "transport/transport.h"

namespace dloco {

/// The syncer refused the handshake (wrong secret, layout, model, tokenizer, run or id): retrying cannot help.
class HandshakeRefused : public InputError {
 public:
  using InputError::InputError;
};

class LearnerLink {
 public:
  /// `learner_id` −1 is the evaluator (no session). `seed` seeds the retry jitter (learners must not retry in
  /// lock-step after a syncer restart): pass something that differs per learner.
  LearnerLink(std::unique_ptr<wire::SyncerClient> client, std::string address, wire::Handshake handshake,
              int learner_id, std::string host, uint64_t seed);
  ~LearnerLink();

  /// Joins, retrying an unreachable syncer (or one with no free data stream to lease yet) with backoff for up to
  /// `timeout_s`. Returns the reply, a final refusal (kRefused, kUnauthenticated, kInvalid: retrying cannot help),
  /// or the last retryable failure when the time is up. Never throws: these are recoverable faults.
  wire::Result<wire::JoinReply> try_join(double timeout_s);
  /// The blocking form for a process that cannot go on without the syncer (the evaluator's start): throws
  /// HandshakeRefused on a refusal, InputError when the syncer cannot be reached in time.
  wire::JoinReply join(double timeout_s);
  /// What the next joins tell the syncer: the stream this learner holds (after bootstrap: a re-join keeps it),
  /// streams it found locked by another process in the last 10 s, and its peer server's address ("" = none).
  void set_held_stream(int64_t stream) { held_stream_ = stream; }
  void add_busy_stream(int64_t stream);
  void set_peer_address(std::string address);
  /// The syncer's address as given (host:port).
  const std::string& address() const { return address_; }
  /// Fragment p as the syncer holds it now (deadline 30 s).
  wire::Result<wire::Fragment> fetch_fragment(int p);
  /// A consistent snapshot of every fragment (deadline 60 s); nullopt on failure.
  std::optional<wire::Snapshot> snapshot();
  /// Status of the run (deadline 5 s); nullopt if the syncer is unreachable.
  std::optional<wire::StatusReply> status();
  /// Reports an evaluation (deadline 5 s); false on failure.
  bool report_eval(const wire::EvalReport& report);

  /// Starts the background session (after join()).
  void start();
  /// Queues a message for the syncer (non-blocking). Metadata may be coalesced: only the newest is kept.
  void post(wire::LearnerMessage msg);
  /// Waits up to `timeout` until every queued message has been handed to the session (a learner's last words
  /// before it exits). Returns false if some were still queued.
  bool drain(std::chrono::milliseconds timeout);
  /// Pops one message from the syncer, if any (non-blocking).
  bool poll(wire::SyncerMessage* msg);
  /// Ends the current session so the link re-joins and opens a new one (non-blocking): the syncer sends each
  /// fragment's next merge whole on a new session, so a learner that cannot rebuild an update asks for this.
  void resync();
  /// Number of times the session had to be re-established.
  int reconnects() const { return reconnects_.load(); }
  /// A fatal refusal seen by the background thread (e.g. the syncer restarted with another layout), or "".
  std::string fatal_error() const;
  void stop();
  /// The retry backoff of this link (200 ms to 2 s, jitter seeded by the link's seed), for its owner's retries.
  BackoffConfig backoff_config() const;

 private:
  void session_loop();
  bool rejoin();

  std::unique_ptr<wire::SyncerClient> client_;
  std::string address_;
  wire::Handshake handshake_;
  int learner_id_;
  std::string host_;
  uint64_t seed_;
  std::atomic<uint64_t> session_id_{0};
  std::atomic<int64_t> held_stream_{-1};
  std::vector<std::pair<int64_t, std::chrono::steady_clock::time_point>> busy_streams_;  // under mu_; told to
                                       // the syncer for 10 s (a leaving holder releases its lock within seconds)
  std::string peer_address_;           // under mu_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<wire::LearnerMessage> outbox_;
  std::deque<wire::SyncerMessage> inbox_;
  std::string fatal_;
  std::atomic<bool> running_{false};
  std::atomic<int> reconnects_{0};
  std::thread thread_;
  wire::SessionStream* stream_ = nullptr;  // the current session, to cancel it on stop (under mu_)
};

}  // namespace dloco
