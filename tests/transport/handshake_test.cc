// The handshake (docs/protocol.md §7 "Handshake", issue 16 part 3): besides the secret, run id and hashes it carries
// the [train] / [diloco] / data.streams settings every process of a run must share, and a mismatch is refused with
// the fields named and both values; role-local settings (intervals, [run]) may differ.
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "transport/handshake.h"
#include "transport/protocol.h"

namespace dloco::wire {
namespace {

Handshake handshake_of(const Config& c) {
  Handshake h;
  h.run_id = c.run.name;
  h.training = training_settings_json(c);
  return h;
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
  // unigram baseline), the quorum and the streams are named with both values.
  Config lr = ours;
  lr.train.lr = 0.3;
  const std::string why = check_handshake(handshake_of(lr), handshake_of(ours));
  EXPECT_NE(why.find("train.lr = 0.3 (expected 0.002)"), std::string::npos) << why;
  Config many = ours;
  many.diloco.quorum = 2, many.data.streams = 8, many.train.shared_budget = true;
  const std::string all = check_handshake(handshake_of(many), handshake_of(ours));
  for (const char* field : {"diloco.quorum = 2", "data.streams = 8", "train.shared_budget = true"}) {
    EXPECT_NE(all.find(field), std::string::npos) << all;
  }
  // A peer that sends none, or garbage, or a huge text is refused (the text comes from another process).
  Handshake none = handshake_of(ours);
  none.training.clear();
  EXPECT_NE(check_handshake(none, handshake_of(ours)).find("no [train]/[diloco] settings"), std::string::npos);
  Handshake garbage = handshake_of(ours);
  garbage.training = "{\"train\": [1, 2";
  EXPECT_NE(check_handshake(garbage, handshake_of(ours)).find("unreadable"), std::string::npos);
  garbage.training = std::string(100000, ' ');
  EXPECT_NE(check_handshake(garbage, handshake_of(ours)).find("64 KiB"), std::string::npos);
  // The secret is checked first: a wrong one learns nothing about the settings.
  Handshake secret = handshake_of(lr);
  secret.secret = "guess";
  EXPECT_EQ(check_handshake(secret, handshake_of(ours)).find("train.lr"), std::string::npos);
}

}  // namespace
}  // namespace dloco::wire
