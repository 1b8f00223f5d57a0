// The handshake's typed settings through proto/dloco.proto (transport/grpc/proto_convert.cc): every value type
// survives the round trip as itself, a setting sent without a value arrives valueless (check_handshake names it),
// and a peer's list is read only up to one past the bound check_handshake refuses.
#include <gtest/gtest.h>

#include <string>

#include "transport/grpc/proto_convert.h"
#include "transport/protocol.h"

namespace dloco::grpc_transport {
namespace {

TEST(ProtoConvert, TheHandshakesSettingsKeepTheirTypes) {
  wire::Handshake h{"run", wire::kProtocolVersion, "s3cret", 0x1234, 0x5678, {}};
  h.settings = {{"model.d_model", int64_t{-32}},
                {"train.lr", 0.002},
                {"diloco.screen_ratio", 10.0},
                {"model.tie_embeddings", false},
                {"diloco.merge", std::string("rda")},
                {"train.none", std::monostate{}}};
  v1::Handshake msg;
  to_proto(h, &msg);
  // Parsed from the bytes, as a peer receives it.
  v1::Handshake wire;
  ASSERT_TRUE(wire.ParseFromString(msg.SerializeAsString()));
  EXPECT_EQ(wire.settings(2).value_case(), v1::Setting::kDoubleValue);  // 10.0 is not the integer 10
  EXPECT_EQ(wire.settings(5).value_case(), v1::Setting::VALUE_NOT_SET);
  const wire::Handshake back = from_proto(wire);
  EXPECT_EQ(back.run_id, "run");
  EXPECT_EQ(back.protocol_version, wire::kProtocolVersion);
  EXPECT_EQ(back.layout_hash, 0x1234u);
  EXPECT_EQ(back.tokenizer_hash, 0x5678u);
  EXPECT_EQ(back.settings, h.settings);
}

TEST(ProtoConvert, APeersSettingsAreReadOnlyToOnePastTheBound) {
  v1::Handshake msg;
  msg.set_protocol_version(wire::kProtocolVersion);
  for (size_t i = 0; i < 3 * wire::kMaxSettings; ++i) {
    v1::Setting* s = msg.add_settings();
    s->set_name("x" + std::to_string(i));
    s->set_int_value(1);
  }
  const wire::Handshake got = from_proto(msg);
  EXPECT_EQ(got.settings.size(), wire::kMaxSettings + 1);
  wire::Handshake want;
  EXPECT_NE(wire::check_handshake(got, want).find("more than 512 settings"), std::string::npos);
}

}  // namespace
}  // namespace dloco::grpc_transport
