// Pipeline schedules (parallel/pipeline_schedule.h): the fixed answers of the spec (t_f = 50 ms, t_b = 100 ms,
// p = 4, m = 8: GPipe and 1F1B (m + p − 1)(t_f + t_b) = 1.65 s per iteration, bubble (p − 1)/(m + p − 1) = 27.3%,
// interleaved v = 2: m(t_f + t_b) + (p − 1)(t_f + t_b)/v = 1.425 s; peak stored activations GPipe 8/8/8/8,
// 1F1B 4/3/2/1), each counted by the simulation from the action lists; the lists' own properties, checked here
// independently of validate_pipeline_schedule; and the errors. Times are simulated, never measured.
// Tolerance 1e-9 s: sums of a few dozen doubles like 0.025 (exact to ~1e-16 each).
#include <gtest/gtest.h>

#include <map>

#include "core/check.h"
#include "parallel/pipeline_schedule.h"

namespace dloco {
namespace {

using Kind = PipelineScheduleKind;
constexpr double kTol = 1e-9;

PipelineTimeline run(Kind kind, int p, int m, int v = 1, double transfer = 0) {
  return simulate_pipeline(make_pipeline_schedule({kind, p, m, v}), {0.05, 0.10, transfer});
}

TEST(PipelineSchedule, FixedAnswersP4M8) {
  const auto gpipe = run(Kind::kGPipe, 4, 8);
  const auto f1b = run(Kind::k1F1B, 4, 8);
  const auto inter = run(Kind::kInterleaved, 4, 8, 2);
  EXPECT_NEAR(gpipe.iteration_s, 1.65, kTol);
  EXPECT_NEAR(f1b.iteration_s, 1.65, kTol);
  EXPECT_NEAR(gpipe.bubble_fraction, 3.0 / 11.0, kTol);
  EXPECT_NEAR(f1b.bubble_fraction, 3.0 / 11.0, kTol);
  EXPECT_NEAR(inter.iteration_s, 1.425, kTol);
  EXPECT_NEAR(inter.bubble_fraction, 1.0 - 1.2 / 1.425, kTol);  // (p − 1)/(v·m + p − 1) = 3/19
  EXPECT_EQ(gpipe.peak_stored_activations, (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(f1b.peak_stored_activations, (std::vector<int>{4, 3, 2, 1}));
  for (double b : f1b.busy_s) EXPECT_NEAR(b, 8 * 0.15, kTol);
  std::printf("p = 4, m = 8: gpipe %.4f s (bubble %.4f), 1f1b %.4f s (bubble %.4f), interleaved v=2 %.4f s "
              "(bubble %.4f); interleaved peak stored (chunk units)", gpipe.iteration_s, gpipe.bubble_fraction,
              f1b.iteration_s, f1b.bubble_fraction, inter.iteration_s, inter.bubble_fraction);
  for (int n : inter.peak_stored_activations) std::printf(" %d", n);
  std::printf("\n");
}

TEST(PipelineSchedule, OneFOneBWarmUpAndSteadyState) {
  const auto s = make_pipeline_schedule({Kind::k1F1B, 4, 8, 1});
  // Stage 0: 3 warm-up forwards, then F3 B0 F4 B1 …; the last stage alternates from the start.
  const std::vector<std::string> stage0 = {"F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5"};
  for (size_t i = 0; i < stage0.size(); ++i) EXPECT_EQ(to_string(s.actions[0][i]), stage0[i]) << i;
  EXPECT_EQ(to_string(s.actions[3][0]), "F0");
  EXPECT_EQ(to_string(s.actions[3][1]), "B0");
  // m < p: warm-up capped at m (stage 0 of p = 4, m = 2 runs F0 F1 B0 B1).
  const auto few = make_pipeline_schedule({Kind::k1F1B, 4, 2, 1});
  EXPECT_EQ(to_string(few.actions[0][1]), "F1");
  EXPECT_EQ(to_string(few.actions[0][2]), "B0");
  EXPECT_EQ(run(Kind::k1F1B, 4, 2).peak_stored_activations, (std::vector<int>{2, 2, 2, 1}));
}

// Every (micro-batch, chunk) forward and backward exactly once per stage, backward after forward: checked here by
// walking the lists, not by the library's validator.
void expect_complete(const PipelineSchedule& s) {
  const int m = s.spec.micro_batches, v = s.spec.chunks;
  ASSERT_EQ(static_cast<int>(s.actions.size()), s.spec.stages);
  for (int st = 0; st < s.spec.stages; ++st) {
    std::map<std::pair<int, int>, int> seen_f, seen_b;
    for (const auto& a : s.actions[st]) {
      const auto key = std::make_pair(a.micro_batch, a.chunk);
      if (a.forward()) {
        ++seen_f[key];
      } else {
        EXPECT_EQ(seen_f[key], 1) << "stage " << st << " backward before forward: " << to_string(a, v);
        ++seen_b[key];
      }
    }
    EXPECT_EQ(static_cast<int>(s.actions[st].size()), 2 * m * v);
    for (int i = 0; i < m; ++i) {
      for (int c = 0; c < v; ++c) {
        EXPECT_EQ(seen_f[std::make_pair(i, c)], 1) << "stage " << st << " F" << i << "." << c;
        EXPECT_EQ(seen_b[std::make_pair(i, c)], 1) << "stage " << st << " B" << i << "." << c;
      }
    }
  }
}

TEST(PipelineSchedule, EverySchedulePropertySweepAndFinishes) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 7, 8, 16}) {
      for (Kind kind : {Kind::kGPipe, Kind::k1F1B}) {
        const auto s = make_pipeline_schedule({kind, p, m, 1});
        expect_complete(s);
        const auto t = simulate_pipeline(s, {0.05, 0.10, 0.0});  // finishes: no deadlock
        EXPECT_NEAR(t.iteration_s, (m + p - 1) * 0.15, kTol) << to_string(kind) << " p " << p << " m " << m;
        // With a transfer time t_c: GPipe's critical path crosses 2(p − 1) links; 1F1B's crosses more (its
        // steady state waits for each gradient), so it is only bounded below.
        const double t_c = 0.01, link = p > 1 ? t_c : 0.0;
        const auto tc = simulate_pipeline(s, {0.05, 0.10, t_c});
        if (kind == Kind::kGPipe) {
          EXPECT_NEAR(tc.iteration_s, (m + p - 1) * 0.15 + 2 * (p - 1) * link, kTol) << "p " << p << " m " << m;
        } else {
          EXPECT_GE(tc.iteration_s, (m + p - 1) * 0.15 + 2 * (p - 1) * link - kTol) << "p " << p << " m " << m;
        }
        for (int st = 0; st < p; ++st) {
          const int expected = kind == Kind::kGPipe ? m : std::min(p - st, m);
          EXPECT_EQ(t.peak_stored_activations[st], expected) << to_string(kind) << " p " << p << " m " << m;
        }
      }
      for (int v : {1, 2, 3}) {
        if (m % p != 0) {
          EXPECT_THROW(make_pipeline_schedule({Kind::kInterleaved, p, m, v}), InputError);
          continue;
        }
        const auto s = make_pipeline_schedule({Kind::kInterleaved, p, m, v});
        expect_complete(s);
        const auto t = simulate_pipeline(s, {0.05, 0.10, 0.0});
        // Never slower than 1F1B; at m > p equal to the ideal m(t_f + t_b) + (p − 1)(t_f + t_b)/v.
        EXPECT_LE(t.iteration_s, (m + p - 1) * 0.15 + kTol) << "p " << p << " m " << m << " v " << v;
        if (m > p) {
          EXPECT_NEAR(t.iteration_s, m * 0.15 + (p - 1) * 0.15 / v, kTol) << p << " " << m << " " << v;
        }
      }
    }
  }
}

TEST(PipelineSchedule, RejectsBadShapesAndDeadlocks) {
  EXPECT_THROW(make_pipeline_schedule({Kind::k1F1B, 0, 8, 1}), InputError);
  EXPECT_THROW(make_pipeline_schedule({Kind::k1F1B, 4, 0, 1}), InputError);
  EXPECT_THROW(make_pipeline_schedule({Kind::kGPipe, 4, 8, 2}), InputError);       // chunks without interleaving
  EXPECT_THROW(make_pipeline_schedule({Kind::kInterleaved, 4, 6, 2}), InputError);  // m % p ≠ 0
  EXPECT_THROW(make_pipeline_schedule({Kind::kInterleaved, 4, 8, 0}), InputError);
  EXPECT_THROW(parse_pipeline_schedule("zb-h1"), InputError);
  EXPECT_EQ(parse_pipeline_schedule("interleaved"), Kind::kInterleaved);

  auto s = make_pipeline_schedule({Kind::kGPipe, 2, 2, 1});
  // Stage 1 runs B1 before B0 while stage 0 runs B0 first: still no deadlock (B0 of stage 0 waits for stage 1).
  std::swap(s.actions[1][2], s.actions[1][3]);
  EXPECT_NO_THROW(simulate_pipeline(s, {}));
  // Stage 0 wants B0 before its F1, but stage 1 needs F1 before it reaches B0: nobody moves.
  auto dead = make_pipeline_schedule({Kind::kGPipe, 2, 2, 1});
  dead.actions[0] = {{PipelineAction::Op::kForward, 0, 0}, {PipelineAction::Op::kBackward, 0, 0},
                     {PipelineAction::Op::kForward, 1, 0}, {PipelineAction::Op::kBackward, 1, 0}};
  try {
    simulate_pipeline(dead, {});
    ADD_FAILURE() << "deadlock not detected";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlocks"), std::string::npos) << e.what();
  }
  auto twice = make_pipeline_schedule({Kind::k1F1B, 2, 2, 1});
  twice.actions[1][0] = twice.actions[1][2];  // F1 twice, F0 never
  EXPECT_THROW(validate_pipeline_schedule(twice), InputError);
  auto early = make_pipeline_schedule({Kind::kGPipe, 1, 2, 1});
  std::swap(early.actions[0][0], early.actions[0][2]);  // B0 first
  EXPECT_THROW(validate_pipeline_schedule(early), InputError);
  EXPECT_THROW(simulate_pipeline(make_pipeline_schedule({Kind::kGPipe, 1, 1, 1}), {-1, 0, 0}), InputError);
}

}  // namespace
}  // namespace dloco
