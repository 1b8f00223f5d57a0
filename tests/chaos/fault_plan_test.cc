// Fault plans: parsing, validation with clear errors, the builder, and seeded random failures.
#include <gtest/gtest.h>

#include "chaos/fault_plan.h"
#include "core/check.h"

namespace dloco {
namespace {

TEST(FaultPlan, ParsesEveryActionAndSortsByTime) {
  const FaultPlan plan = parse_fault_plan(R"(
[plan]
name = "mixed"
[[fault]]
at_s = 300
action = "kill_syncer"
restart_after_s = 4
[[fault]]
at_s = 60
action = "kill_learner"
learner = 2
restart_after_s = 5
[[fault]]
at_step = 500
action = "slow_learner"
learner = 3
factor = 2.5
duration_s = 60
[[fault]]
at_s = 120
action = "pause_learner"
learner = 1
duration_s = 20
)", "test");
  EXPECT_EQ(plan.name, "mixed");
  const auto faults = plan.resolve(4);
  ASSERT_EQ(faults.size(), 4u);
  EXPECT_EQ(faults[0].action, FaultAction::kKillLearner);
  EXPECT_EQ(faults[0].learner, 2);
  EXPECT_DOUBLE_EQ(faults[0].restart_after_s, 5);
  EXPECT_EQ(faults[1].action, FaultAction::kPauseLearner);
  EXPECT_DOUBLE_EQ(faults[1].duration_s, 20);
  EXPECT_EQ(faults[2].action, FaultAction::kKillSyncer);
  EXPECT_EQ(faults[3].action, FaultAction::kSlowLearner);  // step triggers come after time triggers
  EXPECT_EQ(faults[3].at_step, 500);
  EXPECT_DOUBLE_EQ(faults[3].factor, 2.5);
  EXPECT_EQ(faults[0].describe(), "kill learner 2 at 60 s (restart after 5 s)");
}

void expect_error(const std::string& toml, const std::string& fragment) {
  try {
    parse_fault_plan(toml, "bad.toml");
    ADD_FAILURE() << "no error for:\n" << toml;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(FaultPlan, BadPlansSayWhatIsWrong) {
  expect_error("[[fault]]\nat_s = 1\naction = \"explode\"\n", "unknown fault action 'explode'");
  expect_error("[[fault]]\naction = \"kill_learner\"\nlearner = 0\n", "exactly one of at_s and at_step");
  expect_error("[[fault]]\nat_s = 1\nat_step = 2\naction = \"kill_syncer\"\n", "exactly one of at_s and at_step");
  expect_error("[[fault]]\nat_s = 1\naction = \"kill_learner\"\n", "needs learner");
  expect_error("[[fault]]\nat_s = 1\naction = \"pause_learner\"\nlearner = 0\n", "duration_s > 0");
  expect_error("[[fault]]\nat_s = 1\naction = \"slow_learner\"\nlearner = 0\nduration_s = 5\nfactor = 0.5\n", "factor");
  expect_error("[[fault]]\nat_s = 1\naction = \"kill_learner\"\nlearner = 0\nwhen = 3\n", "unknown key 'when'");
  expect_error("[chaos]\nx = 1\n", "unknown section 'chaos'");
  expect_error("[random]\nmtbf_s = 60\n", "start_s < end_s");
  expect_error("[[fault]\n", "TOML syntax error");
  expect_error("[[fault]]\nat_s = inf\naction = \"kill_syncer\"\n", "finite");
  expect_error("[[fault]]\nat_s = 1\naction = \"kill_syncer\"\nrestart_after_s = -1\n", "cannot finish without its syncer");
  expect_error("[random]\nmtbf_s = 0.001\nstart_s = 0\nend_s = 1000\n", "at most 100000");
  expect_error("[[fault]]\nat_s = 1\naction = \"cut_link\"\nlearner = 0\n", "duration_s > 0");
  expect_error("[[fault]]\nat_s = 1\naction = \"delay_link\"\nlearner = 0\nduration_s = 3\n", "delay_ms");
  const FaultPlan plan = parse_fault_plan("[[fault]]\nat_s = 1\naction = \"kill_learner\"\nlearner = 7\n", "p");
  try {
    plan.resolve(4);
    ADD_FAILURE() << "slot 7 of M = 4 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("M = 4"), std::string::npos) << e.what();
  }
}

TEST(FaultPlan, BuilderMatchesTheFileFormat) {
  const FaultPlan built = FaultPlanBuilder("b").at_s(10).kill_learner(1, 2.0).at_step(200).kill_syncer(3.0)
                              .at_s(30).pause_learner(0, 5.0).build();
  const FaultPlan parsed = parse_fault_plan(R"(
[plan]
name = "b"
[[fault]]
at_s = 10
action = "kill_learner"
learner = 1
restart_after_s = 2
[[fault]]
at_step = 200
action = "kill_syncer"
restart_after_s = 3
[[fault]]
at_s = 30
action = "pause_learner"
learner = 0
duration_s = 5
)", "p");
  EXPECT_EQ(built.to_json(2), parsed.to_json(2));
  EXPECT_THROW(FaultPlanBuilder().at_s(1).slow_learner(0, 1.0, 5).build(), InputError);
}

TEST(FaultPlan, RandomFailuresAreSeededPoissonInTheirWindow) {
  const FaultPlan plan = FaultPlanBuilder("r").random_kills(60, 30, 30 + 60 * 400, 7).build();
  const auto a = plan.resolve(4);
  const auto b = plan.resolve(4);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_DOUBLE_EQ(a[i].at_s, b[i].at_s);  // same seed, same plan
  // About 400 failures expected (Poisson: ±3σ = ±60), every slot hit, all inside the window, sorted.
  EXPECT_GT(a.size(), 340u);
  EXPECT_LT(a.size(), 460u);
  int per_slot[4] = {};
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(a[i].random);
    EXPECT_GE(a[i].at_s, 30);
    EXPECT_LT(a[i].at_s, 30 + 60 * 400);
    if (i > 0) {
      EXPECT_GE(a[i].at_s, a[i - 1].at_s);
    }
    ++per_slot[a[i].learner];
  }
  for (int n : per_slot) EXPECT_GT(n, 60);
  const auto other = FaultPlanBuilder("r").random_kills(60, 30, 30 + 60 * 400, 8).build().resolve(4);
  EXPECT_NE(other.front().at_s, a.front().at_s);  // another seed, another plan
}

TEST(FaultPlan, LinkFaultsParseAndMatchTheBuilder) {
  const FaultPlan parsed = parse_fault_plan(R"(
[[fault]]
at_s = 5
action = "cut_link"
learner = 1
duration_s = 3
[[fault]]
at_s = 2
action = "delay_link"
learner = 0
delay_ms = 150
duration_s = 4
)", "links");
  const FaultPlan built = FaultPlanBuilder("plan").at_s(5).cut_link(1, 3).at_s(2).delay_link(0, 150, 4).build();
  EXPECT_EQ(parsed.to_json(2), built.to_json(2));
  const auto faults = parsed.resolve(2);
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_EQ(faults[0].action, FaultAction::kDelayLink);
  EXPECT_DOUBLE_EQ(faults[0].delay_ms, 150);
  EXPECT_EQ(faults[0].describe(), "delay learner 0's link by 150 ms for 4 s at 2 s");
  EXPECT_EQ(faults[1].describe(), "cut learner 1's link for 3 s at 5 s");
}

TEST(FaultPlan, JoiningLearnersTakeNewIdsAndLaterFaultsMayNameThem) {
  const FaultPlan parsed = parse_fault_plan(R"(
[[fault]]
at_s = 4
action = "add_learner"
learner = 2
[[fault]]
at_s = 9
action = "kill_learner"
learner = 2
restart_after_s = 1
[[fault]]
at_s = 12
action = "leave_learner"
learner = 2
)", "scavenging");
  const FaultPlan built = FaultPlanBuilder("plan").at_s(4).add_learner(2).at_s(9).kill_learner(2, 1).at_s(12)
                              .leave_learner(2).build();
  EXPECT_EQ(parsed.to_json(2), built.to_json(2));
  const auto faults = parsed.resolve(2);
  ASSERT_EQ(faults.size(), 3u);
  EXPECT_EQ(faults[0].describe(), "add learner 2 at 4 s");
  EXPECT_EQ(faults[2].describe(), "learner 2 leaves at 12 s");
  // An added learner must take a new id, once; a fault may name only the M slots and the added ids.
  auto resolve_error = [](const std::string& toml, int M) {
    try {
      parse_fault_plan(toml, "bad").resolve(M);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(resolve_error("[[fault]]\nat_s = 1\naction = \"add_learner\"\nlearner = 1\n", 2).find("new id"),
            std::string::npos);
  EXPECT_NE(resolve_error("[[fault]]\nat_s = 1\naction = \"add_learner\"\nlearner = 3\n"
                          "[[fault]]\nat_s = 2\naction = \"add_learner\"\nlearner = 3\n", 2).find("each added once"),
            std::string::npos);
  EXPECT_NE(resolve_error("[[fault]]\nat_s = 1\naction = \"leave_learner\"\nlearner = 4\n", 2)
                .find("adds no learner with that id"),
            std::string::npos);
  EXPECT_NE(resolve_error("[[fault]]\nat_s = 1\naction = \"add_learner\"\n", 2).find("needs learner"),
            std::string::npos);
}

}  // namespace
}  // namespace dloco
