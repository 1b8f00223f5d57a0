// Table tests of the syncer's pure decisions (docs/protocol.md §4 clock, lease, quorum; §5 grace).
#include "core/decisions.h"

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/fragments.h"

namespace dloco {
namespace {

// A joined learner last seen at `seen` seconds, stepping every `step_s` seconds.
LearnerState learner(int id, int64_t step, double seen = 100.0, double step_s = 1.0, bool joined = true) {
  return LearnerState{id, step, seen, step_s, joined};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Lease, Table) {
  const LeaseConfig lease;  // max(3·ξ_step, 5 s)
  struct Row {
    LearnerState l;
    double now;
    bool live;
    const char* why;
  } rows[] = {
      {learner(0, 0, 100, 1.0), 100.0, true, "just seen"},
      {learner(0, 0, 100, 1.0), 104.9, true, "inside the 5 s floor"},
      {learner(0, 0, 100, 1.0), 105.0, false, "a full 5 s lease silent"},
      {learner(0, 0, 100, 0.0), 104.0, true, "unknown step time: the floor applies"},
      {learner(0, 0, 100, 4.0), 111.9, true, "3·4 s = 12 s lease"},
      {learner(0, 0, 100, 4.0), 112.0, false, "12 s lease passed"},
      {learner(0, 0, 100, 1.0, false), 100.0, false, "not joined is never live"},
  };
  for (const Row& r : rows) EXPECT_EQ(is_live(r.l, r.now, lease), r.live) << r.why;
  EXPECT_DOUBLE_EQ(lease_s(learner(0, 0, 0, 4.0), lease), 12.0);
  EXPECT_DOUBLE_EQ(lease_s(learner(0, 0, 0, 1.0), lease), 5.0);
  const LeaseConfig tight{2.0, 1.0};
  EXPECT_DOUBLE_EQ(lease_s(learner(0, 0, 0, 0.25), tight), 1.0);
  EXPECT_FALSE(is_live(learner(0, 0, 100, 0.25), 101.0, tight));
  EXPECT_TRUE(is_live(learner(0, 0, 100, 0.75), 101.0, tight));  // 2·0.75 = 1.5 s
}

TEST(GlobalClock, Table) {
  const LeaseConfig lease;
  struct Row {
    int64_t previous;
    std::vector<LearnerState> learners;
    double now;
    int K;
    int64_t expected;
    bool advanced;
    const char* reason_part;
  } rows[] = {
      {0, {}, 100, 1, 0, false, "0 live learners"},
      {0, {learner(0, 5)}, 100, 1, 5, true, "t 0 -> 5: 1st largest step of 1 live learner is 5"},
      {10, {learner(0, 5)}, 100, 1, 10, false, "t stays 10"},  // never goes back
      {0, {learner(0, 5), learner(1, 9), learner(2, 7)}, 100, 1, 9, true, "1st largest"},
      {0, {learner(0, 5), learner(1, 9), learner(2, 7)}, 100, 2, 7, true, "2nd largest step of 3 live learners is 7"},
      {0, {learner(0, 5), learner(1, 9), learner(2, 7)}, 100, 3, 5, true, "3rd largest"},
      {0, {learner(0, 5), learner(1, 9), learner(2, 7)}, 100, 4, 0, false, "3 live learners, quorum K = 4"},
      // Learner 1 (step 9) went silent 6 s ago: absent, so the 1st largest live step is 7.
      {0, {learner(0, 5), learner(1, 9, 94), learner(2, 7)}, 100, 1, 7, true, "of 2 live learners is 7"},
      // A learner not yet joined does not count.
      {0, {learner(0, 5), learner(1, 50, 100, 1, false)}, 100, 1, 5, true, "of 1 live learner"},
      // Equal steps.
      {3, {learner(0, 8), learner(1, 8)}, 100, 2, 8, true, "t 3 -> 8"},
  };
  for (const Row& r : rows) {
    const ClockDecision d = advance_global_clock(r.previous, r.learners, r.now, r.K, lease);
    EXPECT_EQ(d.global_step, r.expected) << d.reason;
    EXPECT_EQ(d.advanced, r.advanced) << d.reason;
    EXPECT_TRUE(contains(d.reason, r.reason_part)) << "reason: " << d.reason << " | expected part: " << r.reason_part;
  }
  EXPECT_THROW(advance_global_clock(0, {}, 0, 0, lease), InputError);
  EXPECT_THROW(advance_global_clock(-1, {}, 0, 1, lease), InputError);
}

TEST(DueSteps, Table) {
  struct Row {
    int p;
    int64_t from, to;
    int H, P;
    std::vector<int64_t> due;
  } rows[] = {
      {0, 0, 24, 24, 24, {24}},         // step 0 itself is excluded (from is exclusive)
      {0, -1, 24, 24, 24, {0, 24}},
      {5, 0, 24, 24, 24, {5}},
      {5, 5, 28, 24, 24, {}},           // 5 already processed, next is 29
      {5, 5, 29, 24, 24, {29}},
      {1, 0, 100, 24, 4, {6, 30, 54, 78}},
      {3, 17, 18, 24, 4, {18}},
      {3, 18, 18, 24, 4, {}},           // empty range
      {3, 30, 20, 24, 4, {}},           // backwards range
      {0, 0, 5, 1, 1, {1, 2, 3, 4, 5}}, // H = 1: every step
  };
  for (const Row& r : rows) {
    EXPECT_EQ(due_steps_crossed(r.p, r.from, r.to, r.H, r.P), r.due)
        << "p " << r.p << " (" << r.from << ", " << r.to << "] H " << r.H << " P " << r.P;
  }
  EXPECT_THROW(due_steps_crossed(0, 0, 10, 24, 5), InputError);
  EXPECT_THROW(due_steps_crossed(4, 0, 10, 24, 4), InputError);
}

TEST(DueSteps, AgreesWithFragmentDue) {
  for (int H : {1, 4, 6, 24}) {
    for (int P : {1, 2, 3, 4, 6, 24}) {
      if (P > H || H % P) continue;
      for (int p = 0; p < P; ++p) {
        const std::vector<int64_t> due = due_steps_crossed(p, 7, 80, H, P);
        std::vector<int64_t> brute;
        for (int64_t u = 8; u <= 80; ++u) {
          if (fragment_due(p, u, H, P)) brute.push_back(u);
        }
        EXPECT_EQ(due, brute) << "H " << H << " P " << P << " p " << p;
      }
    }
  }
}

TEST(DueRounds, AJumpIsProcessedInOrder) {
  // H = 8, P = 4: offsets 0, 2, 4, 6. The clock jumps from 3 to 12: rounds (4,2), (6,3), (8,0), (10,1), (12,2).
  const std::vector<DueRound> expected{{4, 2}, {6, 3}, {8, 0}, {10, 1}, {12, 2}};
  EXPECT_EQ(due_rounds_crossed(3, 12, 8, 4), expected);
  EXPECT_TRUE(due_rounds_crossed(12, 12, 8, 4).empty());
}

TEST(Ema, FirstSampleThenDecay) {
  Ema ema;  // decay 0.9
  EXPECT_FALSE(ema.has_value());
  EXPECT_DOUBLE_EQ(ema.value(), 0.0);
  ema.update(10.0);
  EXPECT_TRUE(ema.has_value());
  EXPECT_DOUBLE_EQ(ema.value(), 10.0);
  ema.update(20.0);  // 0.9·10 + 0.1·20 = 11
  EXPECT_DOUBLE_EQ(ema.value(), 11.0);
  ema.update(1.0);  // 0.9·11 + 0.1·1 = 10
  EXPECT_DOUBLE_EQ(ema.value(), 10.0);
  Ema fast(0.0);
  fast.update(3.0);
  fast.update(7.0);
  EXPECT_DOUBLE_EQ(fast.value(), 7.0);
  EXPECT_THROW(Ema(1.0), InputError);
  EXPECT_THROW(Ema(-0.1), InputError);
}

TEST(GraceWindow, Table) {
  struct Row {
    double tau, step, quorum, sync, gamma, expected;
  } rows[] = {
      {2, 1.0, 0.2, 0.2, 0.5, 0.8},   // γ(2·1 − 0.4) = 0.8
      {2, 1.0, 0.0, 0.0, 0.5, 1.0},
      {2, 1.0, 1.0, 1.5, 0.5, 0.0},   // negative slack → 0
      {2, 1.0, 1.0, 1.0, 0.5, 0.0},   // zero slack
      {0, 1.0, 0.0, 0.0, 0.5, 0.0},   // τ = 0 (synchronous): no slack
      {4, 0.5, 0.1, 0.3, 1.0, 1.6},   // γ = 1
      {2, 3.0, 0.5, 0.5, 0.0, 0.0},   // γ = 0 disables it
  };
  for (const Row& r : rows) {
    EXPECT_NEAR(grace_window_s(r.tau, r.step, r.quorum, r.sync, r.gamma), r.expected, 1e-12)
        << r.tau << " " << r.step << " " << r.quorum << " " << r.sync << " " << r.gamma;
  }
  EXPECT_THROW(grace_window_s(2, 1, 0, 0, 1.5), InputError);
  EXPECT_THROW(grace_window_s(2, 1, 0, 0, -0.5), InputError);
  EXPECT_THROW(grace_window_s(2, -1, 0, 0, 0.5), InputError);
}

TEST(DecideMerge, Table) {
  // Round: fragment 3 due at step 48 since t = 100 s. Timings: ξ_quorum 0.1 s, ξ_sync 0.1 s.
  // Slowest live step 1 s, τ = 2, γ = 0.5 → grace = 0.5·(2·1 − 0.2) = 0.9 s.
  const Timings timings{0.1, 0.1};
  QuorumConfig k1;  // K = 1, grace on, γ = 0.5, τ = 2
  QuorumConfig k2 = k1;
  k2.K = 2;
  QuorumConfig no_grace = k1;
  no_grace.grace = false;
  const RoundState fresh{3, 48, 100.0, -1.0};
  const RoundState quorum_at_100{3, 48, 100.0, 100.0};

  struct Row {
    const char* name;
    RoundState round;
    std::vector<LearnerState> learners;
    double now;
    QuorumConfig config;
    MergeAction action;
    std::vector<int> participants;
    const char* reason_part;
  } rows[] = {
      {"no learners", fresh, {}, 100.0, k1, MergeAction::kWaitQuorum, {}, "quorum 0/1"},
      {"nobody reached u", fresh, {learner(0, 47), learner(1, 40)}, 100.0, k1, MergeAction::kWaitQuorum, {},
       "0 of 2 live learners reached it"},
      {"all live ready: pull now, no grace", fresh, {learner(0, 48), learner(1, 50)}, 100.0, k1,
       MergeAction::kPullNow, {0, 1}, "all 2 live learners ready"},
      {"quorum with laggards: grace starts now", fresh, {learner(0, 48), learner(1, 47), learner(2, 46)}, 100.0, k1,
       MergeAction::kWaitGrace, {0}, "quorum 1/1 reached at fragment 3 step 48; grace 0.90 s left for 2 more live"},
      {"grace counts from quorum_since", quorum_at_100, {learner(0, 48), learner(1, 47)}, 100.5, k1,
       MergeAction::kWaitGrace, {0}, "grace 0.40 s left for 1 more live learner"},
      {"grace closed", quorum_at_100, {learner(0, 48), learner(1, 47)}, 101.0, k1, MergeAction::kPullNow, {0},
       "grace window of 0.90 s closed, pull 1 of 2 live learners"},
      {"grace off", fresh, {learner(0, 48), learner(1, 47)}, 100.0, no_grace, MergeAction::kPullNow, {0},
       "grace off"},
      {"K = 2 not reached", fresh, {learner(0, 48), learner(1, 47)}, 100.0, k2, MergeAction::kWaitQuorum, {0},
       "quorum 1/2"},
      {"K = 2 reached by all", fresh, {learner(0, 48), learner(1, 49)}, 100.0, k2, MergeAction::kPullNow, {0, 1},
       "quorum 2/2 reached"},
      {"absent laggard is not waited for", fresh, {learner(0, 48), learner(1, 10, 90.0)}, 100.0, k1,
       MergeAction::kPullNow, {0}, "all 1 live learner ready"},
      {"absent ready learner is not a participant", fresh, {learner(0, 60, 90.0), learner(1, 47)}, 100.0, k1,
       MergeAction::kWaitQuorum, {}, "1 absent"},
      {"unjoined learner is ignored", fresh, {learner(0, 48), learner(1, 0, 100.0, 1.0, false)}, 100.0, k1,
       MergeAction::kPullNow, {0}, "all 1 live learner"},
      {"participants sorted by id", fresh, {learner(7, 48), learner(2, 49), learner(5, 20)}, 100.0, k2,
       MergeAction::kWaitGrace, {2, 7}, "quorum 2/2 reached"},
  };
  for (const Row& r : rows) {
    const MergeDecision d = decide_merge(r.round, r.learners, r.now, r.config, timings);
    EXPECT_EQ(d.action, r.action) << r.name << ": " << to_string(d.action) << " (" << d.reason << ")";
    EXPECT_EQ(d.participants, r.participants) << r.name;
    EXPECT_TRUE(contains(d.reason, r.reason_part)) << r.name << ": reason '" << d.reason << "' lacks '"
                                                    << r.reason_part << "'";
  }
}

TEST(DecideMerge, GraceFollowsTheSlowestLiveLearnerAndTheTimings) {
  const RoundState round{0, 24, 50.0, 50.0};
  QuorumConfig config;  // K = 1, γ = 0.5, τ = 2
  // Slowest live step 3 s: grace = 0.5·(6 − 0.2) = 2.9 s → still waiting at 52 s.
  const std::vector<LearnerState> slow{learner(0, 24, 50.0, 1.0), learner(1, 20, 50.0, 3.0)};
  MergeDecision d = decide_merge(round, slow, 52.0, config, Timings{0.1, 0.1});
  EXPECT_EQ(d.action, MergeAction::kWaitGrace) << d.reason;
  EXPECT_NEAR(d.grace_s, 2.9, 1e-12);
  EXPECT_NEAR(d.grace_deadline_s, 52.9, 1e-12);
  EXPECT_EQ(d.live, 2);
  // Merges that take longer than the slack leave no grace: pull at once.
  d = decide_merge(round, slow, 50.0, config, Timings{3.0, 4.0});
  EXPECT_EQ(d.action, MergeAction::kPullNow) << d.reason;
  EXPECT_DOUBLE_EQ(d.grace_s, 0.0);
  // A larger γ waits longer: γ = 1 gives 5.8 s from 50 s, so at 54 s it still waits (γ = 0.5 would not).
  d = decide_merge(round, slow, 54.0, config, Timings{0.1, 0.1});
  EXPECT_EQ(d.action, MergeAction::kPullNow) << d.reason;
  config.gamma = 1.0;
  d = decide_merge(round, slow, 54.0, config, Timings{0.1, 0.1});
  EXPECT_EQ(d.action, MergeAction::kWaitGrace) << d.reason;
  EXPECT_NEAR(d.grace_s, 5.8, 1e-12);
}

TEST(DecideMerge, RefusesBadConfig) {
  QuorumConfig config;
  config.K = 0;
  EXPECT_THROW(decide_merge(RoundState{}, {}, 0.0, config, Timings{}), InputError);
  config.K = 1;
  config.gamma = 2.0;
  const std::vector<LearnerState> two{learner(0, 10), learner(1, 0)};
  EXPECT_THROW(decide_merge(RoundState{0, 5, 100, -1}, two, 100.0, config, Timings{}), InputError);
}

TEST(MergeAction, Names) {
  EXPECT_STREQ(to_string(MergeAction::kWaitQuorum), "wait_quorum");
  EXPECT_STREQ(to_string(MergeAction::kWaitGrace), "wait_grace");
  EXPECT_STREQ(to_string(MergeAction::kPullNow), "pull_now");
}

}  // namespace
}  // namespace dloco
