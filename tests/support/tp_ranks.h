// Shared by the tensor-parallel tests (tests/parallel/tensor_parallel_test.cc, tp_gpt_test.cc): t ranks as threads
// over real Gloo (tests/support/gloo_ranks.h) handed a TensorParallelGroup, the gradient comparison both use, and
// the tiny GPT both shard. Deliberately not here: anything one test alone needs.
#pragma once

#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "model/gpt.h"
#include "parallel/tensor_parallel.h"
#include "support/gloo_ranks.h"

namespace dloco::testing_support {

// Runs body(group) on `world` ranks (tests/support/gloo_ranks.h), one intra-op thread each (the ranks share 2
// cores), the whole group being the tensor-parallel group. Fails the test with each rank's error, if any.
inline void on_tp_ranks(const std::string& name, int world, const std::function<void(TensorParallelGroup&)>& body) {
  const auto errors = on_ranks(fresh_store("tp"), world, [&](Collective& collective) {
    torch::set_num_threads(1);
    TensorParallelGroup group(collective);
    body(group);
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[r], "") << name << ": rank " << r;
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

// Gradients are sums over tokens, and an element near 0 may come out of cancellation: compared against the
// tensor's largest magnitude, max |a − b| ≤ 1e-5 · max |b| (the elementwise rtol of allclose fails on a −2e-4
// bias gradient whose 8 summands are ~1 and were added in another order).
inline ::testing::AssertionResult near(const torch::Tensor& a, const torch::Tensor& b, double rtol = 1e-5) {
  const double diff = max_abs_diff(a, b), scale = b.abs().max().item<double>();
  if (diff <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << diff << " > " << rtol << " · max |b| = " << rtol * scale;
}

// The tiny GPT the tensor-parallel tests shard: divisible by t = 2 and 4 in heads, SwiGLU width and vocabulary.
inline ModelConfig tiny_config(bool tied) {
  ModelConfig m;
  m.vocab_size = 64;  // V
  m.seq_len = 16;     // T
  m.n_layer = 2;      // L
  m.n_head = 4;       // NH
  m.d_model = 32;     // C (F = 128)
  m.tie_embeddings = tied;
  return m;
}

}  // namespace dloco::testing_support
