// The baselines' merge through a real Gloo group (baselines/outer_loops.h): three ranks as threads, each joining
// over one c10d FileStore through our adapter and calling the worker's own AllReduceMerge with the worker's own
// weights (contribution_weight), against the syncer's merge_fragment (core/merge.h) fed the same outer gradients
// and the syncer's unscaled token weights. Not bit-identical: the worker forms w·Δ and the sums in fp32 (Gloo),
// the syncer accumulates in double. Measured: 9e-8 of the largest |Δ_m| with token weights (0 with uniform ones);
// the bound is 4e-7 ≈ (M + 3)·2⁻²⁴ for M = 3 (one rounding of each w·Δ_m, of each of the M − 1 sums, of the
// division and of the syncer's result).
// Also: the status.json format version the launcher checks (baselines/worker_status.h).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "baselines/outer_loops.h"
#include "baselines/worker_status.h"
#include "core/check.h"
#include "core/merge.h"
#include "support/gloo_ranks.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using testing_support::on_ranks;

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dloco_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Counters {
  int64_t tokens, steps;
};

TEST(AllReduceMerge, EqualsTheSyncersMergeOverRealGloo) {
  // A layout of three tensors in P = 2 fragments (the big one split into row blocks), sizes 1 … 40.
  const FragmentLayout layout =
      make_fragment_layout({{"wte.weight", {8, 5}}, {"a.weight", {3, 4}}, {"b.bias", {1}}}, 2, true);
  const int world = 3;
  const int64_t tokens_per_step = 128;
  // Uneven counters since the last receipt: rank 1 trained on nothing (weight 0), ranks 0 and 2 different amounts.
  const std::vector<Counters> counters = {{4 * 128, 4}, {0, 0}, {6 * 128 + 40, 6}};
  const fs::path dir = fresh_dir("merge");
  for (const std::string rule : {"tokens", "uniform"}) {
    for (int p = 0; p < layout.num_fragments(); ++p) {
      const auto n = static_cast<size_t>(layout.fragments[p].numel);
      std::mt19937 rng(11 + p);
      std::normal_distribution<float> normal;
      std::vector<float> global(n);  // Θ_p, the same on every rank
      for (auto& v : global) v = normal(rng);
      std::vector<std::vector<float>> local(world, std::vector<float>(n)), deltas(world, std::vector<float>(n));
      std::vector<double> syncer_weights(world);
      double largest = 0;
      for (int m = 0; m < world; ++m) {
        for (size_t i = 0; i < n; ++i) local[m][i] = global[i] + 0.05f * (m + 1) * normal(rng);
        outer_gradient(global, local[m], deltas[m]);
        for (float d : deltas[m]) largest = std::max(largest, static_cast<double>(std::abs(d)));
        // the syncer's weight (syncer/syncer_merge.cc): tokens²/steps unscaled, or 1 for a learner that trained
        syncer_weights[m] = rule == "tokens" ? token_weight(counters[m].tokens, counters[m].steps)
                                             : (counters[m].steps > 0 ? 1.0 : 0.0);
      }
      std::vector<float> expected(n);
      merge_fragment(layout, p, {deltas[0], deltas[1], deltas[2]}, syncer_weights, MergeRule::kMean,
                     [](const std::string&) { return false; }, expected);

      std::vector<std::vector<float>> merged(world, std::vector<float>(n, NAN));
      std::vector<int> ok(world, 0);
      const auto errors = on_ranks(dir / ("store_" + rule + std::to_string(p)), world, [&](Collective& group) {
        const int m = group.rank();
        const double w = contribution_weight(*parse_choice<WeightRule>(rule), counters[m].tokens, counters[m].steps,
                                             tokens_per_step);
        AllReduceMerge merge(group, global, local[m], w);
        ok[m] = merge.finish(merged[m]) ? 1 : 0;
      });
      for (int m = 0; m < world; ++m) ASSERT_EQ(errors[m], "") << "rank " << m;
      double worst = 0;
      for (int m = 0; m < world; ++m) {
        ASSERT_EQ(ok[m], 1) << "rank " << m;
        EXPECT_EQ(merged[m], merged[0]) << "ranks disagree on the merge: rank " << m;
        for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(merged[m][i]) - expected[i]));
      }
      EXPECT_LE(worst, 4e-7 * largest) << rule << " fragment " << p << " (" << n << " elements)";
      std::printf("all-reduce merge vs merge_fragment (%s weights, fragment %d, n = %zu): max |diff| %.2e, "
                  "%.2e of max |Δ|\n", rule.c_str(), p, n, worst, worst / largest);
    }
  }
  fs::remove_all(dir);
}

TEST(AllReduceMerge, NobodyTrainedMeansNothingToMergeOnEveryRank) {
  const fs::path dir = fresh_dir("merge_empty");
  const std::vector<float> global = {1.0f, 2.0f}, local = {0.5f, 1.5f};
  std::vector<std::vector<float>> merged(2, std::vector<float>{7.0f, 7.0f});
  std::vector<int> ok(2, -1);
  const auto errors = on_ranks(dir / "store", 2, [&](Collective& group) {
    const double w = contribution_weight(WeightRule::kTokens, 0, 0, 128);
    AllReduceMerge merge(group, global, local, w);
    ok[group.rank()] = merge.finish(merged[group.rank()]) ? 1 : 0;
  });
  for (int m = 0; m < 2; ++m) {
    ASSERT_EQ(errors[m], "");
    EXPECT_EQ(ok[m], 0);
    EXPECT_EQ(merged[m], (std::vector<float>{7.0f, 7.0f})) << "a skipped merge leaves the output alone";
  }
  fs::remove_all(dir);
}

// The stop vote rides in the merge's all-reduce: one worker asked to stop is heard by every worker, in the same
// merge, and the merge itself is unchanged by it (docs/protocol.md §11).
TEST(AllReduceMerge, OneWorkersStopVoteReachesEveryWorkerInTheSameMerge) {
  const fs::path dir = fresh_dir("merge_vote");
  const std::vector<float> global = {1.0f, 2.0f};
  const std::vector<std::vector<float>> local = {{0.5f, 1.5f}, {0.0f, 1.0f}, {1.0f, 3.0f}};
  std::vector<int> votes(3, -1);
  std::vector<std::vector<float>> merged(3, std::vector<float>(2, NAN));
  const auto errors = on_ranks(dir / "store", 3, [&](Collective& group) {
    const int m = group.rank();
    AllReduceMerge merge(group, global, local[m], 1.0, /*stop_vote=*/m == 1);
    ASSERT_TRUE(merge.finish(merged[m]));
    votes[m] = merge.stop_votes();
  });
  for (int m = 0; m < 3; ++m) {
    ASSERT_EQ(errors[m], "");
    EXPECT_EQ(votes[m], 1) << "rank " << m << " did not hear rank 1's vote";
    EXPECT_FLOAT_EQ(merged[m][0], 0.5f);         // the mean of Θ − θ_m: (0.5 + 1 + 0) / 3
    EXPECT_FLOAT_EQ(merged[m][1], 0.5f / 3.0f);  // (0.5 + 1 − 1) / 3
  }
  fs::remove_all(dir);
}

TEST(AllReduceMerge, RejectsBadInputBeforeTheCollective) {
  const fs::path dir = fresh_dir("merge_bad");
  const auto errors = on_ranks(dir / "store", 1, [&](Collective& group) {
    const std::vector<float> a(3, 1.0f), b(2, 1.0f);
    EXPECT_THROW(AllReduceMerge(group, a, b, 1.0), InputError);   // Θ and θ differ in size
    EXPECT_THROW(AllReduceMerge(group, a, a, -1.0), InputError);  // negative weight
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_DOUBLE_EQ(contribution_weight(WeightRule::kTokens, 512, 4, 128), 512.0);  // 512²/4 / 128
  EXPECT_DOUBLE_EQ(contribution_weight(WeightRule::kUniform, 0, 0, 128), 0.0);
  fs::remove_all(dir);
}

TEST(WorkerStatus, ReaderRefusesAnotherFormatVersion) {
  const fs::path dir = fresh_dir("status");
  const fs::path file = dir / "status.json";
  EXPECT_TRUE(read_worker_status(file).is_null()) << "no file yet";
  const auto stamped = stamp_worker_status({{"global_step", 12}});
  EXPECT_EQ(stamped["format_version"], kWorkerStatusVersion);
  std::ofstream(file) << stamped.dump();
  EXPECT_EQ(read_worker_status(file)["global_step"], 12);
  std::ofstream(file) << "{\"global_st";  // not JSON (never, atomically written): not read
  EXPECT_TRUE(read_worker_status(file).is_null());
  auto expect_refused = [&](nlohmann::json status, const std::string& says) {
    std::ofstream(file) << status.dump();
    try {
      (void)read_worker_status(file);
      ADD_FAILURE() << "accepted " << status.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("reads format_version 1"), std::string::npos) << e.what();
    }
  };
  auto future = stamped;
  future["format_version"] = kWorkerStatusVersion + 1;
  expect_refused(future, "has format_version 2");
  expect_refused({{"global_step", 12}}, "has no \"dloco-worker-status\" format_version");  // before versions
  auto foreign = stamped;
  foreign["format"] = "something-else";
  expect_refused(foreign, "has no");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dloco
