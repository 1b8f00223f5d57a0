// Property and hand-computed tests of the merge math (docs/protocol.md §4 steps 4–7, §6).
#include "core/merge.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/check.h"

namespace dloco {
namespace {

using Vectors = std::vector<std::vector<float>>;

std::vector<std::span<const float>> spans(const Vectors& v) { return {v.begin(), v.end()}; }

Vectors random_vectors(std::mt19937_64& rng, int M, int n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Vectors v(M, std::vector<float>(n));
  for (auto& x : v) {
    for (float& e : x) e = normal(rng);
  }
  return v;
}

void scale_to_norm(std::vector<float>& x, double norm) {
  const double f = norm / l2_norm(x);
  for (float& e : x) e = static_cast<float>(e * f);
}

TEST(TokenWeight, QuantityTimesQuality) {
  EXPECT_DOUBLE_EQ(token_weight(0, 0), 0.0);
  EXPECT_DOUBLE_EQ(token_weight(100, 0), 0.0);  // no steps: nothing to merge
  EXPECT_DOUBLE_EQ(token_weight(0, 5), 0.0);
  EXPECT_DOUBLE_EQ(token_weight(100, 1), 10000.0);
  EXPECT_DOUBLE_EQ(token_weight(2048, 4), 2048.0 * 2048.0 / 4.0);
  // Same tokens in fewer steps (bigger batches) weigh more; more tokens in the same steps weigh more.
  EXPECT_GT(token_weight(1000, 2), token_weight(1000, 4));
  EXPECT_GT(token_weight(2000, 4), token_weight(1000, 4));
  // Two learners at the same tokens/step: weight ∝ steps (tokens²/steps = rate²·steps).
  EXPECT_DOUBLE_EQ(token_weight(3000, 6) / token_weight(1000, 2), 3.0);
  // Large counts stay exact enough in double.
  EXPECT_DOUBLE_EQ(token_weight(int64_t{1} << 32, 1), std::ldexp(1.0, 64));
  EXPECT_THROW(token_weight(-1, 2), InputError);
  EXPECT_THROW(token_weight(1, -2), InputError);
}

TEST(NormaliseWeights, SumsToOneAndKeepsRatios) {
  const std::vector<double> w{1.0, 3.0, 0.0, 4.0};
  const std::vector<double> n = normalise_weights(w);
  EXPECT_DOUBLE_EQ(n[0], 0.125);
  EXPECT_DOUBLE_EQ(n[1], 0.375);
  EXPECT_DOUBLE_EQ(n[2], 0.0);
  EXPECT_DOUBLE_EQ(n[3], 0.5);
  EXPECT_DOUBLE_EQ(normalise_weights(std::vector<double>{7.0})[0], 1.0);
}

TEST(NormaliseWeights, RefusesAllZeroNegativeEmptyNonFinite) {
  EXPECT_FALSE(merge_has_weight(std::vector<double>{0.0, 0.0}));
  EXPECT_TRUE(merge_has_weight(std::vector<double>{0.0, 1e-30}));
  EXPECT_THROW(normalise_weights(std::vector<double>{0.0, 0.0}), InputError);
  EXPECT_THROW(normalise_weights(std::vector<double>{}), InputError);
  EXPECT_THROW(normalise_weights(std::vector<double>{1.0, -0.5}), InputError);
  EXPECT_THROW(normalise_weights(std::vector<double>{1.0, NAN}), InputError);
  EXPECT_THROW(normalise_weights(std::vector<double>{1.0, INFINITY}), InputError);
}

TEST(WeightedMean, ByHand) {
  const Vectors v{{1, 2, 3}, {3, 6, 9}};
  std::vector<float> out(3);
  weighted_mean(spans(v), std::vector<double>{3.0, 1.0}, out);  // (3·v0 + v1)/4
  EXPECT_FLOAT_EQ(out[0], 1.5f);
  EXPECT_FLOAT_EQ(out[1], 3.0f);
  EXPECT_FLOAT_EQ(out[2], 4.5f);
}

TEST(Rda, KeepsTheNormWhenAllNormsAreEqual) {
  std::mt19937_64 rng(1);
  for (int M : {1, 2, 3, 8, 16, 32}) {
    for (int n : {1, 2, 64, 1000}) {
      for (double R : {1e-3, 1.0, 250.0}) {
        Vectors v = random_vectors(rng, M, n);
        for (auto& x : v) scale_to_norm(x, R);
        std::vector<double> w(M);
        std::uniform_real_distribution<double> weight(0.1, 10.0);
        for (double& x : w) x = weight(rng);
        std::vector<float> out(n), mean(n);
        radial_directional_average(spans(v), w, out);
        weighted_mean(spans(v), w, mean);
        if (n == 1 && M > 1) {
          // In 1-D directions are ±1 and may cancel exactly; otherwise the norm is R.
          if (l2_norm(out) > 0) {
            EXPECT_NEAR(l2_norm(out), R, 1e-5 * R);
          }
          continue;
        }
        EXPECT_NEAR(l2_norm(out), R, 1e-5 * R) << "M = " << M << " n = " << n;
        // The plain mean of nearly orthogonal vectors shrinks like R/√M: RDA does not.
        if (M >= 8 && n >= 64) {
          EXPECT_LT(l2_norm(mean), 0.6 * R);
        }
      }
    }
  }
}

TEST(Rda, EqualsTheMeanForIdenticalInputs) {
  std::mt19937_64 rng(2);
  for (int M : {1, 2, 5}) {
    const Vectors one = random_vectors(rng, 1, 100);
    const Vectors v(M, one[0]);
    std::vector<double> w(M, 1.0);
    w[0] = 3.0;
    std::vector<float> out(100);
    radial_directional_average(spans(v), w, out);
    for (int i = 0; i < 100; ++i) EXPECT_NEAR(out[i], one[0][i], 1e-5) << i;
  }
}

TEST(Rda, ByHandOnTwoOrthogonalVectors) {
  // v0 = (3, 0), v1 = (0, 1), w = (1, 1): radius (3 + 1)/2 = 2, direction ((1,0) + (0,1))/2 → φ = (1,1)/√2,
  // RDA = 2·(1,1)/√2 = (√2, √2). The plain mean (1.5, 0.5) is shorter.
  const Vectors v{{3, 0}, {0, 1}};
  std::vector<float> out(2);
  radial_directional_average(spans(v), std::vector<double>{1, 1}, out);
  EXPECT_NEAR(out[0], std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(out[1], std::sqrt(2.0), 1e-6);
}

TEST(Rda, ZeroWeightRemovesALearner) {
  std::mt19937_64 rng(3);
  const Vectors v = random_vectors(rng, 3, 50);
  std::vector<float> with_zero(50), without(50), mean_zero(50), mean_without(50);
  radial_directional_average(spans(v), std::vector<double>{2.0, 0.0, 5.0}, with_zero);
  const Vectors two{v[0], v[2]};
  radial_directional_average(spans(two), std::vector<double>{2.0, 5.0}, without);
  weighted_mean(spans(v), std::vector<double>{2.0, 0.0, 5.0}, mean_zero);
  weighted_mean(spans(two), std::vector<double>{2.0, 5.0}, mean_without);
  for (int i = 0; i < 50; ++i) {
    EXPECT_NEAR(with_zero[i], without[i], 1e-6);
    EXPECT_NEAR(mean_zero[i], mean_without[i], 1e-6);
  }
}

TEST(Rda, ScalingAllWeightsChangesNothing) {
  std::mt19937_64 rng(4);
  const Vectors v = random_vectors(rng, 4, 64);
  const std::vector<double> w{1.0, 2.0, 3.0, 4.0}, w2{2.0, 4.0, 6.0, 8.0}, w_big{1e6, 2e6, 3e6, 4e6};
  std::vector<float> a(64), b(64), c(64);
  radial_directional_average(spans(v), w, a);
  radial_directional_average(spans(v), w2, b);
  radial_directional_average(spans(v), w_big, c);
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-6);
    EXPECT_NEAR(a[i], c[i], 1e-6);
  }
}

TEST(Rda, WeightsPullTheDirection) {
  // A heavier learner pulls the direction toward itself.
  const Vectors v{{1, 0}, {0, 1}};
  std::vector<float> out(2);
  radial_directional_average(spans(v), std::vector<double>{9.0, 1.0}, out);
  EXPECT_GT(out[0], 5 * out[1]);
  EXPECT_NEAR(l2_norm(out), 1.0, 1e-6);
}

TEST(Rda, FallsBackToTheMeanWhenDirectionsCancel) {
  const Vectors opposite{{1, 2}, {-1, -2}};
  std::vector<float> out{7, 7};
  radial_directional_average(spans(opposite), std::vector<double>{1, 1}, out);
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], 0.0f);
  const Vectors zeros{{0, 0, 0}, {0, 0, 0}};
  std::vector<float> z{5, 5, 5};
  radial_directional_average(spans(zeros), std::vector<double>{1, 2}, z);
  EXPECT_EQ(z, (std::vector<float>{0, 0, 0}));
  // A zero input contributes no direction (φ(0) = 0) but still its zero length.
  const Vectors one_zero{{0, 0}, {2, 0}};
  std::vector<float> h(2);
  radial_directional_average(spans(one_zero), std::vector<double>{1, 1}, h);
  EXPECT_NEAR(h[0], 1.0, 1e-6);  // radius (0 + 2)/2 = 1, direction (1, 0)
  EXPECT_NEAR(h[1], 0.0, 1e-6);
}

TEST(Rda, EmptyVectorsAndBadShapes) {
  const Vectors empty{{}, {}};
  std::vector<float> out;
  EXPECT_NO_THROW(radial_directional_average(spans(empty), std::vector<double>{1, 1}, out));
  const Vectors v{{1, 2}, {3}};
  std::vector<float> o(2);
  EXPECT_THROW(radial_directional_average(spans(v), std::vector<double>{1, 1}, o), InputError);
  const Vectors ok{{1, 2}, {3, 4}};
  EXPECT_THROW(radial_directional_average(spans(ok), std::vector<double>{1}, o), InputError);
  EXPECT_THROW(radial_directional_average(spans(ok), std::vector<double>{0, 0}, o), InputError);
  EXPECT_THROW(weighted_mean(spans(Vectors{}), std::vector<double>{}, o), InputError);
}

TEST(MergeFragment, RdaPerBlockAndMeanForTheEmbedding) {
  // Two tensors in one fragment: "emb" (2 elements) and "w" (2 elements). Learner 0: emb (3,0), w (3,0);
  // learner 1: emb (0,1), w (0,1). Equal weights. emb → mean (1.5, 0.5); w → RDA (√2, √2).
  const FragmentLayout layout = make_fragment_layout({{"emb", {1, 2}}, {"w", {1, 2}}}, 1);
  const Vectors grads{{3, 0, 3, 0}, {0, 1, 0, 1}};
  std::vector<float> out(4);
  auto is_embedding = [](const std::string& name) { return name == "emb"; };
  merge_fragment(layout, 0, spans(grads), std::vector<double>{1, 1}, MergeRule::kRda, is_embedding, out);
  EXPECT_FLOAT_EQ(out[0], 1.5f);
  EXPECT_FLOAT_EQ(out[1], 0.5f);
  EXPECT_NEAR(out[2], std::sqrt(2.0), 1e-6);
  EXPECT_NEAR(out[3], std::sqrt(2.0), 1e-6);
  // kMean: the plain mean everywhere.
  merge_fragment(layout, 0, spans(grads), std::vector<double>{1, 1}, MergeRule::kMean, is_embedding, out);
  EXPECT_FLOAT_EQ(out[2], 1.5f);
  EXPECT_FLOAT_EQ(out[3], 0.5f);
  // No embedding predicate: RDA everywhere.
  merge_fragment(layout, 0, spans(grads), std::vector<double>{1, 1}, MergeRule::kRda, nullptr, out);
  EXPECT_NEAR(out[0], std::sqrt(2.0), 1e-6);
}

// docs/protocol.md §10: "the merged outer gradient's norm needs no check of its own: RDA and the weighted mean keep it
// at or below the largest accepted answer's". Per block ‖r_b‖ ≤ Σ_m w_m ‖Δ_m,b‖ (RDA: the weighted mean radius
// times a unit or shorter direction; the mean: the triangle inequality), and over the blocks Jensen's inequality gives
// ‖r‖² ≤ Σ_m w_m ‖Δ_m‖² ≤ max_m ‖Δ_m‖². Checked on random fragments (several tensors, an embedding, scales
// 10^-3..10^3, weights with zeros, opposite directions) for both rules.
TEST(MergeFragment, TheMergedNormIsAtMostTheLargestAnswersNorm) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1, 1);
  std::uniform_int_distribution<int> learners(1, 6), dims(1, 9);
  auto is_embedding = [](const std::string& name) { return name == "emb"; };
  for (int trial = 0; trial < 300; ++trial) {
    const FragmentLayout layout = make_fragment_layout(
        {{"emb", {dims(rng), dims(rng)}}, {"a", {dims(rng), dims(rng)}}, {"b", {dims(rng)}}}, 1);
    const auto n = static_cast<size_t>(layout.fragments[0].numel);
    const int M = learners(rng);
    Vectors grads(M, std::vector<float>(n));
    std::vector<double> weights(M);
    for (int m = 0; m < M; ++m) {
      const float scale = std::pow(10.0f, 3.0f * unit(rng));
      for (auto& v : grads[m]) v = scale * unit(rng);
      if (m == 1 && trial % 3 == 0) {  // opposite to learner 0: directions cancel
        for (size_t i = 0; i < n; ++i) grads[1][i] = -grads[0][i];
      }
      weights[m] = trial % 5 == 0 && m > 0 ? 0.0 : 0.1 + (unit(rng) + 1);
    }
    double largest = 0;
    for (int m = 0; m < M; ++m) {
      if (weights[m] == 0) continue;  // a zero weight takes no part
      double sq = 0;
      for (float v : grads[m]) sq += double(v) * v;
      largest = std::max(largest, std::sqrt(sq));
    }
    for (MergeRule rule : {MergeRule::kRda, MergeRule::kMean}) {
      std::vector<float> out(n);
      merge_fragment(layout, 0, spans(grads), weights, rule, is_embedding, out);
      double sq = 0;
      for (float v : out) sq += double(v) * v;
      EXPECT_LE(std::sqrt(sq), largest * (1 + 1e-5) + 1e-30) << "trial " << trial << ", rule " << (rule == MergeRule::kRda ? "rda" : "mean");
    }
  }
}

TEST(MergeFragment, NormsArePerBlock) {
  // Two tensors in one fragment at very different scales. Per block: block a has radius (100 + 1)/2 = 50.5, block
  // b radius 0.01 with orthogonal directions. A norm over the whole fragment would let block a's scale leak into b.
  const FragmentLayout layout = make_fragment_layout({{"a", {2}}, {"b", {2}}}, 1);
  const Vectors grads{{100, 0, 0.01f, 0}, {0, 1, 0, 0.01f}};
  std::vector<float> out(4);
  merge_fragment(layout, 0, spans(grads), std::vector<double>{1, 1}, MergeRule::kRda, nullptr, out);
  EXPECT_NEAR(l2_norm(std::span<const float>(out).subspan(0, 2)), 50.5, 1e-4);
  EXPECT_NEAR(l2_norm(std::span<const float>(out).subspan(2, 2)), 0.01, 1e-8);
  EXPECT_NEAR(out[2], out[3], 1e-8);
}

TEST(MergeFragment, RefusesMisShapedInput) {
  const FragmentLayout layout = make_fragment_layout({{"a", {2}}, {"b", {2}}}, 2);
  const Vectors grads{{1, 2}, {3}};
  std::vector<float> out(2);
  EXPECT_THROW(merge_fragment(layout, 0, spans(grads), std::vector<double>{1, 1}, MergeRule::kRda, nullptr, out),
               InputError);
  const Vectors ok{{1, 2}};
  EXPECT_THROW(merge_fragment(layout, 2, spans(ok), std::vector<double>{1}, MergeRule::kRda, nullptr, out), InputError);
  std::vector<float> long_out(3);
  EXPECT_THROW(merge_fragment(layout, 0, spans(ok), std::vector<double>{1}, MergeRule::kRda, nullptr, long_out),
               InputError);
}

TEST(Nesterov, AgainstAHandComputation) {
  // η = 0.5, μ = 0.9, Θ₀ = (1, −2), v₀ = 0.
  // step 1, Δ = (1, 0):   v = 0.9·0 + Δ = (1, 0);        Θ = Θ − 0.5·(Δ + 0.9·v) = (1 − 0.5·1.9, −2) = (0.05, −2)
  // step 2, Δ = (1, 2):   v = 0.9·(1,0) + (1,2) = (1.9, 2);  Δ + 0.9·v = (1 + 1.71, 2 + 1.8) = (2.71, 3.8)
  //                       Θ = (0.05 − 1.355, −2 − 1.9) = (−1.305, −3.9)
  // step 3, Δ = (0, 0):   v = 0.9·(1.9, 2) = (1.71, 1.8);    Δ + 0.9·v = (1.539, 1.62)
  //                       Θ = (−1.305 − 0.7695, −3.9 − 0.81) = (−2.0745, −4.71)   (momentum keeps moving Θ)
  std::vector<float> theta{1, -2}, v{0, 0};
  nesterov_outer_step(theta, v, std::vector<float>{1, 0}, 0.5f, 0.9f);
  EXPECT_NEAR(theta[0], 0.05, 1e-6);
  EXPECT_NEAR(theta[1], -2.0, 1e-6);
  EXPECT_NEAR(v[0], 1.0, 1e-6);
  nesterov_outer_step(theta, v, std::vector<float>{1, 2}, 0.5f, 0.9f);
  EXPECT_NEAR(v[0], 1.9, 1e-6);
  EXPECT_NEAR(v[1], 2.0, 1e-6);
  EXPECT_NEAR(theta[0], -1.305, 1e-5);
  EXPECT_NEAR(theta[1], -3.9, 1e-5);
  nesterov_outer_step(theta, v, std::vector<float>{0, 0}, 0.5f, 0.9f);
  EXPECT_NEAR(v[0], 1.71, 1e-5);
  EXPECT_NEAR(v[1], 1.8, 1e-5);
  EXPECT_NEAR(theta[0], -2.0745, 1e-5);
  EXPECT_NEAR(theta[1], -4.71, 1e-5);
}

TEST(Nesterov, NoMomentumIsPlainSgdAndSizesAreChecked) {
  // μ = 0, η = 1: Θ ← Θ − Δ = θ_local, i.e. DiLoCo with one learner just copies the local model.
  std::vector<float> theta{2, 3}, v{0, 0};
  nesterov_outer_step(theta, v, std::vector<float>{0.5f, -1}, 1.0f, 0.0f);
  EXPECT_FLOAT_EQ(theta[0], 1.5f);
  EXPECT_FLOAT_EQ(theta[1], 4.0f);
  std::vector<float> empty;
  EXPECT_NO_THROW(nesterov_outer_step(empty, empty, empty, 0.7f, 0.9f));
  std::vector<float> short_v{0};
  EXPECT_THROW(nesterov_outer_step(theta, short_v, std::vector<float>{1, 1}, 0.7f, 0.9f), InputError);
  EXPECT_THROW(nesterov_outer_step(theta, v, std::vector<float>{1, 1}, NAN, 0.9f), InputError);
}

TEST(OuterGradient, SignMovesTheGlobalModelTowardTheLearner) {
  // Two parameters, loss ‖θ − target‖². The learner starts at Θ = (0, 0) and takes 4 inner gradient steps toward
  // target = (3, −1), so θ ends up between Θ and the target: θ_x > Θ_x and θ_y < Θ_y. Δ = Θ − θ is then (−, +),
  // and the outer step Θ − η·(…) must move Θ toward the target too. A reversed sign moves it away.
  const std::vector<float> target{3.0f, -1.0f};
  std::vector<float> global{0.0f, 0.0f}, v{0.0f, 0.0f};
  std::vector<float> local = global;
  for (int inner = 0; inner < 4; ++inner) {
    for (int i = 0; i < 2; ++i) local[i] -= 0.1f * 2.0f * (local[i] - target[i]);
  }
  std::vector<float> delta(2);
  outer_gradient(global, local, delta);
  EXPECT_LT(delta[0], 0.0f);
  EXPECT_GT(delta[1], 0.0f);
  const double before = std::hypot(global[0] - target[0], global[1] - target[1]);
  nesterov_outer_step(global, v, delta, 0.7f, 0.9f);
  const double after = std::hypot(global[0] - target[0], global[1] - target[1]);
  EXPECT_LT(after, before);
  EXPECT_GT(global[0], 0.0f);  // moved toward +3
  EXPECT_LT(global[1], 0.0f);  // moved toward −1
}

TEST(OuterGradient, DefinitionAndAliasing) {
  std::vector<float> global{1, 2, 3}, local{0.5f, 2, 4}, delta(3);
  outer_gradient(global, local, delta);
  EXPECT_EQ(delta, (std::vector<float>{0.5f, 0, -1}));
  outer_gradient(global, local, local);  // in place over the local buffer
  EXPECT_EQ(local, (std::vector<float>{0.5f, 0, -1}));
  std::vector<float> wrong(2);
  EXPECT_THROW(outer_gradient(global, local, wrong), InputError);
}

}  // namespace
}  // namespace dloco
