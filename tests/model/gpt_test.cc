// GPT: parameter count equals the closed form, shapes, causality (the future never leaks into the past),
// rotary positions make attention position-aware, the initial loss is ≈ ln V, and a tiny model can fit a batch.
#include "model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"

namespace dloco {
namespace {

TEST(GPT, ParameterCountMatchesFormula) {
  for (const char* preset : {"tiny", "small"}) {
    for (bool tied : {true, false}) {
      ModelConfig m = model_preset(preset);
      m.tie_embeddings = tied;
      GPT model(m);
      EXPECT_EQ(count_parameters(*model), gpt_parameter_count(m)) << preset << " tied=" << tied;
      EXPECT_EQ(model->named_parameters().contains("lm_head.weight"), !tied);
    }
  }
}

TEST(GPT, ForwardShapeAndCausality) {
  torch::manual_seed(0);
  GPT model(model_preset("tiny"));
  model->eval();
  auto idx = torch::randint(0, 512, {2, 16}, torch::kLong);
  auto logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 16, 512}));
  auto changed = idx.clone();
  changed.index_put_({torch::indexing::Slice(), torch::indexing::Slice(10, 16)}, 7);  // change the future only
  auto logits2 = model->forward(changed);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(logits.index({Slice(), Slice(0, 10)}), logits2.index({Slice(), Slice(0, 10)}), 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(logits.index({Slice(), Slice(10, 16)}), logits2.index({Slice(), Slice(10, 16)})));
}

TEST(GPT, RotaryPositionsMakeOrderMatter) {
  torch::manual_seed(1);
  GPT model(model_preset("tiny"));
  // Without positions, causal attention sees the earlier tokens as a set: swapping the first two would leave
  // the last position's logits unchanged.
  auto ab = model->forward(torch::tensor({{3, 9, 4}}, torch::kLong))[0][2];
  auto ba = model->forward(torch::tensor({{9, 3, 4}}, torch::kLong))[0][2];
  EXPECT_GT((ab - ba).abs().max().item<double>(), 1e-6);
}

TEST(GPT, InitialLossIsNearLogVocabulary) {
  torch::manual_seed(2);
  GPT model(model_preset("tiny"));
  auto idx = torch::randint(0, 512, {4, 32}, torch::kLong);
  const double loss = model->loss(idx, torch::randint(0, 512, {4, 32}, torch::kLong)).item<double>();
  EXPECT_NEAR(loss, std::log(512.0), 0.1);
}

TEST(GPT, TinyModelFitsOneBatch) {
  torch::manual_seed(3);
  GPT model(model_preset("tiny"));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  auto idx = torch::randint(0, 512, {2, 32}, torch::kLong);
  auto targets = torch::roll(idx, -1, 1);
  double first = 0, last = 0;
  for (int i = 0; i < 60; ++i) {
    opt.zero_grad();
    auto loss = model->loss(idx, targets);
    loss.backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first);
}

TEST(GPT, GenerateExtendsThePromptWithinTheVocabulary) {
  torch::manual_seed(4);
  GPT model(model_preset("tiny"));
  auto gen = at::detail::createCPUGenerator(9);
  auto out = model->generate(torch::tensor({{1, 2, 3}}, torch::kLong), 40, 1.0, 10, &gen);  // longer than T = 32
  EXPECT_EQ(out.size(1), 43);
  EXPECT_GE(out.min().item<int64_t>(), 0);
  EXPECT_LT(out.max().item<int64_t>(), 512);
}

TEST(GPT, InconsistentShapeIsRefused) {
  ModelConfig m = model_preset("tiny");
  m.n_head = 3;  // 32 is not a multiple of 3
  EXPECT_THROW(GPT{m}, InputError);
}

TEST(GPT, CrossEntropyMatchesLibTorchInValueAndGradient) {
  torch::manual_seed(3);
  auto logits = (torch::randn({37, 53}) * 4).requires_grad_(true);
  auto reference_logits = logits.detach().clone().requires_grad_(true);
  auto targets = torch::randint(53, {37}, torch::kLong);
  auto loss = cross_entropy(logits, targets);
  auto reference = torch::nn::functional::cross_entropy(reference_logits, targets);
  (loss * 3.0).backward();
  (reference * 3.0).backward();
  EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-6);
  EXPECT_TRUE(torch::allclose(logits.grad(), reference_logits.grad(), 1e-5, 1e-7));
  EXPECT_GT(logits.grad().abs().max().item<double>(), 1e-3);  // the gradient is not trivially zero
}

}  // namespace
}  // namespace dloco
