// Bootstrap from a healthy peer; see peer.h.
#include "learner/peer.h"

#include <atomic>
#include <chrono>

#include "core/check.h"
#include "transport/codec.h"

namespace dloco {

void FragmentBoard::publish(int p, int64_t version, std::shared_ptr<const std::vector<float>> theta) {
  std::lock_guard lock(mu_);
  entries_.at(static_cast<size_t>(p)) = {version, std::move(theta)};
}

std::pair<int64_t, std::shared_ptr<const std::vector<float>>> FragmentBoard::get(int p) const {
  std::lock_guard lock(mu_);
  return entries_.at(static_cast<size_t>(p));
}

PeerServer::PeerServer(wire::Transport& transport, const std::string& host, wire::Handshake expect,
                       const FragmentBoard& board)
    : expect_(std::move(expect)), board_(board), server_(transport.serve_peer(host, *this)) {}

PeerServer::~PeerServer() { server_.reset(); }

wire::Result<wire::Fragment> PeerServer::fragment(const wire::Handshake& handshake, int p) {
  if (const std::string mismatch = wire::check_handshake(handshake, expect_); !mismatch.empty()) {
    if (mismatch == wire::kNotAuthenticated) return wire::Status{wire::Code::kUnauthenticated, mismatch};
    return wire::Status{wire::Code::kRefused, "refused by the peer: " + mismatch};
  }
  if (p < 0 || p >= board_.fragments()) {
    return wire::Status{wire::Code::kInvalid, "fragment " + std::to_string(p) + " does not exist"};
  }
  const auto [version, theta] = board_.get(p);
  if (!theta) return wire::Status{wire::Code::kUnavailable, "this learner has not bootstrapped yet"};
  ++served_;
  return wire::Fragment{p, version, wire::encode(*theta, wire::Codec::kFp32)};
}

FragmentSource peer_source(wire::Transport& transport, const std::string& name, const std::string& address,
                           const wire::Handshake& handshake, double timeout_s) {
  std::shared_ptr<wire::PeerClient> client = transport.connect_peer(address);
  return {name, [client, handshake, timeout_s](int p) {
            return client->fragment(handshake, p, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
          }};
}

wire::Result<FetchedFragments> fetch_fragments(const std::vector<FragmentSource>& sources,
                                               const std::vector<int64_t>& min_versions) {
  const size_t P = min_versions.size();
  FetchedFragments got;
  got.fragments.resize(P);
  got.source.resize(P);
  std::vector<bool> failed(sources.size(), false);
  for (size_t p = 0; p < P; ++p) {
    for (size_t s = 0; s < sources.size() && got.source[p].empty(); ++s) {
      if (failed[s]) continue;
      auto r = sources[s].fetch(static_cast<int>(p));
      std::string bad = r.ok() ? "" : r.status.message;
      if (r.ok() && r.value.fragment != static_cast<int>(p)) bad = "answered fragment " + std::to_string(r.value.fragment);
      std::vector<float> values;
      if (bad.empty() && r.value.payload.codec != "fp32") bad = "fragment is not fp32";
      if (bad.empty()) bad = wire::decode(r.value.payload, values);
      if (!bad.empty()) {  // dead, hung, refusing or malformed: the rest from the next source
        failed[s] = true;
        got.failures.push_back(sources[s].name + ": fragment " + std::to_string(p) + ": " + bad);
        continue;
      }
      if (r.value.version < min_versions[p]) {  // behind the syncer: this fragment from the next source
        got.failures.push_back(sources[s].name + ": fragment " + std::to_string(p) + ": version " +
                               std::to_string(r.value.version) + " is older than the syncer's " +
                               std::to_string(min_versions[p]));
        continue;
      }
      got.fragments[p] = std::move(r.value);
      got.source[p] = sources[s].name;
    }
    if (got.source[p].empty()) {
      std::string why;
      for (const auto& f : got.failures) why += "\n  " + f;
      return wire::Status{wire::Code::kUnavailable,
                          "no source could give fragment " + std::to_string(p) + ":" + (why.empty() ? " no source" : why)};
    }
  }
  return got;
}

}  // namespace dloco
