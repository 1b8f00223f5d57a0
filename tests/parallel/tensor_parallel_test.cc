// Megatron tensor parallelism's layers (parallel/tensor_parallel.h) over real Gloo groups: t ranks as
// threads of this process, joined through one c10d FileStore (tests/support/gloo_ranks.h); the whole Gloo world is
// the tensor-parallel group. Each result is compared against the plain (one-process) layer or model.
// Dimension letters: B, T, C, V, N = B·T, t the tensor-parallel degree.
// Tolerances, fp32 (ε = 2⁻²⁴ ≈ 6e-8 relative): the vocab-parallel embedding and every gather are exact (one non-zero
// summand). The column-parallel forward computes each output element as the same dot product as the plain linear, but
// which BLAS kernel computes it depends on the output width and the CPU: bitwise equal with OpenBLAS on an AVX2 EPYC,
// not on an AVX-512 one where the 4-column slices (t = 4) take another kernel that sums the 8 products in another order
// — so same_dot_products() allows a few roundings (1e-6 of the largest element, ~16 ε). Anything behind a
// row-parallel reduction or the cross-entropy's split sums adds partial sums in another order: compared with near()
// (1e-5 of each tensor's largest element, ~100 ε: a handful of roundings of sums of ≤ 128 terms). Not per element:
// an output that cancels to near zero keeps the absolute rounding of its terms (2.4e-7 measured with OpenBLAS on a
// 2-core AMD EPYC, which torch::allclose's atol 1e-8 refused). The GPT built from them is tested in tp_gpt_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/check.h"
#include "model/gpt.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_gpt.h"
#include "support/tp_ranks.h"

namespace dloco {
namespace {

using testing_support::max_abs_diff;
using testing_support::near;

// The same dot products, up to the BLAS kernel's summation order (see the tolerances above).
::testing::AssertionResult same_dot_products(const torch::Tensor& a, const torch::Tensor& b) { return near(a, b, 1e-6); }
using testing_support::tiny_config;
// t ranks as threads with a TensorParallelGroup each (tests/support/tp_ranks.h).
void on_ranks(const std::string& name, int world, const std::function<void(TensorParallelGroup&)>& body) {
  testing_support::on_tp_ranks(name, world, body);
}

TEST(ColumnParallelLinear, ForwardIsThePlainLinearAndGradientsAreItsSlices) {
  // picotron's shape: batch 2, sequence 4, 8 -> 16 with a bias.
  torch::manual_seed(0);
  torch::nn::Linear full(torch::nn::LinearOptions(8, 16).bias(true));
  const auto x = torch::randn({2, 4, 8});   // (B, T, in)
  const auto r = torch::randn({2, 4, 16});  // (B, T, out): loss = Σ Y·R, so dL/dY = R
  auto x_ref = x.clone().requires_grad_(true);
  auto y_ref = full(x_ref);  // (B, T, out)
  (y_ref * r).sum().backward();

  for (const int t : {2, 4}) {
    const int64_t rows = 16 / t;
    std::vector<torch::Tensor> y_local(t), y_gathered(t), dx(t), dw(t), db(t);
    on_ranks("column", t, [&](TensorParallelGroup& group) {
      const int k = group.rank();
      ColumnParallelLinear local(full, group, ColumnParallelOptions{1, true, false});
      ColumnParallelLinear gathered(full, group, ColumnParallelOptions{1, true, true});
      auto xi = x.clone().requires_grad_(true);
      y_local[k] = local(xi).detach();  // (B, T, out/t)
      y_gathered[k] = gathered(xi);     // (B, T, out)
      (y_gathered[k] * r).sum().backward();
      dx[k] = xi.grad();
      dw[k] = gathered->weight.grad();
      db[k] = gathered->bias.grad();
    });
    for (int k = 0; k < t; ++k) {
      EXPECT_TRUE(same_dot_products(y_gathered[k].detach(), y_ref.detach())) << "t = " << t << " rank " << k;
      EXPECT_TRUE(same_dot_products(y_local[k], y_ref.detach().narrow(-1, k * rows, rows)))
          << "t = " << t << " rank " << k;
      EXPECT_TRUE(near(dx[k], x_ref.grad()));
      EXPECT_TRUE(near(dw[k], full->weight.grad().narrow(0, k * rows, rows)));
      EXPECT_TRUE(near(db[k], full->bias.grad().narrow(0, k * rows, rows)));
    }
  }
}

TEST(RowParallelLinear, MatchesThePlainLinearWithinFp32Tolerance) {
  torch::manual_seed(1);
  torch::nn::Linear full(torch::nn::LinearOptions(16, 8).bias(true));
  const auto x = torch::randn({2, 4, 16});  // (B, T, in)
  const auto r = torch::randn({2, 4, 8});   // dL/dY
  auto x_ref = x.clone().requires_grad_(true);
  auto y_ref = full(x_ref);
  (y_ref * r).sum().backward();

  for (const int t : {2, 4}) {
    const int64_t cols = 16 / t;
    std::vector<torch::Tensor> y(t), dx(t), dw(t), db(t);
    on_ranks("row", t, [&](TensorParallelGroup& group) {
      const int k = group.rank();
      RowParallelLinear row(full, group);
      auto xi = x.narrow(-1, k * cols, cols).clone().requires_grad_(true);  // (B, T, in/t): the input is split
      y[k] = row(xi);
      (y[k] * r).sum().backward();
      dx[k] = xi.grad();
      dw[k] = row->weight.grad();
      db[k] = row->bias.grad();
    });
    for (int k = 0; k < t; ++k) {
      EXPECT_TRUE(near(y[k].detach(), y_ref.detach())) << max_abs_diff(y[k].detach(), y_ref.detach());
      EXPECT_TRUE(near(dx[k], x_ref.grad().narrow(-1, k * cols, cols)));
      EXPECT_TRUE(near(dw[k], full->weight.grad().narrow(1, k * cols, cols)));
      EXPECT_TRUE(near(db[k], full->bias.grad()));  // replicated, added after the reduction
    }
    EXPECT_TRUE(torch::equal(y[0], y[t - 1])) << "every rank holds the same reduced output";
  }
}

TEST(TensorParallelCounts, TwoAllReducesPerLayerForwardAndTwoBackward) {
  torch::manual_seed(2);
  const ModelConfig cfg = tiny_config(true);
  GPT full(cfg);
  const auto x = torch::randn({2, 16, 32});                       // (B, T, C)
  const auto idx = torch::randint(0, 64, {2, 16}, torch::kLong);  // (B, T)
  const int64_t L = cfg.n_layer;
  std::vector<std::vector<TensorParallelCounts>> seen(2);
  on_ranks("counts", 2, [&](TensorParallelGroup& group) {
    auto& mine = seen[group.rank()];
    TensorParallelBlock block(*full->h->ptr<BlockImpl>(0), cfg, group);
    auto xi = x.clone().requires_grad_(true);
    auto cos = full->named_buffers()["rope_cos"], sin = full->named_buffers()["rope_sin"];
    auto y = block(xi, cos, sin, full->named_buffers()["causal"]);
    mine.push_back(group.counts());  // 0: after one block's forward
    y.sum().backward();
    mine.push_back(group.counts());  // 1: after its backward
    TensorParallelGPT model(full, group);
    auto loss = model->loss(idx, idx);
    mine.push_back(group.counts());  // 2: after the model's forward and loss
    loss.backward();
    mine.push_back(group.counts());  // 3: after its backward
  });
  for (const auto& c : seen) {
    ASSERT_EQ(c.size(), 4u);
    EXPECT_EQ(c[0].g_forward, 2);  // attention's g and the MLP's g
    EXPECT_EQ(c[0].f_backward, 0);
    EXPECT_EQ(c[1].g_forward, 2);   // backward adds no g
    EXPECT_EQ(c[1].f_backward, 2);  // attention's f and the MLP's f
    EXPECT_EQ(c[1].total(), 4);
    // The whole model: 2 per block each way, one g for the embedding and one f for the tied head, and the
    // cross-entropy's three in forward only.
    EXPECT_EQ(c[2].g_forward - c[1].g_forward, 2 * L + 1);
    EXPECT_EQ(c[2].cross_entropy, 3);
    EXPECT_EQ(c[2].f_backward - c[1].f_backward, 0);
    EXPECT_EQ(c[3].f_backward - c[2].f_backward, 2 * L + 1);
    EXPECT_EQ(c[3].g_forward, c[2].g_forward);
    EXPECT_EQ(c[3].cross_entropy, 3);
    EXPECT_EQ(c[3].gather, 0);
  }
}

// The gathers (a column-parallel output, a sharded parameter) are the adapter's all-gather of each rank's piece,
// not an all-reduce of a zero-padded full tensor: the Collective's own counters say which kind moved the bytes,
// (t − 1)/t of the full tensor per gather instead of the all-reduce's 2(t − 1)/t; the results stay the plain layer's.
TEST(TensorParallelCounts, GathersAreAllGathersOfThePiecesNotAllReducesOfPaddedTensors) {
  torch::manual_seed(8);
  torch::nn::Linear full(torch::nn::LinearOptions(8, 16).bias(true));
  const auto x = torch::randn({2, 4, 8});  // (B, T, in)
  const auto y_ref = full(x).detach();     // (B, T, out)
  for (const int t : {2, 4}) {
    on_ranks("gathers", t, [&](TensorParallelGroup& group) {
      ColumnParallelLinear layer(full, group, ColumnParallelOptions{1, true, true});
      const Traffic before = group.traffic();
      const auto y = layer(x).detach();  // f is the identity forward: the gather is the only collective
      const Traffic mid = group.traffic();
      EXPECT_TRUE(same_dot_products(y, y_ref)) << "t = " << t;
      EXPECT_EQ(mid.all_gather.calls - before.all_gather.calls, 1) << "t = " << t;
      EXPECT_EQ(mid.all_reduce.calls - before.all_reduce.calls, 0) << "t = " << t;
      EXPECT_EQ(mid.all_gather.bytes - before.all_gather.bytes, (t - 1) * y.nbytes() / t) << "t = " << t;
      const auto weight = gather_shards(layer->weight, layer->shard_spec("weight"), {16, 8}, group);  // (out, in)
      const Traffic after = group.traffic();
      EXPECT_TRUE(torch::equal(weight, full->weight)) << "t = " << t;
      EXPECT_EQ(after.all_gather.calls - mid.all_gather.calls, 1) << "t = " << t;
      EXPECT_EQ(after.all_reduce.calls, before.all_reduce.calls) << "t = " << t;
      EXPECT_EQ(group.counts().gather, 2) << "t = " << t;
    });
  }
}

TEST(VocabParallelCrossEntropy, ReproducesMegatronsFixedAnswerAtTp4) {
  // Megatron core's test: each of 4 ranks holds logits 0..7 repeated to 16 × 32 (V = 128); targets 0, 2, …, 30,
  // all in rank 0's columns. loss_n = log(16 · Σ_{k=0}^{7} e^k) − logit[target_n] = 10.2309 − {0, 2, 4, 6}.
  const int t = 4;
  const auto local_logits = torch::arange(8, torch::kFloat).repeat({16, 4});  // (N = 16, V/t = 32)
  const auto targets = torch::arange(0, 32, 2, torch::kLong);                 // (N)
  const auto full_logits = local_logits.repeat({1, t});                       // (N, V = 128)
  auto ref = full_logits.clone().requires_grad_(true);
  cross_entropy(ref, targets).backward();
  std::vector<torch::Tensor> losses(t), grads(t);
  on_ranks("ce_fixed", t, [&](TensorParallelGroup& group) {
    auto logits = local_logits.clone().requires_grad_(true);
    auto per_token = vocab_parallel_cross_entropy_per_token(logits, targets, group);  // (N)
    losses[group.rank()] = per_token.detach();
    per_token.mean().backward();
    grads[group.rank()] = logits.grad();
  });
  const double expected[4] = {10.2309, 8.2309, 6.2309, 4.2309};
  for (int k = 0; k < t; ++k) {
    ASSERT_EQ(losses[k].size(0), 16);
    for (int64_t n = 0; n < 16; ++n) {
      EXPECT_NEAR(losses[k][n].item<double>(), expected[n % 4], 5e-5)
          << "rank " << k << " token " << n;  // 4 decimals given
    }
    EXPECT_TRUE(near(grads[k], ref.grad().narrow(1, k * 32, 32)));
  }
}

TEST(VocabParallelCrossEntropy, MatchesThePlainCrossEntropyWithTargetsOnEveryRank) {
  torch::manual_seed(3);
  const int t = 4;
  const auto full_logits = 3 * torch::randn({24, 128});             // (N, V)
  const auto targets = torch::randint(0, 128, {24}, torch::kLong);  // (N), spread over the 4 ranks' columns
  auto ref = full_logits.clone().requires_grad_(true);
  auto ref_loss = cross_entropy(ref, targets);
  ref_loss.backward();
  std::vector<torch::Tensor> losses(t), grads(t);
  on_ranks("ce_random", t, [&](TensorParallelGroup& group) {
    const int k = group.rank();
    auto logits = full_logits.narrow(1, k * 32, 32).clone().requires_grad_(true);  // (N, V/t)
    auto loss = vocab_parallel_cross_entropy(logits, targets, group);
    losses[k] = loss.detach();
    loss.backward();
    grads[k] = logits.grad();
  });
  for (int k = 0; k < t; ++k) {
    EXPECT_NEAR(losses[k].item<double>(), ref_loss.item<double>(), 1e-5 * ref_loss.item<double>());
    EXPECT_TRUE(near(grads[k], ref.grad().narrow(1, k * 32, 32)));
  }
}

TEST(VocabParallelEmbedding, LooksUpExactlyThePlainRowsAndGradientsAreItsSlices) {
  torch::manual_seed(4);
  torch::nn::Embedding full(64, 8);
  const auto idx = torch::randint(0, 64, {3, 10}, torch::kLong);  // (B, T)
  const auto r = torch::randn({3, 10, 8});
  auto y_ref = full(idx);
  (y_ref * r).sum().backward();
  std::vector<torch::Tensor> y(2), dw(2);
  on_ranks("embedding", 2, [&](TensorParallelGroup& group) {
    VocabParallelEmbedding wte(full, group);
    y[group.rank()] = wte(idx);
    (y[group.rank()] * r).sum().backward();
    dw[group.rank()] = wte->weight.grad();
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_TRUE(torch::equal(y[k].detach(), y_ref.detach())) << "rank " << k;  // one non-zero summand per element
    EXPECT_TRUE(torch::equal(dw[k], full->weight.grad().narrow(0, k * 32, 32))) << "rank " << k;
  }
}

}  // namespace
}  // namespace dloco
