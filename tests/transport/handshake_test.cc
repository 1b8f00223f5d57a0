// The handshake (docs/protocol.md §7 "Handshake"): besides the secret, run id and hashes it carries the settings
// every process of a run must share as typed values ([model], [train] but the role-local ones, [diloco],
// data.streams), compared by value (doubles within a relative 1e-12); a mismatch is refused with the settings named
// and both values, a peer of an older protocol is told to upgrade, and a peer's oversized list is refused as such.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

#include "core/config.h"
#include "transport/handshake.h"
#include "transport/protocol.h"

namespace dloco::wire {
namespace {

Handshake handshake_of(const Config& c) {
  Handshake h;
  h.run_id = c.run.name;
  h.settings = handshake_settings(c);
  return h;
}

Setting* find(Handshake& h, const std::string& name) {
  for (Setting& s : h.settings) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Handshake, SettingsAreTypedAsTheConfigFieldsAndCoverTheSharedSections) {
  const Config c = parse_config("[model]\npreset = \"tiny\"\n");
  Handshake h = handshake_of(c);
  std::set<std::string> names;
  int model = 0;
  for (const Setting& s : h.settings) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name << " twice";
    model += s.name.rfind("model.", 0) == 0;
    EXPECT_NE(s.name.rfind("run.", 0), 0u) << s.name;
  }
  EXPECT_EQ(model, 11);
  EXPECT_EQ(find(h, "model.d_model")->value, Setting::Value(int64_t{32}));
  EXPECT_EQ(find(h, "model.preset")->value, Setting::Value(std::string("tiny")));
  EXPECT_EQ(find(h, "model.tie_embeddings")->value, Setting::Value(true));
  EXPECT_EQ(find(h, "diloco.screen_ratio")->value, Setting::Value(10.0));  // a double, though whole
  EXPECT_EQ(find(h, "diloco.merge")->value, Setting::Value(std::string("rda")));
  EXPECT_EQ(find(h, "data.streams")->value, Setting::Value(int64_t{0}));
  EXPECT_EQ(find(h, "data.order")->value, Setting::Value(std::string("contiguous")));
  for (const char* local : {"train.eval_interval", "train.eval_tokens", "train.checkpoint_interval",
                            "train.learner_state_interval", "train.log_interval"}) {
    EXPECT_EQ(find(h, local), nullptr) << local;
  }
}

TEST(Handshake, SettingsThatMustAgreeAreComparedAndNamed) {
  const Config ours = parse_config("");
  EXPECT_EQ(check_handshake(handshake_of(ours), handshake_of(ours)), "");
  // Role-local settings may differ.
  Config local = ours;
  local.train.eval_interval = 7, local.train.log_interval = 3, local.train.learner_state_interval = 0;
  local.run.threads = 1, local.run.slowdown = "0:2.0";
  EXPECT_EQ(check_handshake(handshake_of(local), handshake_of(ours)), "");
  // The inner learning rate (a learner started with lr = 0.3 joined silently and the run ended worse than the
  // unigram baseline), the quorum, the streams and a model field are named with both values.
  Config lr = ours;
  lr.train.lr = 0.3;
  const std::string why = check_handshake(handshake_of(lr), handshake_of(ours));
  EXPECT_TRUE(has(why, "train.lr = 0.3 (expected 0.002)")) << why;
  Config many = ours;
  many.diloco.quorum = 2, many.data.streams = 8, many.train.shared_budget = true, many.model.init_std = 0.01;
  const std::string all = check_handshake(handshake_of(many), handshake_of(ours));
  for (const char* field : {"diloco.quorum = 2 (expected 1)", "data.streams = 8", "train.shared_budget = true",
                            "model.init_std = 0.01 (expected 0.02)"}) {
    EXPECT_TRUE(has(all, field)) << all;
  }
  // Two layouts of the data would read overlapping windows: refused.
  Config order = ours;
  order.data.order = DataOrder::kShuffled;
  const std::string why_order = check_handshake(handshake_of(order), handshake_of(ours));
  EXPECT_TRUE(has(why_order, "data.order = \"shuffled\" (expected \"contiguous\")")) << why_order;
  // The secret is checked first: a wrong one learns nothing about the settings.
  Handshake secret = handshake_of(lr);
  secret.secret = "guess";
  EXPECT_FALSE(has(check_handshake(secret, handshake_of(ours)), "train.lr"));
}

TEST(Handshake, DoublesAgreeWithinTheStatedRelativeToleranceOnly) {
  const Config ours = parse_config("");
  Handshake theirs = handshake_of(ours);
  // The same decimal read by another language's parser may differ in the last bit: 1e-13 relative agrees.
  find(theirs, "train.lr")->value = 0.002 * (1 + 1e-13);
  EXPECT_EQ(check_handshake(theirs, handshake_of(ours)), "");
  // 1e-9 relative is another setting.
  find(theirs, "train.lr")->value = 0.002 * (1 + 1e-9);
  EXPECT_TRUE(has(check_handshake(theirs, handshake_of(ours)), "train.lr = 0.002000000002 (expected 0.002)"));
  find(theirs, "train.lr")->value = std::nan("");
  EXPECT_TRUE(has(check_handshake(theirs, handshake_of(ours)), "train.lr = nan"));
  // 0 agrees with 0 only.
  find(theirs, "train.lr")->value = 0.002;
  find(theirs, "diloco.alpha")->value = 1e-300;
  EXPECT_TRUE(has(check_handshake(theirs, handshake_of(ours)), "diloco.alpha"));
}

TEST(Handshake, MissingExtraDuplicateValuelessAndMistypedSettingsAreNamed) {
  const Config ours = parse_config("");
  const Handshake want = handshake_of(ours);
  Handshake got = want;
  got.settings.erase(got.settings.begin());  // the first, a [model] field in to_json's order
  const std::string missing = want.settings.front().name;
  EXPECT_TRUE(has(check_handshake(got, want), missing + " missing")) << check_handshake(got, want);
  got = want;
  got.settings.push_back({"train.momentum", 0.9});
  EXPECT_TRUE(has(check_handshake(got, want), "train.momentum = 0.9 (extra")) << check_handshake(got, want);
  got = want;
  got.settings.push_back(*find(got, "train.lr"));
  EXPECT_TRUE(has(check_handshake(got, want), "train.lr sent twice"));
  got = want;
  find(got, "diloco.quorum")->value = std::monostate{};
  EXPECT_TRUE(has(check_handshake(got, want), "diloco.quorum has no value (expected 1)"));
  // An integer where the field is a double is another type, even when equal: the peer's config table is wrong.
  got = want;
  find(got, "diloco.screen_ratio")->value = int64_t{10};
  EXPECT_TRUE(has(check_handshake(got, want), "diloco.screen_ratio = 10 (an integer; expected a double, 10.0)"))
      << check_handshake(got, want);
  got = want;
  got.settings.clear();
  EXPECT_TRUE(has(check_handshake(got, want), "no [model]/[train]/[diloco] settings"));
  // Many mismatches: six named, the rest counted.
  got = want;
  for (Setting& s : got.settings) s.value = std::monostate{};
  EXPECT_TRUE(has(check_handshake(got, want), " more (every process of a run must share"));
}

TEST(Handshake, APeersOversizedSettingsAreRefusedAsSuch) {
  const Config ours = parse_config("");
  const Handshake want = handshake_of(ours);
  Handshake got = want;
  for (size_t i = 0; got.settings.size() <= kMaxSettings; ++i) got.settings.push_back({"x" + std::to_string(i), 1.0});
  EXPECT_TRUE(has(check_handshake(got, want), "more than 512 settings")) << check_handshake(got, want);
  got = want;
  got.settings.push_back({std::string(kMaxSettingName + 1, 'n'), 1.0});
  EXPECT_TRUE(has(check_handshake(got, want), "name in the handshake is 129 bytes"));
  got = want;
  find(got, "model.preset")->value = std::string(kMaxSettingString + 1, 's');
  EXPECT_TRUE(has(check_handshake(got, want), "a string of 4097 bytes"));
  // A peer's text is shown bounded and printable.
  got = want;
  find(got, "model.preset")->value = std::string("ti\nny") + std::string(200, 'y');
  const std::string why = check_handshake(got, want);
  EXPECT_TRUE(has(why, "model.preset = \"ti?ny")) << why;
  EXPECT_LT(why.size(), 400u);
}

TEST(Handshake, APeerOfAnotherProtocolVersionIsToldWhichSideToUpgrade) {
  const Config ours = parse_config("");
  Handshake old = handshake_of(ours);
  old.protocol_version = 3;  // JSON text and a model hash: it sends no typed settings
  old.settings.clear();
  const std::string why = check_handshake(old, handshake_of(ours));
  EXPECT_TRUE(has(why, "protocol version 3 is older than this process's 5")) << why;
  EXPECT_TRUE(has(why, "upgrade it")) << why;
  Handshake newer = handshake_of(ours);
  newer.protocol_version = kProtocolVersion + 1;
  EXPECT_TRUE(has(check_handshake(newer, handshake_of(ours)), "upgrade the syncer"));
}

}  // namespace
}  // namespace dloco::wire
