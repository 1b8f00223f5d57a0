// The transport interface (gloo's way: the roles see an abstract transport; the backends live behind it).
// Two sides:
//   - what a learner (or the evaluator, or the launcher) needs from the syncer: SyncerClient;
//   - what the syncer serves: SyncerHandler, put on an address by Transport::serve_syncer;
// and the same pair for a learner's peer server (bootstrap from a peer): PeerClient / PeerHandler.
// Implementations: transport/grpc (processes, machines) and transport/inproc (threads of one process, with
// fault hooks for tests). Every blocking call takes a deadline; failures are returned as a Status (error tier 2,
// core/check.h), never thrown, except a server that cannot listen (bad set-up: InputError).
// Deliberately not here: how bytes travel, threads of the roles, retries (learner/link.h does those).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "transport/protocol.h"

namespace dloco::wire {

/// Why a call failed. The learner's link retries kUnavailable, kDeadline, kExhausted and kAborted; the others are
/// final (a refused handshake, a bad argument).
enum class Code {
  kOk,
  kUnavailable,      // the other side cannot be reached or the connection broke
  kDeadline,         // no answer within the call's deadline
  kRefused,          // handshake mismatch (model, layout, tokenizer, run, protocol version)
  kUnauthenticated,  // no or a wrong run secret (one message for every such refusal), or a session the syncer
                     // does not know
  kInvalid,          // a malformed request (id or fragment out of range)
  kExhausted,        // no free data stream to lease yet
  kAborted,          // a lease conflict that resolves itself: retry
};

/// "unavailable", "deadline", ... for logs and events.
const char* to_string(Code code);

struct Status {
  Code code = Code::kOk;
  std::string message;
  bool ok() const { return code == Code::kOk; }
  /// Retrying may help (see Code).
  bool retryable() const {
    return code == Code::kUnavailable || code == Code::kDeadline || code == Code::kExhausted || code == Code::kAborted;
  }
};

/// A value or the Status saying why there is none.
template <class T>
struct Result {
  Status status;
  T value{};
  Result() = default;
  Result(T v) : value(std::move(v)) {}  // NOLINT: implicit, so handlers can `return reply;`
  Result(Status s) : status(std::move(s)) {}  // NOLINT
  bool ok() const { return status.ok(); }
};

using Deadline = std::chrono::milliseconds;

/// Who may call this process's servers and how calls are protected (docs/protocol.md §12). Built from run.secret /
/// DLOCO_SECRET and run.tls_* by dloco::transport_security (transport/handshake.h).
struct Security {
  std::string secret;    // the run's shared secret: every call carries it as a bearer token, every server compares
                         // it in constant time before anything else ("" = no token: refused off loopback)
  std::string cert_pem;  // this process's certificate chain (PEM): its servers present it, and under mutual TLS its
                         // clients too
  std::string key_pem;   // the private key of cert_pem
  std::string ca_pem;    // the run's CA (PEM): clients verify servers against it; under mutual TLS servers verify
                         // clients against it. Set = TLS on every channel and server
  bool mutual = false;   // servers require a client certificate signed by the CA (its name is logged at Join)
  bool insecure = false; // allow listening off loopback without TLS and a secret (a warning is printed)
  bool tls() const { return !ca_pem.empty(); }
};

/// The one answer to a call that is not authenticated (no token, a wrong one, a wrong secret in a handshake): the
/// same code and text whatever was wrong, so nothing can be guessed from it.
inline constexpr const char* kNotAuthenticated =
    "not authenticated: the run secret (run.secret or DLOCO_SECRET) is missing or wrong";

/// Throws InputError if a server of `what` may not listen on `host` under `security`: off loopback it needs TLS and a
/// non-empty secret, unless security.insecure (then it returns a warning to print). "" when all is well.
std::string check_listen_policy(const std::string& host, const Security& security, const std::string& what);

/// Throws InputError if a client may not dial `address` ("host:port") under `security`: off loopback without TLS it
/// would send the secret in clear text, unless security.insecure. "" when all is well.
std::string check_dial_policy(const std::string& address, const Security& security);

/// The learner's end of one session: metadata and pull answers go up, pull requests and merged fragments come
/// down. One thread may read while another writes; cancel() from any thread unblocks both.
class SessionStream {
 public:
  virtual ~SessionStream() = default;
  /// Sends one message; false when the session is broken.
  virtual bool write(const LearnerMessage& message) = 0;
  /// Blocks until a message arrives; false when the session ended or broke.
  virtual bool read(SyncerMessage* message) = 0;
  virtual void cancel() = 0;
};

/// What a learner needs from the syncer.
class SyncerClient {
 public:
  virtual ~SyncerClient() = default;
  /// The handshake; a learner leases a data stream. kRefused / kUnauthenticated / kInvalid are final.
  virtual Result<JoinReply> join(const JoinRequest& request, Deadline deadline) = 0;
  /// Fragment p as the syncer holds it now.
  virtual Result<Fragment> fragment(uint64_t session_id, int p, Deadline deadline) = 0;
  /// Every fragment with its version, taken under one lock.
  virtual Result<Snapshot> snapshot(uint64_t session_id, Deadline deadline) = 0;
  virtual Result<StatusReply> status(Deadline deadline) = 0;
  virtual Result<StatusReply> report_eval(const EvalReport& report, Deadline deadline) = 0;
  /// Opens a session; its first message must be Metadata (the hello) for `session_id`.
  virtual std::unique_ptr<SessionStream> session(uint64_t session_id) = 0;
};

/// The syncer's end of one session.
class SessionPeer {
 public:
  virtual ~SessionPeer() = default;
  /// Blocks until a message arrives; false when the learner ended the session or it broke.
  virtual bool read(LearnerMessage* message) = 0;
  virtual bool write(const SyncerMessage& message) = 0;
};

/// What the syncer serves. Called on the transport's threads, concurrently.
class SyncerHandler {
 public:
  virtual ~SyncerHandler() = default;
  virtual Result<JoinReply> join(const JoinRequest& request) = 0;
  virtual Result<Fragment> fragment(uint64_t session_id, int p) = 0;
  virtual Result<Snapshot> snapshot(uint64_t session_id) = 0;
  /// Runs for the life of one session (reads until it ends) on a thread of its own.
  virtual Status session(uint64_t session_id, SessionPeer& peer) = 0;
  virtual StatusReply status() = 0;
  virtual Result<StatusReply> report_eval(const EvalReport& report) = 0;
  /// The transport refused a call before it reached the handler: `rpc` ("Join", "Status", …), `reason`
  /// ("unauthenticated", "oversized"). Nothing of the request is passed (it is not trusted). Default: ignored.
  virtual void refused_call(const char* rpc, const char* reason) { (void)rpc, (void)reason; }
};

/// What a learner's peer server serves to joiners: fragment p at the version it last applied.
class PeerHandler {
 public:
  virtual ~PeerHandler() = default;
  virtual Result<Fragment> fragment(const Handshake& handshake, int p) = 0;
  /// As SyncerHandler::refused_call. Default: ignored.
  virtual void refused_call(const char* rpc, const char* reason) { (void)rpc, (void)reason; }
};

class PeerClient {
 public:
  virtual ~PeerClient() = default;
  virtual Result<Fragment> fragment(const Handshake& handshake, int p, Deadline deadline) = 0;
};

/// A listening server; it stops (and its handler is no longer called) when destroyed.
class Server {
 public:
  virtual ~Server() = default;
  /// "host:port" as others dial it (for gRPC, a wildcard host is given as 127.0.0.1).
  virtual const std::string& address() const = 0;
  /// "host:port" as bound: the host asked for (a wildcard stays 0.0.0.0), the port the system picked.
  virtual std::string listen_address() const { return address(); }
};

class Transport {
 public:
  virtual ~Transport() = default;
  /// A client of the syncer at `address`; never blocks (the first call connects).
  virtual std::unique_ptr<SyncerClient> connect_syncer(const std::string& address) = 0;
  virtual std::unique_ptr<PeerClient> connect_peer(const std::string& address) = 0;
  /// Serves `handler` on `address` ("host:port"; port 0 picks a free one). Throws InputError if it cannot listen.
  virtual std::unique_ptr<Server> serve_syncer(const std::string& address, SyncerHandler& handler) = 0;
  /// Serves `handler` on `host`, any free port. Throws InputError if it cannot listen.
  virtual std::unique_ptr<Server> serve_peer(const std::string& host, PeerHandler& handler) = 0;
};

}  // namespace dloco::wire
