// Bootstrap from a healthy peer (docs/protocol.md §7; the chaos issue's "scavenging"). With
// diloco.bootstrap = "peers", every learner serves the fragments it holds (Θ_p at the version it last applied)
// on a small server of its own (any transport), and a learner that joins or restarts takes each fragment from a peer instead
// of the syncer: the syncer's bandwidth stays for merges. The learner's training thread only swaps a pointer
// when it applies a fragment; the server's threads copy and send.
//
// A joiner takes each fragment from the first source that returns it at a version at least the syncer's at its
// Join (so a peer that has not applied the newest merge yet is passed over for that fragment, and the joiner
// never holds a version older than the syncer handed out); a source that fails mid-transfer (dies, hangs past
// its deadline) is not asked again and the remaining fragments come from the next one. The syncer is the last
// source.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace dloco {

/// The fragments a learner holds, published by its training thread and read by its peer server.
/// publish() and get() take a mutex for a pointer copy only.
class FragmentBoard {
 public:
  explicit FragmentBoard(int fragments) : entries_(static_cast<size_t>(fragments)) {}
  /// Fragment p is now Θ_p at `version` (values shared, never modified afterwards).
  void publish(int p, int64_t version, std::shared_ptr<const std::vector<float>> theta);
  /// Fragment p's version and values; values are null before the first publish.
  std::pair<int64_t, std::shared_ptr<const std::vector<float>>> get(int p) const;
  int fragments() const { return static_cast<int>(entries_.size()); }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<int64_t, std::shared_ptr<const std::vector<float>>>> entries_;
};

/// A learner's peer server: answers fragment requests from a FragmentBoard after checking the caller's handshake
/// (kRefused on a mismatch, kInvalid for a fragment out of range, kUnavailable before the first publish).
class PeerServer final : public wire::PeerHandler {
 public:
  /// Listens on `host`, a free port. Throws InputError if it cannot listen.
  PeerServer(wire::Transport& transport, const std::string& host, wire::Handshake expect, const FragmentBoard& board);
  ~PeerServer() override;
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;
  /// "host:port", as joiners on this machine dial it (a wildcard host given as 127.0.0.1).
  const std::string& address() const { return server_->address(); }
  /// "host:port" as bound (a wildcard host stays a wildcard).
  std::string listen_address() const { return server_->listen_address(); }
  /// Fragments served so far.
  int64_t served() const { return served_.load(); }

  wire::Result<wire::Fragment> fragment(const wire::Handshake& handshake, int p) override;

 private:
  wire::Handshake expect_;
  const FragmentBoard& board_;
  std::atomic<int64_t> served_{0};
  std::unique_ptr<wire::Server> server_;  // last: stops before the members it reads
};

/// One place a joiner can take fragments from. `fetch(p)` returns fragment p or why not (unreachable, refused,
/// dead mid-transfer, past its deadline).
struct FragmentSource {
  std::string name;  // "peer 3 (127.0.0.1:4711)", "syncer"
  std::function<wire::Result<wire::Fragment>(int)> fetch;
};

/// Fetches fragments from the peer server at `address` with `handshake`; deadline `timeout_s` per fragment.
FragmentSource peer_source(wire::Transport& transport, const std::string& name, const std::string& address,
                           const wire::Handshake& handshake, double timeout_s);

/// What fetch_fragments got: the fragments in order, the source of each, and what went wrong on the way.
struct FetchedFragments {
  std::vector<wire::Fragment> fragments;  // P entries, fragment p at index p
  std::vector<std::string> source;      // name of the source each came from
  std::vector<std::string> failures;    // "peer 3 (…): fragment 1: <error>" per failed or too old answer
};

/// Takes fragments 0..P-1, each from the first source in `sources` (in order) that returns it at a version ≥
/// min_versions[p]. A source that fails (or answers a malformed fragment) is not asked again; one that answers
/// with an older version is asked again for the other fragments. Fails with kUnavailable, naming every failure,
/// if some fragment came from no source (a recoverable fault: the caller retries).
wire::Result<FetchedFragments> fetch_fragments(const std::vector<FragmentSource>& sources,
                                               const std::vector<int64_t>& min_versions);

}  // namespace dloco
