// The syncer's data-stream leases (docs/protocol.md §7 "Data streams"): S streams, each free or held by one
// learner, each with its persisted cursor. Decisions are pure functions of (state, request, who is live) that
// return the decision and its reason (torchft's way), table-tested in tests/syncer/stream_leases_test.cc; the
// service applies them under its lock. On one machine the stream log's file lock is what makes a lease exclusive
// (learner/bootstrap.cc); across machines the syncer's view is all there is.
// Deliberately not here: threads, I/O, the network.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "transport/transport.h"

namespace dloco {

struct StreamLease {
  int holder = -1;     // learner id holding the lease; −1 = free
  std::string cursor;  // its persisted cursor ("" = the start of the stream)
};

/// Which stream a join gets, or why none.
struct LeaseDecision {
  int64_t stream = -1;                // ≥ 0: lease this stream
  wire::Code refusal = wire::Code::kOk;  // otherwise: kRefused (a held stream that does not exist), kAborted (a
                                         // held stream another live learner holds: retry), kExhausted (none free)
  std::string reason;                 // why this stream, or why none
  std::vector<int64_t> release;       // streams this learner's lease is dropped from first (found locked by it)
};

class StreamLeases {
 public:
  using IsLive = std::function<bool(int learner)>;

  /// S streams, all free and at their start.
  explicit StreamLeases(int64_t streams) : leases_(static_cast<size_t>(streams)) {}

  /// The stream learner `id` gets for a join. `held`: a running learner re-attaching keeps the stream whose log it
  /// holds; `busy`: streams it found locked by another live process (the syncer lost track of their holder). In
  /// order: its held stream; a stream it held before (a restarted learner inherits its stream); stream `id` when
  /// free (the launcher's M learners train streams 0 … M−1 whatever order they join in); the free stream that
  /// served the fewest tokens (ties by index). A stream is free when nobody holds it, `id` does, or its holder is
  /// not live.
  LeaseDecision decide(int id, std::optional<int64_t> held, const std::set<int64_t>& busy, const IsLive& is_live) const;
  /// Applies a decision: the `release` streams held by `id` become free, then `id` holds `stream` and no other.
  /// Returns the stream's previous holder.
  int grant(int id, const LeaseDecision& decision);
  /// Metadata from `id` training `stream`: a free stream is claimed back by the learner training it (its lease ran
  /// out while its link was cut), which then holds no other. Returns whether `id` holds it (its tokens count only
  /// then).
  bool claim(int id, int64_t stream, bool leaving);
  /// The holder left gracefully: the stream is free at once.
  void release(int64_t stream);

  /// Take-over under fixed shares (docs/protocol.md §7): the stream to offer a learner that spent its own share,
  /// or nullopt. A stream is orphaned when its share is unspent (tokens(s) + `tokens_per_step` ≤ `share`, the rule
  /// by which a learner finishes) and nobody holds it or its holder is not live (its lease ran out). `excluded`:
  /// streams already offered, or declined lately. The least advanced orphan first (ties by index).
  std::optional<int64_t> orphan(int64_t share, int64_t tokens_per_step, const std::set<int64_t>& excluded,
                                const IsLive& is_live) const;
  /// Whether `stream` is orphaned by the rule above.
  bool is_orphan(int64_t stream, int64_t share, int64_t tokens_per_step, const IsLive& is_live) const;
  /// Offers `stream` to learner `id`: it holds it beside the stream it spent until it answers, so no other learner
  /// is offered it. Returns the stream's previous holder.
  int offer(int id, int64_t stream);
  /// `id` trains `stream` now (its metadata names it): it holds it and no other stream.
  void accept(int id, int64_t stream);
  /// `id` could not take `stream` (its log is locked by a live process): free again if `id` holds it, for its
  /// holder's next metadata to claim it back.
  void decline(int id, int64_t stream);

  int64_t size() const { return static_cast<int64_t>(leases_.size()); }
  const StreamLease& at(int64_t stream) const { return leases_.at(static_cast<size_t>(stream)); }
  void set_cursor(int64_t stream, std::string cursor) { leases_.at(static_cast<size_t>(stream)).cursor = std::move(cursor); }
  /// Tokens stream s has served, from its cursor ("" or unreadable: 0).
  int64_t tokens(int64_t stream) const;

  /// {"cursors": {stream: cursor}, "leases": {stream: holder}} for syncer/state.json.
  nlohmann::json to_json() const;
  /// Restores what to_json wrote; streams beyond S (data.streams shrank) are returned, not restored.
  std::vector<int64_t> restore(const nlohmann::json& state);

 private:
  // Makes `id` the holder of `stream` and of no other stream (one stream per learner).
  void hold_only(int id, int64_t stream);

  std::vector<StreamLease> leases_;
};

}  // namespace dloco
