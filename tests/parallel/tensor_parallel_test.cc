// Megatron tensor parallelism (parallel/tensor_parallel.h, parallel/tp_gpt.h) over real Gloo groups: t ranks as
// threads of this process, joined through one c10d FileStore (tests/support/gloo_ranks.h); the whole Gloo world is
// the tensor-parallel group. Each result is compared against the plain (one-process) layer or model.
// Dimension letters: B, T, C, V, N = B·T, t the tensor-parallel degree.
// Tolerances, fp32 (ε = 2⁻²⁴ ≈ 6e-8 relative): the column-parallel forward, the vocab-parallel embedding and every
// gather are exact (each output element is the same dot product, or has one non-zero summand); anything behind a
// row-parallel reduction or the cross-entropy's split sums adds partial sums in another order: forward values are
// compared with torch::allclose's default rtol 1e-5, atol 1e-8 (~100 ε: a handful of roundings of sums of ≤ 128
// terms), gradients with near() below (the same 1e-5, against each tensor's largest element). The GPT test states
// its own bounds and the values measured.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "core/check.h"
#include "model/gpt.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_gpt.h"
#include "support/gloo_ranks.h"

namespace dloco {
namespace {

// Runs body(group) on `world` ranks (tests/support/gloo_ranks.h), one intra-op thread each (the ranks share 2
// cores), the whole group being the tensor-parallel group. Fails the test with each rank's error, if any.
void on_ranks(const std::string& name, int world, const std::function<void(TensorParallelGroup&)>& body) {
  const auto errors = testing_support::on_ranks(testing_support::fresh_store("tp"), world, [&](Collective& collective) {
    torch::set_num_threads(1);
    TensorParallelGroup group(collective);
    body(group);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << name << ": rank " << r;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Gradients are sums over tokens, and an element near 0 may come out of cancellation: compared against the
// tensor's largest magnitude, max |a − b| ≤ 1e-5 · max |b| (the elementwise rtol of allclose fails on a −2e-4
// bias gradient whose 8 summands are ~1 and were added in another order).
::testing::AssertionResult near(const torch::Tensor& a, const torch::Tensor& b, double rtol = 1e-5) {
  const double diff = max_abs_diff(a, b), scale = b.abs().max().item<double>();
  if (diff <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << diff << " > " << rtol << " · max |b| = " << rtol * scale;
}

TEST(ColumnParallelLinear, ForwardIsBitwiseThePlainLinearAndGradientsAreItsSlices) {
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
      EXPECT_TRUE(torch::equal(y_gathered[k].detach(), y_ref.detach())) << "t = " << t << " rank " << k;
      EXPECT_TRUE(torch::equal(y_local[k], y_ref.detach().narrow(-1, k * rows, rows))) << "t = " << t << " rank " << k;
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
      EXPECT_TRUE(torch::allclose(y[k].detach(), y_ref.detach())) << max_abs_diff(y[k].detach(), y_ref.detach());
      EXPECT_TRUE(near(dx[k], x_ref.grad().narrow(-1, k * cols, cols)));
      EXPECT_TRUE(near(dw[k], full->weight.grad().narrow(1, k * cols, cols)));
      EXPECT_TRUE(near(db[k], full->bias.grad()));  // replicated, added after the reduction
    }
    EXPECT_TRUE(torch::equal(y[0], y[t - 1])) << "every rank holds the same reduced output";
  }
}

ModelConfig tiny_config(bool tied) {
  ModelConfig m;
  m.vocab_size = 64;  // V
  m.seq_len = 16;     // T
  m.n_layer = 2;      // L
  m.n_head = 4;       // NH
  m.d_model = 32;     // C (F = 128)
  m.tie_embeddings = tied;
  return m;
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
// (t − 1)/t of the full tensor per gather instead of the all-reduce's 2(t − 1)/t; the results stay bitwise.
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
      EXPECT_TRUE(torch::equal(y, y_ref)) << "t = " << t;
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

TEST(TensorParallelGPT, GatherOfShardReproducesEveryParameterExactly) {
  for (const bool tied : {true, false}) {
    const ModelConfig cfg = tiny_config(tied);
    torch::manual_seed(5);
    GPT source(cfg);
    std::vector<GPT> targets;
    for (int k = 0; k < 2; ++k) {
      torch::manual_seed(6 + k);  // other values everywhere
      targets.emplace_back(cfg);
    }
    std::vector<torch::Tensor> qkv_shard(2);
    std::vector<int64_t> held(2);  // parameters one rank holds
    on_ranks("gather", 2, [&](TensorParallelGroup& group) {
      TensorParallelGPT model(source, group);
      qkv_shard[group.rank()] = model->named_parameters()["h.1.attn.qkv.weight"].detach().clone();
      held[group.rank()] = count_parameters(*model);
      model->write_to(targets[group.rank()]);
    });
    // Every matrix is split in half; the norm gains ((2L + 1)·C = 160) are replicated.
    const int64_t replicated = (2 * cfg.n_layer + 1) * cfg.d_model;
    for (int k = 0; k < 2; ++k) EXPECT_EQ(held[k], (gpt_parameter_count(cfg) - replicated) / 2 + replicated);
    const auto expected = source->named_parameters();
    for (int k = 0; k < 2; ++k) {
      const auto got = targets[k]->named_parameters();
      ASSERT_EQ(got.size(), expected.size());
      for (const auto& p : expected) {
        EXPECT_TRUE(torch::equal(got[p.key()], p.value())) << p.key() << " rank " << k << " tied " << tied;
      }
      // The fused qkv shard: rank k's heads (rows [16k, 16k + 16) of each of q, k, v in the (96, 32) weight).
      const auto full_qkv = expected["h.1.attn.qkv.weight"];
      const auto rows = torch::cat(
          {full_qkv.narrow(0, 16 * k, 16), full_qkv.narrow(0, 32 + 16 * k, 16), full_qkv.narrow(0, 64 + 16 * k, 16)});
      EXPECT_TRUE(torch::equal(qkv_shard[k], rows)) << "rank " << k;
    }
  }
}

TEST(TensorParallelGPT, RefusesADegreeThatDoesNotDivideHeadsWidthOrVocabulary) {
  // t = 3 divides none of NH = 4, F = 128, V = 64: every rank refuses before any collective, naming the key.
  const ModelConfig cfg = tiny_config(true);
  GPT full(cfg);
  std::vector<std::string> messages(3);
  on_ranks("indivisible", 3, [&](TensorParallelGroup& group) {
    try {
      TensorParallelGPT model(full, group);
    } catch (const InputError& e) {
      messages[group.rank()] = e.what();
    }
  });
  for (const auto& m : messages) EXPECT_NE(m.find("model.vocab_size = 64"), std::string::npos) << m;
}

// TP = t against one process running the full GPT on the same 5 batches, each side its own global-norm clipping
// and AdamW (each rank on its shards). Compared: step-1 logits and loss, every step-1 gradient (gathered), the
// gradient norm of every step, the parameters after 5 steps.
void expect_trains_like_the_full_model(bool tied, int t) {
  const ModelConfig cfg = tiny_config(tied);
  const int steps = 5;
  torch::manual_seed(7);
  GPT reference(cfg);
  std::map<std::string, torch::Tensor> initial;  // Θ before training, to measure how far the 5 steps moved it
  for (const auto& p : reference->named_parameters()) initial[p.key()] = p.value().detach().clone();
  std::vector<torch::Tensor> idx, targets;  // (B = 4, T = 16) each
  for (int s = 0; s < steps; ++s) {
    idx.push_back(torch::randint(0, 64, {4, 16}, torch::kLong));
    targets.push_back(torch::randint(0, 64, {4, 16}, torch::kLong));
  }
  const auto adamw = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);  // large lr: 5 steps move every weight
  constexpr double kMaxNorm = 0.5;  // global-norm clipping, below the measured ‖g‖ of every step: it clips

  struct Rank {
    torch::Tensor logits, loss;
    std::vector<std::pair<std::string, torch::Tensor>> grads, params;
    std::vector<double> norms;  // ‖g‖ before clipping, per step
  };
  std::vector<Rank> ranks(t);
  on_ranks("gpt", t, [&](TensorParallelGroup& group) {  // shards `reference` before it trains
    auto& mine = ranks[group.rank()];
    TensorParallelGPT model(reference, group);
    torch::optim::AdamW optimizer(model->parameters(), adamw);
    {
      torch::NoGradGuard no_grad;
      mine.logits = gather_last_dim(model->forward(idx[0]), group);  // (B, T, V)
    }
    for (int s = 0; s < steps; ++s) {
      optimizer.zero_grad();
      auto loss = model->loss(idx[s], targets[s]);
      loss.backward();
      if (s == 0) {
        mine.loss = loss.detach();
        mine.grads = model->gather(/*gradients=*/true);
      }
      mine.norms.push_back(model->clip_grad_norm(kMaxNorm));
      optimizer.step();
    }
    mine.params = model->gather();
  });

  torch::optim::AdamW optimizer(reference->parameters(), adamw);
  torch::Tensor logits, loss;
  std::map<std::string, torch::Tensor> grads;
  std::vector<double> norms;
  {
    torch::NoGradGuard no_grad;
    logits = reference->forward(idx[0]);
  }
  for (int s = 0; s < steps; ++s) {
    optimizer.zero_grad();
    auto l = reference->loss(idx[s], targets[s]);
    l.backward();
    if (s == 0) {
      loss = l.detach();
      for (const auto& p : reference->named_parameters()) grads[p.key()] = p.value().grad().clone();
    }
    norms.push_back(torch::nn::utils::clip_grad_norm_(reference->parameters(), kMaxNorm));
    optimizer.step();
  }
  const auto params = reference->named_parameters();
  // Tolerances: the row-parallel reductions add t partial sums of C/t or F/t products where the full model adds
  // one sum of C or F, so forward values and gradients differ by a few ε relative. Measured (t = 2 tied, untied;
  // t = 4): logits max |diff| 1.8e-7, 1.2e-7, 1.2e-7 (bound 1e-6); loss equal, equal, 1.1e-7 relative (bound 1e-6);
  // gradients 4.3e-7, 4.0e-7, 5.1e-7 of each tensor's largest element (bound 1e-5); clipped global norm 5.4e-7,
  // 6.4e-7, 7.9e-7 relative (bound 1e-5). AdamW's update m/√v is ≈ ±lr wherever |g| is near 0 (or near ε = 1e-8),
  // so a relative gradient difference of 4e-7 there can move one weight by a good fraction of lr per step: after 5
  // steps at lr = 1e-2 max |diff| 4.6e-6, 3.9e-5 (6.4e-5 without clipping, one element of h.0.mlp.gate), 8.6e-6;
  // bound lr/10 = 1e-3 per element (a wrong shard or gradient moves weights by ~lr every step). Over the whole model
  // the difference is measured against how far the 5 steps moved Θ, ‖Θ_tp − Θ‖ / ‖Θ − Θ_0‖: 2.4e-6, 1.8e-5, 3.5e-6
  // (bound 1e-3).
  for (int k = 0; k < t; ++k) {
    const auto& mine = ranks[k];
    const double dlogits = max_abs_diff(mine.logits, logits),
                 dloss = std::abs(mine.loss.item<double>() - loss.item<double>());
    EXPECT_LE(dlogits, 1e-6);
    EXPECT_NEAR(mine.loss.item<double>(), loss.item<double>(), 1e-6 * loss.item<double>());
    double worst_grad = 0, worst_param = 0, diff_sq = 0, moved_sq = 0;
    ASSERT_EQ(mine.grads.size(), grads.size());
    for (const auto& [name, g] : mine.grads) {
      const auto& expected = grads.at(name);
      const double scale = expected.abs().max().item<double>();
      worst_grad = std::max(worst_grad, max_abs_diff(g, expected) / scale);
      EXPECT_LE(max_abs_diff(g, expected), 1e-5 * scale) << name;
    }
    for (const auto& [name, p] : mine.params) {
      worst_param = std::max(worst_param, max_abs_diff(p, params[name]));
      EXPECT_LE(max_abs_diff(p, params[name]), 1e-3) << name;  // lr/10
      diff_sq += (p - params[name]).square().sum().item<double>();
      moved_sq += (params[name] - initial.at(name)).square().sum().item<double>();
    }
    ASSERT_EQ(mine.norms.size(), norms.size());
    double worst_norm = 0;  // relative
    for (int s = 0; s < steps; ++s) {
      EXPECT_GT(norms[s], kMaxNorm) << "step " << s << " did not clip";
      EXPECT_NEAR(mine.norms[s], norms[s], 1e-5 * norms[s]) << "step " << s;
      worst_norm = std::max(worst_norm, std::abs(mine.norms[s] - norms[s]) / norms[s]);
    }
    const double relative_drift = std::sqrt(diff_sq / moved_sq);  // ‖Θ_tp − Θ‖ / ‖Θ − Θ_0‖
    EXPECT_LE(relative_drift, 1e-3);
    std::printf(
        "TP = %d GPT (%s) vs full, rank %d: logits max |diff| %.2e, loss |diff| %.2e (loss %.4f), step-1 grads "
        "max |diff|/max|g| %.2e, ‖g‖ (%.3f at step 1) max relative diff %.1e, parameters after %d AdamW steps "
        "max |diff| %.2e, ‖diff‖/‖movement‖ %.2e\n",
        t, tied ? "tied" : "untied", k, dlogits, dloss, loss.item<double>(), worst_grad, norms[0], worst_norm, steps,
        worst_param, relative_drift);
  }
}

TEST(TensorParallelGPT, TrainsLikeTheFullModelOverFiveAdamWSteps) { expect_trains_like_the_full_model(true, 2); }
TEST(TensorParallelGPT, UntiedHeadTrainsLikeTheFullModelToo) { expect_trains_like_the_full_model(false, 2); }
// t = 4: one head per rank, F/t = 32, V/t = 16.
TEST(TensorParallelGPT, TrainsLikeTheFullModelAtTp4) { expect_trains_like_the_full_model(true, 4); }

}  // namespace
}  // namespace dloco
