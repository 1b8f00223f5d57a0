// Stream leasing (syncer/stream_leases.h, docs/protocol.md §7): the decisions as a table, set by hand.
#include "syncer/stream_leases.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "core/safetensors.h"
#include "syncer/syncer_store.h"

#include <gtest/gtest.h>

namespace dloco {
namespace {

// S = 4 streams; holders set per case; `live` the learners that are live.
struct Case {
  const char* name;
  std::vector<int> holders;         // holder of each stream (−1 free)
  std::vector<int64_t> tokens;      // tokens each stream served
  std::set<int> live;
  int id;
  std::optional<int64_t> held;
  std::set<int64_t> busy;
  int64_t want_stream;
  wire::Code want_code;
  std::vector<int64_t> want_release;
};

StreamLeases leases_of(const Case& c) {
  StreamLeases l(static_cast<int64_t>(c.holders.size()));
  nlohmann::json state = {{"cursors", nlohmann::json::object()}, {"leases", nlohmann::json::object()}};
  for (size_t s = 0; s < c.holders.size(); ++s) {
    if (c.holders[s] >= 0) state["leases"][std::to_string(s)] = c.holders[s];
    if (!c.tokens.empty()) state["cursors"][std::to_string(s)] = nlohmann::json{{"tokens_served", c.tokens[s]}}.dump();
  }
  l.restore(state);
  return l;
}

TEST(StreamLeases, DecisionsFollowTheirOrderAndSayWhy) {
  using C = wire::Code;
  const std::vector<Case> cases = {
      {"own slot's stream when free", {-1, -1, -1, -1}, {}, {}, 2, {}, {}, 2, C::kOk, {}},
      {"a restart inherits the stream it held", {-1, -1, -1, 1}, {}, {}, 1, {}, {}, 3, C::kOk, {}},
      {"a joiner takes the least advanced free stream", {0, -1, -1, -1}, {50, 40, 10, 10}, {0}, 7, {}, {}, 2, C::kOk, {}},
      {"a dead holder's stream is free", {0, 1, 2, 3}, {5, 5, 5, 5}, {0, 1, 3}, 9, {}, {}, 2, C::kOk, {}},
      {"slot stream held by a live learner: the next free one", {-1, 5, -1, -1}, {}, {5}, 1, {}, {}, 0, C::kOk, {}},
      {"re-attach keeps its held stream", {-1, 4, -1, -1}, {}, {4}, 4, 1, {}, 1, C::kOk, {}},
      {"re-attach to a stream another live learner holds: retry", {-1, 5, -1, -1}, {}, {5}, 4, 1, {}, -1, C::kAborted, {}},
      {"re-attach to a stream that does not exist", {-1, -1, -1, -1}, {}, {}, 4, 9, {}, -1, C::kRefused, {}},
      {"busy streams are skipped and its lease on them dropped", {3, -1, -1, -1}, {}, {}, 3, {}, {0, 3}, 1, C::kOk, {0}},
      {"none free", {0, 1, 2, 3}, {}, {0, 1, 2, 3}, 8, {}, {}, -1, C::kExhausted, {}},
  };
  for (const Case& c : cases) {
    const StreamLeases l = leases_of(c);
    const LeaseDecision d = l.decide(c.id, c.held, c.busy, [&](int who) { return c.live.count(who) > 0; });
    EXPECT_EQ(d.stream, c.want_stream) << c.name << ": " << d.reason;
    EXPECT_EQ(d.refusal, c.want_code) << c.name << ": " << d.reason;
    EXPECT_EQ(d.release, c.want_release) << c.name;
    EXPECT_FALSE(d.reason.empty()) << c.name;
  }
}

TEST(StreamLeases, GrantHoldsOneStreamPerLearnerAndClaimsAndReleases) {
  StreamLeases l(3);
  LeaseDecision d;
  d.stream = 0;
  EXPECT_EQ(l.grant(7, d), -1);
  d.stream = 2;
  l.grant(7, d);  // a stale lease of the same id is released
  EXPECT_EQ(l.at(0).holder, -1);
  EXPECT_EQ(l.at(2).holder, 7);
  EXPECT_TRUE(l.claim(7, 2, false));
  EXPECT_FALSE(l.claim(8, 2, false)) << "a stream another learner holds was claimed";
  EXPECT_TRUE(l.claim(8, 1, false)) << "a free stream is claimed back by the learner training it";
  EXPECT_FALSE(l.claim(9, 0, true)) << "a leaving learner claimed a stream";
  EXPECT_FALSE(l.claim(9, 5, false)) << "a stream that does not exist";
  l.release(2);
  EXPECT_EQ(l.at(2).holder, -1);
}

// Take-over under fixed shares: share 100 tokens, 10 a step (a stream is spent at 91 or more).
TEST(StreamLeases, AnOrphanedStreamIsOneWhoseShareIsUnspentAndWhoseHolderIsGone) {
  struct Orphan {
    const char* name;
    std::vector<int> holders;
    std::vector<int64_t> tokens;
    std::set<int> live;
    std::set<int64_t> excluded;
    std::optional<int64_t> want;
  };
  const std::vector<Orphan> cases = {
      {"every holder live", {0, 1, 2, 3}, {100, 40, 30, 20}, {0, 1, 2, 3}, {}, std::nullopt},
      {"a dead holder's unspent stream", {0, 1, 2, 3}, {100, 40, 30, 20}, {0, 2, 3}, {}, 1},
      {"a free unspent stream (its holder left)", {0, -1, 2, 3}, {100, 40, 30, 20}, {0, 2, 3}, {}, 1},
      {"a spent stream is no orphan", {0, 1, 2, 3}, {100, 91, 30, 20}, {0, 2, 3}, {}, std::nullopt},
      {"the last step that fits: 90 + 10 ≤ 100", {0, 1, 2, 3}, {100, 90, 30, 20}, {0, 2, 3}, {}, 1},
      {"the least advanced orphan first", {0, 1, 2, 3}, {100, 40, 30, 20}, {0}, {}, 3},
      {"offered or declined streams are excluded", {0, 1, 2, 3}, {100, 40, 30, 20}, {0}, {3}, 2},
      {"a stream never started whose learner never came", {0, -1, 2, 3}, {100, 0, 30, 20}, {0, 2, 3}, {}, 1},
  };
  for (const Orphan& c : cases) {
    const StreamLeases l = leases_of({c.name, c.holders, c.tokens, c.live, 0, {}, {}, 0, wire::Code::kOk, {}});
    EXPECT_EQ(l.orphan(100, 10, c.excluded, [&](int who) { return c.live.count(who) > 0; }), c.want) << c.name;
  }
}

TEST(StreamLeases, AnOfferIsHeldBesideTheSpentStreamUntilAcceptedOrDeclined) {
  StreamLeases l(3);
  LeaseDecision d;
  d.stream = 0;
  l.grant(7, d);
  d.stream = 1;
  l.grant(8, d);
  EXPECT_EQ(l.offer(7, 1), 8);
  EXPECT_EQ(l.at(0).holder, 7) << "the spent stream was released before the offer was answered";
  EXPECT_EQ(l.at(1).holder, 7);
  EXPECT_TRUE(l.claim(7, 0, false)) << "metadata naming the spent stream before the switch";
  EXPECT_FALSE(l.claim(8, 1, false)) << "the old holder claimed an offered stream";
  l.accept(7, 1);
  EXPECT_EQ(l.at(0).holder, -1) << "a learner holds one stream once it trains the offered one";
  EXPECT_EQ(l.at(1).holder, 7);
  EXPECT_EQ(l.offer(7, 2), -1);
  l.decline(8, 2);
  EXPECT_EQ(l.at(2).holder, 7) << "another learner's decline freed the offer";
  l.decline(7, 2);
  EXPECT_EQ(l.at(2).holder, -1);
  EXPECT_EQ(l.at(1).holder, 7) << "a decline dropped the stream it trains";
  EXPECT_TRUE(l.claim(9, 2, false)) << "the stream's own holder (alive, its log locked) claims it back";
  EXPECT_TRUE(l.claim(7, 0, false));
  EXPECT_EQ(l.at(1).holder, -1) << "a learner claiming a free stream back still held another";
}

TEST(StreamLeases, PersistedStateRoundTripsAndStreamsBeyondSAreDropped) {
  StreamLeases a(3);
  a.set_cursor(1, nlohmann::json{{"tokens_served", 64}}.dump());
  LeaseDecision d;
  d.stream = 1;
  a.grant(4, d);
  nlohmann::json state = a.to_json();
  state["cursors"]["5"] = "{}";
  StreamLeases b(3);
  EXPECT_EQ(b.restore(state), std::vector<int64_t>{5});
  EXPECT_EQ(b.at(1).holder, 4);
  EXPECT_EQ(b.tokens(1), 64);
  EXPECT_EQ(b.tokens(0), 0);
}

// Found by fuzz/syncer_restore.cc: a fragment file holding a non-finite value (a bad disk, a hand edit) was
// restored and handed to every learner as Θ. Now it is skipped with the reason, as a torn file is.
TEST(SyncerStore, AFragmentFileWithANonFiniteValueOrANegativeVersionIsSkipped) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dloco_store_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  SyncerStore store(dir, 42);
  std::vector<float> theta(8, 0.5f), momentum(8, 0.0f);
  store.write_fragment(0, 3, theta, momentum);
  theta[5] = std::numeric_limits<float>::quiet_NaN();
  store.write_fragment(1, 3, theta, momentum);
  theta[5] = 0.5f;
  momentum[2] = std::numeric_limits<float>::infinity();
  store.write_fragment(2, 3, theta, momentum);
  momentum[2] = 0;
  store.write_fragment(3, -4, theta, momentum);
  std::vector<std::string> skipped;
  const auto fragments = store.read_fragments(4, &skipped);
  ASSERT_EQ(fragments.size(), 1u);
  EXPECT_EQ(fragments[0].p, 0);
  ASSERT_EQ(skipped.size(), 3u);
  EXPECT_NE(skipped[0].find("fragment 1: a non-finite value in theta"), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find("fragment 2: a non-finite value in momentum"), std::string::npos) << skipped[1];
  EXPECT_NE(skipped[2].find("fragment 3: negative version"), std::string::npos) << skipped[2];
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dloco
