// A learner's bootstrap (docs/protocol.md "Join and bootstrap"): join the syncer and lease a data stream, lock the
// stream's log, then take every fragment Θ_p from a live peer holding at least the syncer's version, else from
// the syncer. A syncer that dies halfway or a stream whose log another live process still holds is retried
// until the deadline; a refused handshake is final.
#pragma once

#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>

#include "data/stream_log.h"
#include "learner/link.h"
#include "learner/peer.h"
#include "process/events.h"

namespace dloco {

struct Bootstrapped {
  wire::JoinReply joined;
  std::unique_ptr<StreamLog> stream_log;  // holds the lock of the leased stream's log
  FetchedFragments fetched;               // P fragments, fragment p at index p
};

/// Bootstraps `P` fragments until `timeout_s`. Returns nullopt when `signal` becomes non-zero first (asked to
/// leave: nothing to hand back). Throws HandshakeRefused on a refused handshake, InputError at the deadline.
/// While the syncer does not answer it says so on the console, prefixed by `who` ("[learner 3]"): at the first
/// failure, then every 10 s with the time left.
std::optional<Bootstrapped> bootstrap(LearnerLink& link, wire::Transport& transport, const wire::Handshake& handshake,
                                      const std::filesystem::path& run_dir, int P, double timeout_s,
                                      EventLog& events, const std::atomic<int>& signal, const std::string& who = "");

}  // namespace dloco
