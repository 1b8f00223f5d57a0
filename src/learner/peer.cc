// Bootstrap from a healthy peer; see peer.h.
#include "learner/peer.h"

#include <atomic>
#include <chrono>

#include "core/check.h"
#include "transport/grpc_options.h"

namespace dloco {

void FragmentBoard::publish(int p, int64_t version, std::shared_ptr<const std::vector<float>> theta) {
  std::lock_guard lock(mu_);
  entries_.at(static_cast<size_t>(p)) = {version, std::move(theta)};
}

std::pair<int64_t, std::shared_ptr<const std::vector<float>>> FragmentBoard::get(int p) const {
  std::lock_guard lock(mu_);
  return entries_.at(static_cast<size_t>(p));
}

class PeerServer::Service final : public v1::Peer::Service {
 public:
  Service(HandshakeExpectation expect, const FragmentBoard& board) : expect_(std::move(expect)), board_(board) {}

  grpc::Status GetFragment(grpc::ServerContext*, const v1::PeerFragmentRequest* req, v1::Fragment* out) override {
    if (const std::string mismatch = check_handshake(req->handshake(), expect_); !mismatch.empty()) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "refused by the peer: " + mismatch};
    }
    const int p = req->fragment();
    if (p < 0 || p >= board_.fragments()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "fragment " + std::to_string(p) + " does not exist"};
    }
    const auto [version, theta] = board_.get(p);
    if (!theta) return {grpc::StatusCode::UNAVAILABLE, "this learner has not bootstrapped yet"};
    out->set_fragment(p);
    out->set_version(version);
    out->set_dtype("fp32");
    out->set_data(std::string(reinterpret_cast<const char*>(theta->data()), theta->size() * sizeof(float)));
    ++served_;
    return grpc::Status::OK;
  }

  std::atomic<int64_t> served_{0};

 private:
  HandshakeExpectation expect_;
  const FragmentBoard& board_;
};

PeerServer::PeerServer(const std::string& host, HandshakeExpectation expect, const FragmentBoard& board)
    : service_(std::make_unique<Service>(std::move(expect), board)) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(host + ":0", grpc::InsecureServerCredentials(), &port);
  configure_server(builder);
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) throw InputError("the learner's peer server cannot listen on '" + host + ":0'");
  address_ = (host == "0.0.0.0" || host.empty() ? std::string("127.0.0.1") : host) + ":" + std::to_string(port);
}

PeerServer::~PeerServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

int64_t PeerServer::served() const { return service_->served_.load(); }

FragmentSource peer_source(const std::string& name, const std::string& address, const v1::Handshake& handshake,
                           double timeout_s) {
  auto stub = std::shared_ptr<v1::Peer::Stub>(v1::Peer::NewStub(make_channel(address)));
  return {name, [stub, handshake, timeout_s, name](int p) {
            v1::PeerFragmentRequest req;
            *req.mutable_handshake() = handshake;
            req.set_fragment(p);
            v1::Fragment out;
            auto ctx = context_with_deadline(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
            const grpc::Status status = stub->GetFragment(ctx.get(), req, &out);
            if (!status.ok()) throw InputError(status.error_message());
            return out;
          }};
}

FetchedFragments fetch_fragments(const std::vector<FragmentSource>& sources, const std::vector<int64_t>& min_versions) {
  const size_t P = min_versions.size();
  FetchedFragments got;
  got.fragments.resize(P);
  got.source.resize(P);
  std::vector<bool> failed(sources.size(), false);
  for (size_t p = 0; p < P; ++p) {
    for (size_t s = 0; s < sources.size() && got.source[p].empty(); ++s) {
      if (failed[s]) continue;
      try {
        v1::Fragment f = sources[s].fetch(static_cast<int>(p));
        if (f.fragment() != static_cast<int>(p)) throw InputError("answered fragment " + std::to_string(f.fragment()));
        if (f.version() < min_versions[p]) {  // behind the syncer: this fragment from the next source
          got.failures.push_back(sources[s].name + ": fragment " + std::to_string(p) + ": version " +
                                 std::to_string(f.version()) + " is older than the syncer's " +
                                 std::to_string(min_versions[p]));
          continue;
        }
        fragment_values(f);  // throws on a malformed payload
        got.fragments[p] = std::move(f);
        got.source[p] = sources[s].name;
      } catch (const InputError& e) {  // dead, hung or refusing: the rest from the next source
        failed[s] = true;
        got.failures.push_back(sources[s].name + ": fragment " + std::to_string(p) + ": " + e.what());
      }
    }
    if (got.source[p].empty()) {
      std::string why;
      for (const auto& f : got.failures) why += "\n  " + f;
      throw InputError("no source could give fragment " + std::to_string(p) + ":" + (why.empty() ? " no source" : why));
    }
  }
  return got;
}

}  // namespace dloco
