// The gRPC transport's authentication and encryption (docs/protocol.md §12, issue 16 part 1), against a recording
// handler on loopback: every call without the run secret gets one answer and reaches no handler; a request over its
// size limit is refused before its handler; a server off loopback needs TLS and a secret unless run.insecure; with
// TLS a client without the run's CA is refused, a relay on the path reads no secret (and does without TLS: the
// control), and under mutual TLS a client without a certificate is refused and the caller's name reaches Join.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>

#include <httplib.h>

#include "chaos/link_proxy.h"
#include "monitor/monitor_server.h"
#include "core/check.h"
#include "transport/codec.h"
#include "transport/grpc/grpc_transport.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using wire::Code;

class RecordingSyncer final : public wire::SyncerHandler {
 public:
  wire::Result<wire::JoinReply> join(const wire::JoinRequest& request) override {
    ++calls;
    std::lock_guard lock(mu);
    certificate = request.certificate;
    wire::JoinReply reply;
    reply.session_id = 7;
    return reply;
  }
  wire::Result<wire::Fragment> fragment(uint64_t, int p) override {
    ++calls;
    return wire::Fragment{p, 1, wire::encode(std::vector<float>{1, 2, 3}, wire::Codec::kFp32)};
  }
  wire::Result<wire::Snapshot> snapshot(uint64_t) override {
    ++calls;
    return wire::Snapshot{};
  }
  wire::Status session(uint64_t, wire::SessionPeer& peer) override {
    ++calls;
    wire::LearnerMessage m;
    while (peer.read(&m)) {
    }
    return {};
  }
  wire::StatusReply status() override {
    ++calls;
    wire::StatusReply r;
    r.global_step = 42;
    return r;
  }
  wire::Result<wire::StatusReply> report_eval(const wire::EvalReport&) override {
    ++calls;
    return wire::StatusReply{};
  }
  void refused_call(const char*, const char* reason) override {
    std::lock_guard lock(mu);
    ++refused[reason];
  }
  int refusals(const std::string& reason) {
    std::lock_guard lock(mu);
    return refused[reason];
  }

  std::atomic<int> calls{0};
  std::mutex mu;
  std::map<std::string, int> refused;
  std::string certificate;
};

class RecordingPeer final : public wire::PeerHandler {
 public:
  wire::Result<wire::Fragment> fragment(const wire::Handshake&, int p) override {
    ++calls;
    return wire::Fragment{p, 1, wire::encode(std::vector<float>{1}, wire::Codec::kFp32)};
  }
  std::atomic<int> calls{0};
};

wire::Security with_secret(const std::string& secret) {
  wire::Security s;
  s.secret = secret;
  return s;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

fs::path certificates_root() {
  return fs::temp_directory_path() / ("dloco_tls_" + std::to_string(::getpid()));
}

// Removes the certificates when the tests end.
class CertificatesCleanup : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(certificates_root()); }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new CertificatesCleanup);

// A CA and certificates for "server" and "learner0" made by scripts/make-certs.sh (as a user would), once per CA
// folder name.
fs::path certificates(const std::string& name) {
  const fs::path dir = certificates_root() / name;
  if (!fs::exists(dir / "learner0.pem")) {
    const std::string cmd = std::string(DLOCO_SOURCE_DIR) + "/scripts/make-certs.sh " + dir.string() +
                            " server learner0 >/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return dir;
}

wire::Security tls(const fs::path& dir, const std::string& who, const std::string& secret, bool mutual = false) {
  wire::Security s = with_secret(secret);
  s.cert_pem = read_file(dir / (who + ".pem"));
  s.key_pem = read_file(dir / (who + ".key"));
  s.ca_pem = read_file(dir / "ca.pem");
  s.mutual = mutual;
  return s;
}

TEST(GrpcSecurity, EveryCallWithoutTheSecretGetsOneAnswerAndReachesNoHandler) {
  RecordingSyncer syncer;
  const auto server_side = grpc_transport::make_transport(with_secret("s3cret"));
  const auto server = server_side->serve_syncer("127.0.0.1:0", syncer);
  for (const std::string& token : {std::string(""), std::string("guess"), std::string("s3cret-and-more")}) {
    const auto client = grpc_transport::make_transport(with_secret(token))->connect_syncer(server->address());
    const wire::Status answers[] = {client->join(wire::JoinRequest{}, 5s).status, client->status(5s).status,
                                    client->snapshot(7, 5s).status, client->fragment(7, 0, 5s).status,
                                    client->report_eval(wire::EvalReport{}, 5s).status};
    for (const auto& s : answers) {
      EXPECT_EQ(s.code, Code::kUnauthenticated) << "token '" << token << "': " << s.message;
      EXPECT_EQ(s.message, wire::kNotAuthenticated);
    }
    auto session = client->session(7);
    session->write(wire::Metadata{});
    wire::SyncerMessage m;
    EXPECT_FALSE(session->read(&m));  // the stream ends without reaching the handler
  }
  EXPECT_EQ(syncer.calls.load(), 0);
  EXPECT_EQ(syncer.refusals("unauthenticated"), 3 * 6);

  const auto client = grpc_transport::make_transport(with_secret("s3cret"))->connect_syncer(server->address());
  const auto status = client->status(5s);
  ASSERT_TRUE(status.ok()) << status.status.message;
  EXPECT_EQ(status.value.global_step, 42);
  EXPECT_TRUE(client->join(wire::JoinRequest{}, 5s).ok());
  EXPECT_EQ(syncer.calls.load(), 2);

  // The learner's peer server asks for the same token.
  RecordingPeer peer;
  const auto peer_server = server_side->serve_peer("127.0.0.1", peer);
  const auto stranger = grpc_transport::make_transport(with_secret("guess"))->connect_peer(peer_server->address());
  EXPECT_EQ(stranger->fragment(wire::Handshake{}, 0, 5s).status.code, Code::kUnauthenticated);
  EXPECT_EQ(peer.calls.load(), 0);
  const auto friend_ = grpc_transport::make_transport(with_secret("s3cret"))->connect_peer(peer_server->address());
  EXPECT_TRUE(friend_->fragment(wire::Handshake{}, 0, 5s).ok());
}

TEST(GrpcSecurity, AJoinOverItsSizeLimitIsRefusedBeforeItsHandler) {
  RecordingSyncer syncer;
  const auto transport = grpc_transport::make_transport(with_secret("s3cret"));
  const auto server = transport->serve_syncer("127.0.0.1:0", syncer);
  wire::JoinRequest big;
  big.host = std::string(8 << 20, 'h');  // the probe sent 100 MB; 8 MB keeps the sanitized build quick
  const auto r = transport->connect_syncer(server->address())->join(big, 20s);
  EXPECT_EQ(r.status.code, Code::kInvalid) << r.status.message;
  EXPECT_NE(r.status.message.find("over its limit"), std::string::npos) << r.status.message;
  EXPECT_EQ(syncer.calls.load(), 0);
  EXPECT_EQ(syncer.refusals("oversized"), 1);
  // Unauthenticated, the same request is refused as such and not measured.
  const auto stranger = grpc_transport::make_transport(with_secret(""))->connect_syncer(server->address());
  EXPECT_EQ(stranger->join(big, 20s).status.code, Code::kUnauthenticated);
}

TEST(GrpcSecurity, OffLoopbackAServerNeedsTlsAndASecretUnlessInsecure) {
  RecordingSyncer syncer;
  try {
    (void)grpc_transport::make_transport(with_secret("s3cret"))->serve_syncer("0.0.0.0:0", syncer);
    ADD_FAILURE() << "listened on every interface without TLS";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--insecure"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TLS"), std::string::npos) << e.what();
  }
  wire::Security insecure = with_secret("");
  insecure.insecure = true;
  EXPECT_NO_THROW((void)grpc_transport::make_transport(insecure)->serve_syncer("0.0.0.0:0", syncer));
  EXPECT_NO_THROW((void)grpc_transport::make_transport(wire::Security{})->serve_syncer("127.0.0.1:0", syncer));

  const fs::path dir = certificates("ca1");
  EXPECT_EQ(wire::check_listen_policy("10.0.0.1", tls(dir, "server", "s3cret"), "x"), "");
  EXPECT_THROW(wire::check_listen_policy("10.0.0.1", tls(dir, "server", ""), "x"), InputError);  // no secret
  EXPECT_EQ(wire::check_listen_policy("::1", wire::Security{}, "x"), "");
  EXPECT_THROW(wire::check_listen_policy("", wire::Security{}, "x"), InputError);
}

TEST(GrpcSecurity, WithTlsAClientWithoutTheRunsCaIsRefusedAndARelayReadsNoSecret) {
  const fs::path dir = certificates("ca1"), other = certificates("ca2");
  RecordingSyncer syncer;
  const auto server = grpc_transport::make_transport(tls(dir, "server", "s3cret"))->serve_syncer("127.0.0.1:0", syncer);

  EXPECT_FALSE(grpc_transport::make_transport(with_secret("s3cret"))->connect_syncer(server->address())->status(3s).ok())
      << "a plain-text client was served";
  EXPECT_FALSE(grpc_transport::make_transport(tls(other, "learner0", "s3cret"))
                   ->connect_syncer(server->address())
                   ->status(3s)
                   .ok())
      << "a client trusting another CA was served";
  EXPECT_EQ(syncer.calls.load(), 0);

  LinkProxy relay(server->address());
  relay.record();
  const auto client = grpc_transport::make_transport(tls(dir, "learner0", "s3cret"))->connect_syncer(relay.address());
  const auto joined = client->join(wire::JoinRequest{}, 5s);
  ASSERT_TRUE(joined.ok()) << joined.status.message;
  EXPECT_TRUE(client->status(5s).ok());
  const std::string seen = relay.recorded();
  EXPECT_GT(seen.size(), 1000u);
  EXPECT_EQ(seen.find("s3cret"), std::string::npos) << "the relay read the secret";

  // The control: without TLS the same relay reads it (so the check above can fail).
  RecordingSyncer plain_syncer;
  const auto plain = grpc_transport::make_transport(with_secret("s3cret"))->serve_syncer("127.0.0.1:0", plain_syncer);
  LinkProxy plain_relay(plain->address());
  plain_relay.record();
  EXPECT_TRUE(grpc_transport::make_transport(with_secret("s3cret"))->connect_syncer(plain_relay.address())->status(5s).ok());
  EXPECT_NE(plain_relay.recorded().find("s3cret"), std::string::npos);
}

// A client that dialled before the server was up (the evaluator started beside the syncer) connects once it is.
TEST(GrpcSecurity, ATlsClientThatDialledBeforeTheServerWasUpConnectsOnceItIs) {
  const fs::path dir = certificates("ca1");
  int port = 0;
  {  // a free port: bind one, note it, let it go
    RecordingSyncer probe;
    const auto s = grpc_transport::make_transport(wire::Security{})->serve_syncer("127.0.0.1:0", probe);
    port = std::stoi(s->address().substr(s->address().rfind(':') + 1));
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const auto client = grpc_transport::make_transport(tls(dir, "learner0", "s3cret"))->connect_syncer(address);
  for (int i = 0; i < 4; ++i) {  // nobody listens yet: the client keeps trying, as a learner's join does
    EXPECT_FALSE(client->join(wire::JoinRequest{}, 5s).ok());
    std::this_thread::sleep_for(500ms);
  }
  RecordingSyncer syncer;
  const auto server = grpc_transport::make_transport(tls(dir, "server", "s3cret"))->serve_syncer(address, syncer);
  bool ok = false;
  for (int i = 0; i < 20 && !ok; ++i) {
    ok = client->join(wire::JoinRequest{}, 5s).ok();
    if (!ok) std::this_thread::sleep_for(500ms);
  }
  EXPECT_TRUE(ok) << "the client never reached the server that came up";
}

TEST(GrpcSecurity, UnderMutualTlsAClientNeedsACertificateAndItsNameReachesJoin) {
  const fs::path dir = certificates("ca1");
  RecordingSyncer syncer;
  const auto server =
      grpc_transport::make_transport(tls(dir, "server", "s3cret", /*mutual=*/true))->serve_syncer("127.0.0.1:0", syncer);
  EXPECT_FALSE(grpc_transport::make_transport(tls(dir, "learner0", "s3cret", /*mutual=*/false))
                   ->connect_syncer(server->address())
                   ->join(wire::JoinRequest{}, 3s)
                   .ok())
      << "a client without a certificate was served";
  EXPECT_EQ(syncer.calls.load(), 0);
  const auto joined = grpc_transport::make_transport(tls(dir, "learner0", "s3cret", /*mutual=*/true))
                          ->connect_syncer(server->address())
                          ->join(wire::JoinRequest{}, 5s);
  ASSERT_TRUE(joined.ok()) << joined.status.message;
  std::lock_guard lock(syncer.mu);
  EXPECT_EQ(syncer.certificate, "learner0");
}

// The monitoring endpoint under the same rules: off loopback it needs TLS and a secret (or run.insecure); with them it
// serves HTTPS only, and /metrics wants the bearer token while the page itself (no data) does not.
TEST(GrpcSecurity, TheMonitoringEndpointServesHttpsAndAsksForTheTokenOffLoopback) {
  const MonitorServer::Routes routes{[] { return std::string("dloco_up 1\n"); }, {}, "<html>page</html>"};
  EXPECT_THROW(MonitorServer("0.0.0.0:0", routes, with_secret("s3cret")), InputError);  // no TLS
  wire::Security insecure;
  insecure.insecure = true;
  EXPECT_NO_THROW(MonitorServer("0.0.0.0:0", routes, insecure));

  const fs::path dir = certificates("ca1");
  MonitorServer monitor("0.0.0.0:0", routes, tls(dir, "server", "s3cret"));
  EXPECT_EQ(monitor.url().rfind("https://", 0), 0u) << monitor.url();
  const int port = std::stoi(monitor.address().substr(monitor.address().rfind(':') + 1));
  httplib::Client plain("127.0.0.1", port);
  plain.set_connection_timeout(3, 0);
  const auto refused = plain.Get("/metrics");
  EXPECT_TRUE(!refused || refused->status != 200) << "served over plain HTTP";
  httplib::SSLClient client("127.0.0.1", port);
  client.set_ca_cert_path((dir / "ca.pem").c_str());
  client.enable_server_certificate_verification(true);
  const auto without = client.Get("/metrics");
  ASSERT_TRUE(without) << httplib::to_string(without.error());
  EXPECT_EQ(without->status, 401);
  const auto wrong = client.Get("/metrics", {{"Authorization", "Bearer guess"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  const auto with = client.Get("/metrics", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(with);
  EXPECT_EQ(with->status, 200);
  EXPECT_EQ(with->body, "dloco_up 1\n");
  const auto page = client.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
}

}  // namespace
}  // namespace dloco
