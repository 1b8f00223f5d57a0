// SkipPipe's stages of a GPT (model/stages.h, GPTImpl::set_active_blocks): the stage → block mask and its
// refusals, the random subsets of the reference's evaluation (sizes, order, determinism, every subset reachable),
// and a model with stages skipped equals, bitwise, the smaller model holding only the kept blocks built by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "core/check.h"
#include "model/gpt.h"
#include "model/stages.h"

namespace dloco {
namespace {

TEST(Stages, SubsetBecomesTheBlocksOfItsStages) {
  // 6 blocks in 3 stages of 2: stages {0, 2} keep blocks 0, 1, 4, 5
  EXPECT_EQ(stage_blocks(6, 3, {0, 2}), (std::vector<bool>{true, true, false, false, true, true}));
  EXPECT_EQ(stage_blocks(4, 4, {0, 1, 2, 3}), std::vector<bool>(4, true));
  EXPECT_EQ(stage_blocks(4, 1, {0}), std::vector<bool>(4, true));
  auto error_of = [](auto f) {
    try {
      f();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of([] { stage_blocks(6, 4, {0}); }).find("must divide model.n_layer"), std::string::npos);
  EXPECT_NE(error_of([] { stage_blocks(6, 3, {1, 2}); }).find("must contain stage 0"), std::string::npos);
  EXPECT_NE(error_of([] { stage_blocks(6, 3, {0, 2, 1}); }).find("increasing order"), std::string::npos);
  EXPECT_NE(error_of([] { stage_blocks(6, 3, {0, 3}); }).find("stage 3"), std::string::npos);
  EXPECT_NE(error_of([] { stage_blocks(6, 3, {0, 0}); }).find("each once"), std::string::npos);
  EXPECT_EQ(parse_stage_list("0,2,4"), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(parse_stage_list("0"), (std::vector<int64_t>{0}));
  for (const char* bad : {"", "0,", ",1", "0,-1", "a", "0;2", "0,,2", "99999999"}) {
    EXPECT_NE(error_of([&] { parse_stage_list(bad); }).find("--stages"), std::string::npos) << bad;
  }
}

TEST(Stages, RandomSubsetsAreStageZeroPlusASortedDrawOfTheRightSize) {
  std::mt19937_64 rng(7);
  std::set<std::vector<int64_t>> seen;
  for (int i = 0; i < 1000; ++i) {
    const auto half = random_stage_subset(6, 0.5, rng);  // half the model: 3 of 6 stages
    ASSERT_EQ(half.size(), 3u);
    EXPECT_EQ(half[0], 0);
    EXPECT_TRUE(std::is_sorted(half.begin(), half.end()));
    EXPECT_EQ(std::set<int64_t>(half.begin(), half.end()).size(), 3u);
    seen.insert(half);
  }
  EXPECT_EQ(seen.size(), 10u) << "every 2 of stages 1 … 5 is drawn (C(5, 2) = 10)";
  EXPECT_EQ(random_stage_subset(6, 1.0 / 3, rng).size(), 4u);  // the reference's 33%: 4 of 6
  EXPECT_EQ(random_stage_subset(6, 0, rng), (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  std::mt19937_64 a(3), b(3);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(random_stage_subset(6, 0.5, a), random_stage_subset(6, 0.5, b));
  EXPECT_THROW(random_stage_subset(6, 1.0, rng), InputError);
  EXPECT_THROW(random_stage_subset(6, -0.1, rng), InputError);
}

// "Inference with a stage subset equals running that subset by hand": a 4-block model with blocks 1 and 2 skipped
// against a 2-block model holding copies of blocks 0 and 3 (and the embedding and final norm).
TEST(Stages, SkippedBlocksEqualTheSmallerModelBuiltByHand) {
  ModelConfig m = model_preset("tiny");
  m.n_layer = 4;
  torch::manual_seed(0);
  GPT full(m);
  ModelConfig small_cfg = m;
  small_cfg.n_layer = 2;
  GPT small(small_cfg);
  {
    torch::NoGradGuard no_grad;
    auto src = full->named_parameters();
    for (auto& item : small->named_parameters()) {
      std::string name = item.key();
      if (name.rfind("h.1.", 0) == 0) name = "h.3." + name.substr(4);  // the small model's block 1 is block 3
      item.value().copy_(src[name]);
    }
  }
  torch::manual_seed(1);
  const auto idx = torch::randint(m.vocab_size, {2, m.seq_len}, torch::kLong);  // (B, T)
  torch::NoGradGuard no_grad;
  const auto all_blocks = full->forward(idx);                                 // (B, T, V)
  full->set_active_blocks(stage_blocks(4, 4, {0, 3}));
  const auto skipped = full->forward(idx);
  EXPECT_TRUE(torch::equal(skipped, small->forward(idx))) << "stages {0, 3} of 4 vs blocks 0 and 3 by hand";
  EXPECT_GT((skipped - all_blocks).abs().max().item<double>(), 1e-4) << "skipping changes the output";
  full->set_active_blocks({});
  EXPECT_TRUE(torch::equal(full->forward(idx), all_blocks)) << "an empty mask runs every block again";
  EXPECT_THROW(full->set_active_blocks(std::vector<bool>(3, true)), InputError);
}

TEST(Stages, BalancedPathsVisitEveryNonZeroStageEquallyAndFollowTheSeed) {
  // The reference's setting: 6 stages, skip 1/3 -> paths of 4 stages; 5 micro-batches × 3 = 15 visits, 3 per stage.
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    const auto paths = balanced_stage_paths(6, 1.0 / 3, 5, rng);
    ASSERT_EQ(paths.size(), 5u);
    std::vector<int> visits(6, 0);
    for (const auto& p : paths) {
      ASSERT_EQ(p.size(), 4u);
      EXPECT_EQ(p.front(), 0);
      EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
      EXPECT_EQ(std::set<int64_t>(p.begin(), p.end()).size(), p.size());
      for (int64_t s : p) ++visits[static_cast<size_t>(s)];
    }
    EXPECT_EQ(visits, (std::vector<int>{5, 3, 3, 3, 3, 3}));
  }
  std::mt19937_64 a(7), b(7), c(8);
  const auto pa = balanced_stage_paths(6, 0.5, 10, a);  // 3 stages per path: 10 × 2 = 20 visits, 4 per stage
  EXPECT_EQ(pa, balanced_stage_paths(6, 0.5, 10, b));
  EXPECT_NE(pa, balanced_stage_paths(6, 0.5, 10, c)) << "another seed draws other paths";
  std::mt19937_64 rng(1);
  EXPECT_THROW(balanced_stage_paths(6, 1.0 / 3, 4, rng), InputError) << "12 visits over 5 stages";
  EXPECT_THROW(balanced_stage_paths(1, 0, 4, rng), InputError);
  EXPECT_EQ(stage_of_block(5, 6, 3), 2);
}

}  // namespace
}  // namespace dloco
