// The gRPC transport; see grpc_transport.h. Two parts: the client side (SyncerClient, PeerClient over stubs) and
// the server side (the generated services forwarding to a SyncerHandler / PeerHandler); the mapping between wire
// types and proto messages is proto_convert.h.
#include "transport/grpc/grpc_transport.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "proto/dloco.grpc.pb.h"
#include "transport/grpc/proto_convert.h"
#include "transport/grpc/grpc_options.h"

namespace dloco::grpc_transport {

namespace {

using wire::Code;

// ---- status codes ----

wire::Status from_grpc(const grpc::Status& s) {
  Code code = Code::kUnavailable;
  switch (s.error_code()) {
    case grpc::StatusCode::OK: return {};
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = Code::kDeadline; break;
    case grpc::StatusCode::FAILED_PRECONDITION: code = Code::kRefused; break;
    case grpc::StatusCode::UNAUTHENTICATED: code = Code::kUnauthenticated; break;
    case grpc::StatusCode::INVALID_ARGUMENT: code = Code::kInvalid; break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: code = Code::kExhausted; break;
    case grpc::StatusCode::ABORTED: code = Code::kAborted; break;
    default: code = Code::kUnavailable; break;
  }
  return {code, s.error_message()};
}

grpc::Status to_grpc(const wire::Status& s) {
  grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE;
  switch (s.code) {
    case Code::kOk: return grpc::Status::OK;
    case Code::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case Code::kDeadline: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case Code::kRefused: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case Code::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case Code::kInvalid: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case Code::kExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case Code::kAborted: code = grpc::StatusCode::ABORTED; break;
  }
  return {code, s.message};
}

// ---- client side ----

class GrpcSession final : public wire::SessionStream {
 public:
  GrpcSession(v1::Syncer::Stub& stub, uint64_t session, const std::string& secret) : session_(session) {
    add_token(context_, secret);
    stream_ = stub.Session(&context_);
  }
  ~GrpcSession() override {
    context_.TryCancel();
    stream_->Finish();
  }
  bool write(const wire::LearnerMessage& message) override {
    v1::LearnerMessage out;
    to_proto(session_, message, &out);
    return stream_->Write(out);
  }
  bool read(wire::SyncerMessage* message) override {
    v1::SyncerMessage in;
    while (stream_->Read(&in)) {
      if (from_proto(in, message)) return true;  // a body this build does not know is skipped
    }
    return false;
  }
  void cancel() override { context_.TryCancel(); }

 private:
  uint64_t session_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::LearnerMessage, v1::SyncerMessage>> stream_;
};

class GrpcSyncerClient final : public wire::SyncerClient {
 public:
  GrpcSyncerClient(const std::string& address, const wire::Security& security)
      : stub_(v1::Syncer::NewStub(make_channel(address, security))), secret_(security.secret) {}

  wire::Result<wire::JoinReply> join(const wire::JoinRequest& request, wire::Deadline deadline) override {
    v1::JoinRequest req;
    to_proto(request, &req);
    v1::JoinReply reply;
    auto ctx = context_with_deadline(deadline, secret_);
    const grpc::Status s = stub_->Join(ctx.get(), req, &reply);
    if (!s.ok()) return from_grpc(s);
    return from_proto(reply);
  }
  wire::Result<wire::Fragment> fragment(uint64_t session, int p, wire::Deadline deadline) override {
    v1::FragmentRequest req;
    req.set_session_id(session);
    req.set_fragment(p);
    v1::Fragment out;
    auto ctx = context_with_deadline(deadline, secret_);
    const grpc::Status s = stub_->GetFragment(ctx.get(), req, &out);
    if (!s.ok()) return from_grpc(s);
    return from_proto(out);
  }
  wire::Result<wire::Snapshot> snapshot(uint64_t session, wire::Deadline deadline) override {
    v1::SnapshotRequest req;
    req.set_session_id(session);
    v1::Snapshot out;
    auto ctx = context_with_deadline(deadline, secret_);
    const grpc::Status s = stub_->GetSnapshot(ctx.get(), req, &out);
    if (!s.ok()) return from_grpc(s);
    return from_proto(out);
  }
  wire::Result<wire::StatusReply> status(wire::Deadline deadline) override {
    v1::StatusReply out;
    auto ctx = context_with_deadline(deadline, secret_);
    const grpc::Status s = stub_->Status(ctx.get(), v1::StatusRequest(), &out);
    if (!s.ok()) return from_grpc(s);
    return from_proto(out);
  }
  wire::Result<wire::StatusReply> report_eval(const wire::EvalReport& report, wire::Deadline deadline) override {
    v1::EvalReport req;
    to_proto(report, &req);
    v1::StatusReply out;
    auto ctx = context_with_deadline(deadline, secret_);
    const grpc::Status s = stub_->ReportEval(ctx.get(), req, &out);
    if (!s.ok()) return from_grpc(s);
    return from_proto(out);
  }
  std::unique_ptr<wire::SessionStream> session(uint64_t session_id) override {
    return std::make_unique<GrpcSession>(*stub_, session_id, secret_);
  }

 private:
  std::unique_ptr<v1::Syncer::Stub> stub_;
  std::string secret_;
};

class GrpcPeerClient final : public wire::PeerClient {
 public:
  GrpcPeerClient(const std::string& address, const wire::Security& security)
      : stub_(v1::Peer::NewStub(make_channel(address, security))), secret_(security.secret) {}
  wire::Result<wire::Fragment> fragment(const wire::Handshake& handshake, int p, wire::Deadline deadline) override {
    v1::PeerFragmentRequest req;
    to_proto(handshake, req.mutable_handshake());
    req.set_fragment(p);
    v1::Fragment out;
    auto ctx = context_with_deadline(deadline, secret_);
    const grpc::Status s = stub_->GetFragment(ctx.get(), req, &out);
    if (!s.ok()) return from_grpc(s);
    return from_proto(out);
  }

 private:
  std::unique_ptr<v1::Peer::Stub> stub_;
  std::string secret_;
};

// ---- server side ----

// Requests a caller may send, by the bytes of the parsed message: a Join or a peer's fragment request carries a
// handshake (its settings ≤ 64 KiB), an EvalReport one version per fragment; the others a few ids. Session
// messages (pull answers carry a whole fragment) are bounded by the channel's limit (grpc_options.h).
constexpr size_t kHandshakeRequestBytes = 160 << 10;
constexpr size_t kSmallRequestBytes = 4 << 10;

// The gate in front of every handler: the bearer token (constant time, one answer for every failure), then the
// request's size. A refused call is reported to the handler by name and reason only (nothing of it is trusted).
template <class Handler>
grpc::Status admit(const grpc::ServerContext* ctx, const std::string& secret, Handler& handler, const char* rpc,
                   size_t bytes, size_t limit) {
  if (!has_token(*ctx, secret)) {
    handler.refused_call(rpc, "unauthenticated");
    return {grpc::StatusCode::UNAUTHENTICATED, wire::kNotAuthenticated};
  }
  if (bytes > limit) {
    handler.refused_call(rpc, "oversized");
    return {grpc::StatusCode::INVALID_ARGUMENT, std::string(rpc) + " request of " + std::to_string(bytes) +
                                                    " bytes is over its limit of " + std::to_string(limit) + " bytes"};
  }
  return grpc::Status::OK;
}

// The name in the caller's verified certificate under mutual TLS ("" otherwise).
std::string certificate_name(const grpc::ServerContext* ctx) {
  const auto auth = ctx->auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  auto names = auth->FindPropertyValues("x509_common_name");
  if (names.empty()) names = auth->GetPeerIdentity();
  return names.empty() ? "" : std::string(names.front().data(), std::min<size_t>(names.front().size(), 256));
}

class SyncerService final : public v1::Syncer::Service {
 public:
  SyncerService(wire::SyncerHandler& handler, std::string secret) : handler_(handler), secret_(std::move(secret)) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req, v1::JoinReply* reply) override {
    if (auto s = admit(ctx, secret_, handler_, "Join", req->ByteSizeLong(), kHandshakeRequestBytes); !s.ok()) return s;
    wire::JoinRequest request = from_proto(*req);
    request.certificate = certificate_name(ctx);
    auto r = handler_.join(request);
    if (r.ok()) to_proto(r.value, reply);
    return to_grpc(r.status);
  }
  grpc::Status GetFragment(grpc::ServerContext* ctx, const v1::FragmentRequest* req, v1::Fragment* out) override {
    if (auto s = admit(ctx, secret_, handler_, "GetFragment", req->ByteSizeLong(), kSmallRequestBytes); !s.ok()) {
      return s;
    }
    auto r = handler_.fragment(req->session_id(), req->fragment());
    if (r.ok()) to_proto(r.value, out);
    return to_grpc(r.status);
  }
  grpc::Status GetSnapshot(grpc::ServerContext* ctx, const v1::SnapshotRequest* req, v1::Snapshot* out) override {
    if (auto s = admit(ctx, secret_, handler_, "GetSnapshot", req->ByteSizeLong(), kSmallRequestBytes); !s.ok()) {
      return s;
    }
    auto r = handler_.snapshot(req->session_id());
    if (r.ok()) to_proto(r.value, out);
    return to_grpc(r.status);
  }
  grpc::Status Session(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<v1::SyncerMessage, v1::LearnerMessage>* stream) override {
    if (auto s = admit(ctx, secret_, handler_, "Session", 0, 0); !s.ok()) return s;
    // The first message names the session; the handler reads it (and the rest) through the peer.
    v1::LearnerMessage first;
    if (!stream->Read(&first)) return grpc::Status::OK;
    Peer peer(ctx, stream, std::move(first));
    return to_grpc(handler_.session(peer.session_id(), peer));
  }
  grpc::Status Status(grpc::ServerContext* ctx, const v1::StatusRequest* req, v1::StatusReply* reply) override {
    if (auto s = admit(ctx, secret_, handler_, "Status", req->ByteSizeLong(), kSmallRequestBytes); !s.ok()) return s;
    to_proto(handler_.status(), reply);
    return grpc::Status::OK;
  }
  grpc::Status ReportEval(grpc::ServerContext* ctx, const v1::EvalReport* req, v1::StatusReply* reply) override {
    if (auto s = admit(ctx, secret_, handler_, "ReportEval", req->ByteSizeLong(), kHandshakeRequestBytes); !s.ok()) {
      return s;
    }
    auto r = handler_.report_eval(from_proto(*req));
    if (r.ok()) to_proto(r.value, reply);
    return to_grpc(r.status);
  }
 private:
  class Peer final : public wire::SessionPeer {
   public:
    Peer(grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::SyncerMessage, v1::LearnerMessage>* stream,
         v1::LearnerMessage first)
        : ctx_(ctx), stream_(stream), first_(std::move(first)), session_(first_.session_id()) {}
    uint64_t session_id() const { return session_; }
    bool read(wire::LearnerMessage* message) override {
      v1::LearnerMessage in;
      for (;;) {
        if (has_first_) {
          in = std::move(first_);
          has_first_ = false;
        } else if (ctx_->IsCancelled() || !stream_->Read(&in)) {
          return false;
        }
        if (in.session_id() != session_) return false;  // a message of another session ends this one
        if (from_proto(in, message)) return true;
      }
    }
    bool write(const wire::SyncerMessage& message) override {
      v1::SyncerMessage out;
      to_proto(message, &out);
      return stream_->Write(out);
    }

   private:
    grpc::ServerContext* ctx_;
    grpc::ServerReaderWriter<v1::SyncerMessage, v1::LearnerMessage>* stream_;
    v1::LearnerMessage first_;
    bool has_first_ = true;
    uint64_t session_;
  };

  wire::SyncerHandler& handler_;
  std::string secret_;
};

class PeerService final : public v1::Peer::Service {
 public:
  PeerService(wire::PeerHandler& handler, std::string secret) : handler_(handler), secret_(std::move(secret)) {}
  grpc::Status GetFragment(grpc::ServerContext* ctx, const v1::PeerFragmentRequest* req, v1::Fragment* out) override {
    if (auto s = admit(ctx, secret_, handler_, "Peer.GetFragment", req->ByteSizeLong(), kHandshakeRequestBytes);
        !s.ok()) {
      return s;
    }
    auto r = handler_.fragment(from_proto(req->handshake()), req->fragment());
    if (r.ok()) to_proto(r.value, out);
    return to_grpc(r.status);
  }

 private:
  wire::PeerHandler& handler_;
  std::string secret_;
};

class GrpcServer final : public wire::Server {
 public:
  GrpcServer(std::unique_ptr<grpc::Service> service, const std::string& address, const std::string& what,
             const wire::Security& security)
      : service_(std::move(service)) {
    // (is_loopback_host and is_wildcard_host take a bracketed IPv6 host as it is)
    if (const std::string warning = wire::check_listen_policy(address.substr(0, address.rfind(':')), security, what);
        !warning.empty()) {
      spdlog::warn("[dloco] {}", warning);
    }
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(address, server_credentials(security), &port);
    configure_server(builder);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (!server_ || port == 0) {
      throw InputError(what + " cannot listen on '" + address + "' (address in use or invalid" +
                       (security.tls() ? ", or run.tls_cert / run.tls_key not a matching PEM certificate and key)" : ")"));
    }
    const std::string host = address.substr(0, address.rfind(':'));
    address_ = (host == "0.0.0.0" || host.empty() ? std::string("127.0.0.1") : host) + ":" + std::to_string(port);
    listen_address_ = (host.empty() ? std::string("0.0.0.0") : host) + ":" + std::to_string(port);
  }
  ~GrpcServer() override { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2)); }
  const std::string& address() const override { return address_; }
  std::string listen_address() const override { return listen_address_; }

 private:
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_, listen_address_;
};

class GrpcTransport final : public wire::Transport {
 public:
  explicit GrpcTransport(wire::Security security) : security_(std::move(security)) {}
  std::unique_ptr<wire::SyncerClient> connect_syncer(const std::string& address) override {
    (void)wire::check_dial_policy(address, security_);
    return std::make_unique<GrpcSyncerClient>(address, security_);
  }
  std::unique_ptr<wire::PeerClient> connect_peer(const std::string& address) override {
    (void)wire::check_dial_policy(address, security_);
    return std::make_unique<GrpcPeerClient>(address, security_);
  }
  std::unique_ptr<wire::Server> serve_syncer(const std::string& address, wire::SyncerHandler& handler) override {
    return std::make_unique<GrpcServer>(std::make_unique<SyncerService>(handler, security_.secret), address,
                                        "the syncer", security_);
  }
  std::unique_ptr<wire::Server> serve_peer(const std::string& host, wire::PeerHandler& handler) override {
    const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
    return std::make_unique<GrpcServer>(std::make_unique<PeerService>(handler, security_.secret),
                                        (v6 ? "[" + host + "]" : host) + ":0", "the learner's peer server", security_);
  }

 private:
  wire::Security security_;
};

}  // namespace

std::unique_ptr<wire::Transport> make_transport(const wire::Security& security) {
  // A client channel that failed to connect fails its fail-fast calls at once, so while a learner backs off no call
  // drives its next connection attempt; only gRPC's backup poller does, every 5 s by default, while each attempt may
  // take at most the 2 s reconnect backoff. A TLS handshake needs several polls: every attempt to reach a syncer that
  // came up after the learner's first try timed out (measured: an evaluator started beside its syncer never joined).
  // Polled every 100 ms, it connects at once. Read by grpc_init, i.e. before the first gRPC object; a user's setting
  // wins.
  ::setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  return std::make_unique<GrpcTransport>(security);
}

}  // namespace dloco::grpc_transport
