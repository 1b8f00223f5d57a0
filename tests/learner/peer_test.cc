// Bootstrap from peers (learner/peer.h, docs/protocol.md "Join and bootstrap"): a joiner takes each fragment from
// the first source holding at least the syncer's version; a source that dies mid-transfer is left for the next one.
// Over the gRPC transport: a real server per peer on loopback.
#include "learner/peer.h"

#include <gtest/gtest.h>

#include "core/check.h"
#include "transport/codec.h"
#include "transport/grpc/grpc_transport.h"

namespace dloco {
namespace {

wire::Handshake handshake() {
  return {"run", wire::kProtocolVersion, "s3cret", 11, 33, {{"train.lr", 0.002}, {"model.preset", std::string("tiny")}}};
}
wire::Handshake expectation() { return handshake(); }

wire::Transport& grpc() {
  static const auto transport = grpc_transport::make_transport(wire::Security{"s3cret"});
  return *transport;
}

std::shared_ptr<const std::vector<float>> filled(float value, size_t n = 5000) {
  return std::make_shared<const std::vector<float>>(n, value);
}

TEST(PeerBootstrap, ServesWhatTheBoardHoldsAndRefusesAnotherModel) {
  FragmentBoard board(2);
  PeerServer server(grpc(), "127.0.0.1", expectation(), board);
  const FragmentSource peer = peer_source(grpc(), "peer", server.address(), handshake(), 5.0);
  EXPECT_EQ(peer.fetch(0).status.code, wire::Code::kUnavailable);  // nothing published yet: not bootstrapped
  board.publish(0, 7, filled(1.5f));
  board.publish(1, 3, filled(2.5f));
  const wire::Fragment f = peer.fetch(1).value;
  EXPECT_EQ(f.fragment, 1);
  EXPECT_EQ(f.version, 3);
  const auto values = wire::fragment_values(f);
  ASSERT_EQ(values.size(), 5000u);
  EXPECT_EQ(values[4999], 2.5f);
  EXPECT_EQ(peer.fetch(2).status.code, wire::Code::kInvalid);  // no such fragment
  wire::Handshake other = handshake();
  other.layout_hash = 12;
  const auto refused = peer_source(grpc(), "peer", server.address(), other, 5.0).fetch(0);
  EXPECT_EQ(refused.status.code, wire::Code::kRefused) << "a peer of another model was served";
  EXPECT_NE(refused.status.message.find("layout"), std::string::npos) << refused.status.message;
  // The typed settings travel through the protobuf messages and are compared as values.
  other = handshake();
  other.settings[0].value = 0.003;
  const auto settings = peer_source(grpc(), "peer", server.address(), other, 5.0).fetch(0);
  EXPECT_EQ(settings.status.code, wire::Code::kRefused);
  EXPECT_NE(settings.status.message.find("train.lr = 0.003 (expected 0.002)"), std::string::npos)
      << settings.status.message;
  EXPECT_EQ(server.served(), 1);
}

TEST(PeerBootstrap, ASourceThatDiesMidTransferIsLeftForTheNext) {
  FragmentBoard a_board(4), b_board(4);
  for (int p = 0; p < 4; ++p) {
    a_board.publish(p, 5, filled(1.0f + p));
    b_board.publish(p, 5, filled(10.0f + p));
  }
  auto a_server = std::make_unique<PeerServer>(grpc(), "127.0.0.1", expectation(), a_board);
  PeerServer b_server(grpc(), "127.0.0.1", expectation(), b_board);
  const FragmentSource a = peer_source(grpc(), "peer A", a_server->address(), handshake(), 5.0);
  int asked_a = 0;
  const FragmentSource dying{"peer A", [&](int p) {
                               ++asked_a;
                               if (p == 2) a_server.reset();  // the peer dies in the middle of the transfer
                               return a.fetch(p);
                             }};
  const FetchedFragments got =
      fetch_fragments({dying, peer_source(grpc(), "peer B", b_server.address(), handshake(), 5.0)}, {5, 5, 5, 5}).value;
  EXPECT_EQ(got.source, (std::vector<std::string>{"peer A", "peer A", "peer B", "peer B"}));
  EXPECT_EQ(asked_a, 3) << "a source that failed was asked again";
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(wire::fragment_values(got.fragments[p])[0], p < 2 ? 1.0f + p : 10.0f + p) << "fragment " << p;
  }
  ASSERT_EQ(got.failures.size(), 1u);
  EXPECT_NE(got.failures[0].find("fragment 2"), std::string::npos) << got.failures[0];
}

TEST(PeerBootstrap, APeerBehindTheSyncerIsPassedOverForThatFragmentOnly) {
  FragmentBoard board(3);
  board.publish(0, 4, filled(1.0f));
  board.publish(1, 2, filled(2.0f));  // the syncer already merged version 3: the peer has not applied it yet
  board.publish(2, 9, filled(3.0f));
  PeerServer server(grpc(), "127.0.0.1", expectation(), board);
  int asked_syncer = 0;
  const FragmentSource syncer{"syncer", [&](int p) {
                                ++asked_syncer;
                                const std::vector<float> v(5000, 7.0f);
                                return wire::Fragment{p, 3, wire::encode(v, wire::Codec::kFp32)};
                              }};
  const FetchedFragments got =
      fetch_fragments({peer_source(grpc(), "peer", server.address(), handshake(), 5.0), syncer}, {4, 3, 9}).value;
  EXPECT_EQ(got.source, (std::vector<std::string>{"peer", "syncer", "peer"}));
  EXPECT_EQ(asked_syncer, 1);
  EXPECT_EQ(got.fragments[1].version, 3);
  ASSERT_EQ(got.failures.size(), 1u);
  EXPECT_NE(got.failures[0].find("older"), std::string::npos) << got.failures[0];
}

TEST(PeerBootstrap, NoSourceLeftIsAClearError) {
  const auto got = fetch_fragments({peer_source(grpc(), "peer 9 (127.0.0.1:1)", "127.0.0.1:1", handshake(), 2.0)}, {0, 0});
  ASSERT_FALSE(got.ok()) << "fragments came from nowhere";
  EXPECT_EQ(got.status.code, wire::Code::kUnavailable);
  EXPECT_NE(got.status.message.find("no source could give fragment 0"), std::string::npos) << got.status.message;
  EXPECT_NE(got.status.message.find("peer 9"), std::string::npos) << got.status.message;
}

}  // namespace
}  // namespace dloco
