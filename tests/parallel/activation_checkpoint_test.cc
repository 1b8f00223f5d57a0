// Activation checkpointing (parallel/activation_checkpoint.h) on torchtitan's toy block
// (x 512 × 512 → gate 512→512 → wq 512→512 → out 512→1024 → sum, no biases) and on a tiny GPT; plus the
// hand-written non-finite check and unscale of fp16 loss scaling (parallel/grad_unscale.h), alone and agreed
// over a group of two ranks (threads over real Gloo) so that every rank takes the same skip decision; and
// checkpointing with ranks as threads: a block that draws nothing leaves the global generator to the other
// threads, and blocks with generators of their own replay their own draws.
// How things are counted, not assumed:
//   matmul work: a global at::RecordFunction callback sees every aten::mm / addmm / bmm with its input shapes and
//     adds 2·M·K·N; reported in units of 2·512³ (forward 4 = 1 + 1 + 2; backward 8 plain, 12 checkpointed).
//   saved activations: a counting c10 CPU allocator (installed with SetCPUAllocator) tracks live tensor bytes;
//     bytes still alive after forward, minus the scalar loss, are what autograd keeps (x and the weights were
//     alive before). Plain: h1 + h2 = 2 · 512·512·4 B = 2 MiB. Checkpointed: nothing, as the function keeps x,
//     which already existed, and the block draws no random numbers, so no RNG state (5056 B in 1.13) is kept.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective/process_group.h"
#include "core/check.h"
#include "model/gpt.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/grad_unscale.h"
#include "parallel/loss_scaler.h"
#include "support/gloo_ranks.h"

namespace dloco {
namespace {

// Counts live bytes of CPU tensors allocated while installed.
class CountingAllocator : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    auto* ctx = new Allocation{base_->allocate(n), n, this};
    live_ += static_cast<int64_t>(n);
    void* data = ctx->inner.get();
    return {data, ctx, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  int64_t live() const { return live_.load(); }
  void install() {
    base_ = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, /*priority=*/1);
  }
  void uninstall() { c10::SetCPUAllocator(base_, /*priority=*/1); }

 private:
  struct Allocation {
    c10::DataPtr inner;
    size_t n;
    const CountingAllocator* owner;
  };
  static void release(void* p) {
    auto* a = static_cast<Allocation*>(p);
    a->owner->live_ -= static_cast<int64_t>(a->n);
    delete a;
  }
  c10::Allocator* base_ = nullptr;
  mutable std::atomic<int64_t> live_{0};
};
CountingAllocator g_counting;  // outlives every tensor it allocated

// Sums 2·M·K·N over the matmuls ATen runs while alive.
class MatmulCounter {
 public:
  MatmulCounter() {
    handle_ = at::addGlobalCallback(at::RecordFunctionCallback(&MatmulCounter::on_start).needsInputs(true));
  }
  ~MatmulCounter() { at::removeCallback(handle_); }
  static double units() { return flops_.load() / (2.0 * 512 * 512 * 512); }
  static void reset() { flops_ = 0; }

 private:
  static std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    const std::string name = fn.name();
    if (name != "aten::mm" && name != "aten::addmm" && name != "aten::bmm") return nullptr;
    const auto inputs = fn.inputs();
    const size_t a = name == "aten::addmm" ? 1 : 0;  // addmm(bias, m1, m2)
    const auto s1 = inputs[a].toTensor().sizes(), s2 = inputs[a + 1].toTensor().sizes();
    const double batch = name == "aten::bmm" ? static_cast<double>(s1[0]) : 1.0;
    const double M = s1[s1.size() - 2], K = s1[s1.size() - 1], N = s2[s2.size() - 1];
    flops_ = flops_.load() + static_cast<int64_t>(2 * batch * M * K * N);
    return nullptr;
  }
  at::CallbackHandle handle_;
  static inline std::atomic<int64_t> flops_{0};
};

struct ToyBlockImpl : torch::nn::Module {
  ToyBlockImpl() {
    gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(512, 512).bias(false)));
    wq = register_module("wq", torch::nn::Linear(torch::nn::LinearOptions(512, 512).bias(false)));
    out = register_module("out", torch::nn::Linear(torch::nn::LinearOptions(512, 1024).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(wq(gate(x))); }  // (512, 512) -> (512, 1024)
  torch::nn::Linear gate{nullptr}, wq{nullptr}, out{nullptr};
};
TORCH_MODULE(ToyBlock);

struct ToyRun {
  torch::Tensor loss, grad_x;
  std::vector<torch::Tensor> grads;
  double forward_units, backward_units;
  int64_t saved_bytes;
};

ToyRun run_toy(ToyBlock& block, const torch::Tensor& x0, bool checkpointed) {
  block->zero_grad();
  auto x = x0.clone().requires_grad_(true);  // (512, 512)
  ToyRun r;
  MatmulCounter counter;
  MatmulCounter::reset();
  g_counting.install();
  const int64_t before = g_counting.live();
  if (checkpointed) {
    r.loss = checkpoint([&](const torch::Tensor& in) { return block->forward(in); }, x, block->parameters()).sum();
  } else {
    r.loss = block->forward(x).sum();
  }
  r.saved_bytes = g_counting.live() - before - static_cast<int64_t>(r.loss.nbytes());
  g_counting.uninstall();
  r.forward_units = MatmulCounter::units();
  MatmulCounter::reset();
  r.loss.backward();
  r.backward_units = MatmulCounter::units();
  r.grad_x = x.grad();
  for (const auto& p : block->parameters()) r.grads.push_back(p.grad().clone());
  return r;
}

TEST(ActivationCheckpoint, ToyBlockMatmulsAndSavedBytes) {
  torch::manual_seed(0);
  ToyBlock block;
  const auto x = torch::randn({512, 512});
  const auto plain = run_toy(block, x, false);
  const auto ckpt = run_toy(block, x, true);
  EXPECT_TRUE(torch::equal(plain.loss, ckpt.loss));
  EXPECT_TRUE(torch::equal(plain.grad_x, ckpt.grad_x));
  ASSERT_EQ(plain.grads.size(), 3u);
  for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_TRUE(torch::equal(plain.grads[i], ckpt.grads[i])) << i;
  EXPECT_DOUBLE_EQ(plain.forward_units, 4.0);
  EXPECT_DOUBLE_EQ(ckpt.forward_units, 4.0);
  EXPECT_DOUBLE_EQ(plain.backward_units, 8.0);
  EXPECT_DOUBLE_EQ(ckpt.backward_units, 12.0);  // 4 recomputed + 8
  EXPECT_EQ(plain.saved_bytes, 2 * 512 * 512 * 4);  // h1 and h2
  EXPECT_EQ(ckpt.saved_bytes, 0);  // x existed before; a block that draws nothing keeps no RNG state
  std::printf("toy block: matmul units fwd %.0f / %.0f, bwd %.0f -> %.0f; saved bytes %lld -> %lld\n",
              plain.forward_units, ckpt.forward_units, plain.backward_units, ckpt.backward_units,
              static_cast<long long>(plain.saved_bytes), static_cast<long long>(ckpt.saved_bytes));
}

TEST(ActivationCheckpoint, RecomputeReplaysTheRngState) {
  // A dropout inside the block: the recomputation must draw the forward's mask, or the gradient is wrong.
  torch::manual_seed(1);
  auto w = torch::randn({16, 16}, torch::requires_grad());
  auto block = [&](const torch::Tensor& in) { return torch::dropout(torch::matmul(in, w), 0.5, true); };
  const auto x = torch::randn({8, 16});
  torch::manual_seed(7);
  auto plain = block(x).square().sum();
  plain.backward();
  const auto plain_grad = w.grad().clone();
  w.mutable_grad().zero_();
  torch::manual_seed(7);
  auto ckpt = checkpoint(block, x, {w}).square().sum();
  (void)torch::randn({100});  // the RNG moves on between forward and backward
  const auto after_forward = at::detail::getDefaultCPUGenerator().get_state();
  ckpt.backward();
  EXPECT_TRUE(torch::equal(plain, ckpt));
  EXPECT_TRUE(torch::equal(plain_grad, w.grad()));
  EXPECT_TRUE(torch::equal(after_forward, at::detail::getDefaultCPUGenerator().get_state()))
      << "backward must leave the RNG where it found it";
}

// Ranks as threads: thread A checkpoints a block that draws nothing, and thread B draws from the global generator
// between A's forward and backward, during A's recompute (the block's second call hands over to B and waits for
// it) and after. B must get exactly the numbers a lone thread gets from the same seed, and A the plain gradient:
// a block that drew nothing has no state to replay, so the global generator is never swapped under B (it used to
// be swapped to A's forward state around the recompute, so B drew the same numbers twice).
TEST(ActivationCheckpoint, ADeterministicBlockLeavesTheGlobalGeneratorToOtherThreads) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> expected;  // what B draws when nobody touches the generator
  for (int i = 0; i < 3; ++i) expected.push_back(torch::rand({4}));
  const auto x = torch::linspace(-1, 1, 8 * 16).view({8, 16});  // (N, C), drawn from nothing
  auto w = torch::full({16, 16}, 0.25).requires_grad_(true);     // (C, C)
  std::mutex mu;
  std::condition_variable cv;
  int turns = 0, drawn_count = 0;
  std::vector<torch::Tensor> drawn;
  std::thread b([&] {
    for (int k = 1; k <= 3; ++k) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return turns >= k; })) return;
      }
      auto r = torch::rand({4});
      std::lock_guard<std::mutex> lock(mu);
      drawn.push_back(r);
      ++drawn_count;
      cv.notify_all();
    }
  });
  auto let_b_draw = [&] {
    std::unique_lock<std::mutex> lock(mu);
    ++turns;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return drawn_count == turns; });
  };
  torch::manual_seed(5);
  int calls = 0;
  auto block = [&](const torch::Tensor& in) {
    if (++calls == 2) let_b_draw();  // inside A's recompute
    return torch::matmul(in, w).relu();
  };
  auto y = checkpoint(block, x, {w});
  let_b_draw();  // between A's forward and backward
  y.sum().backward();
  let_b_draw();  // after
  b.join();
  EXPECT_EQ(calls, 2);
  ASSERT_EQ(drawn.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(drawn[i], expected[i])) << "B's draw " << i;
  auto w_plain = torch::full({16, 16}, 0.25).requires_grad_(true);
  torch::matmul(x, w_plain).relu().sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), w_plain.grad()));
}

// The race-free way: each thread gives the checkpoint its own generator. Two threads (and a third drawing from
// the global generator all the while) each run 50 checkpointed dropout steps; every loss and gradient equals the
// plain block's with the same seed bitwise, and each thread's generator ends where the plain run's does.
TEST(ActivationCheckpoint, TwoThreadsWithTheirOwnGeneratorsMatchThePlainBlockBitwise) {
  constexpr int kSteps = 50;
  torch::manual_seed(11);
  const auto w0 = torch::randn({16, 16});  // (C, C)
  const auto x = torch::randn({8, 16});    // (N, C)
  struct Run {
    std::vector<torch::Tensor> losses, grads;
    torch::Tensor final_state;
  };
  auto run = [&](uint64_t seed, bool checkpointed) {
    Run r;
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto w = w0.clone().requires_grad_(true);
    auto block = [w](const torch::Tensor& in, at::Generator& g) {  // dropout p = 0.5 drawn from g
      auto h = torch::matmul(in, w);                                // (N, C)
      return h * torch::bernoulli(torch::full_like(h, 0.5), g) * 2.0;
    };
    for (int i = 0; i < kSteps; ++i) {
      auto loss = (checkpointed ? checkpoint(block, x, {w}, gen) : block(x, gen)).square().sum();
      loss.backward();
      r.losses.push_back(loss.detach());
      r.grads.push_back(w.grad().clone());
      w.mutable_grad().zero_();
    }
    r.final_state = gen.get_state();
    return r;
  };
  const Run plain[2] = {run(21, false), run(22, false)};
  Run ckpt[2];
  std::atomic<bool> done{false};
  std::thread noise([&] {
    while (!done) (void)torch::randn({64});
  });
  std::thread a([&] { ckpt[0] = run(21, true); }), b([&] { ckpt[1] = run(22, true); });
  a.join();
  b.join();
  done = true;
  noise.join();
  for (int t = 0; t < 2; ++t) {
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_TRUE(torch::equal(plain[t].losses[i], ckpt[t].losses[i])) << "thread " << t << " step " << i;
      EXPECT_TRUE(torch::equal(plain[t].grads[i], ckpt[t].grads[i])) << "thread " << t << " step " << i;
    }
    EXPECT_TRUE(torch::equal(plain[t].final_state, ckpt[t].final_state)) << "thread " << t;
  }
  EXPECT_FALSE(torch::equal(plain[0].grads[0], plain[1].grads[0])) << "the two seeds draw different masks";
}

TEST(ActivationCheckpoint, TinyGptLossAndGradsUnchanged) {
  ModelConfig cfg = model_preset("tiny");
  cfg.n_layer = 2;
  torch::manual_seed(3);
  GPT model(cfg);
  const auto idx = torch::randint(0, cfg.vocab_size, {2, 16}, torch::kLong);
  const auto targets = torch::randint(0, cfg.vocab_size, {2, 16}, torch::kLong);
  auto plain = model->loss(idx, targets);
  plain.backward();
  std::vector<torch::Tensor> plain_grads;
  for (const auto& p : model->parameters()) plain_grads.push_back(p.grad().clone());
  model->zero_grad();
  // The same forward as GPTImpl::forward, each block through checkpoint().
  auto buffers = model->named_buffers();
  const auto cos = buffers["rope_cos"].narrow(0, 0, 16), sin = buffers["rope_sin"].narrow(0, 0, 16);
  const auto causal = buffers["causal"].narrow(0, 0, 16).narrow(1, 0, 16);
  auto x = model->wte(idx);  // (B, T, C)
  for (auto& m : *model->h) {
    auto block = m->as<Block>();
    x = checkpoint([=](const torch::Tensor& in) { return block->forward(in, cos, sin, causal); }, x,
                   block->parameters());
  }
  auto logits = torch::matmul(model->ln_f(x), model->wte->weight.t());  // (B, T, V) tied head
  auto ckpt = cross_entropy(logits.view({-1, cfg.vocab_size}), targets.reshape({-1}));
  ckpt.backward();
  EXPECT_TRUE(torch::equal(plain, ckpt)) << plain.item<double>() << " vs " << ckpt.item<double>();
  const auto params = model->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain_grads[i], params[i].value().grad())) << params[i].key();
  }
}

TEST(GradUnscale, FindsNonFiniteAndUnscales) {
  std::vector<torch::Tensor> grads = {torch::full({3}, 8.0), torch::Tensor(), torch::full({2, 2}, -4.0)};
  EXPECT_FALSE(non_finite_check_and_unscale(grads, 1.0 / 8));
  EXPECT_TRUE(torch::equal(grads[0], torch::ones({3})));
  EXPECT_TRUE(torch::equal(grads[2], torch::full({2, 2}, -0.5)));
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<torch::Tensor> g = {torch::ones({4}), torch::tensor({1.0f, bad})};
    EXPECT_TRUE(non_finite_check_and_unscale(g, 0.5)) << bad;
    EXPECT_TRUE(torch::equal(g[0], torch::full({4}, 0.5)));
  }
  std::vector<torch::Tensor> half = {torch::full({2}, 65504.0, torch::kHalf)};  // fp16's largest finite value
  EXPECT_FALSE(non_finite_check_and_unscale(half, 1.0));
  EXPECT_THROW(non_finite_check_and_unscale(grads, 0.0), InputError);
  EXPECT_THROW(non_finite_check_and_unscale(grads, INFINITY), InputError);
}

// Two ranks as threads over real Gloo; only rank 1's gradient holds an inf. With the group's flag both ranks find
// it and their loss scalers skip the step and back off alike; rank 0's own check would have stepped.
TEST(GradUnscale, WithTheGroupEveryRankSkipsWhenOneRankHasAnInf) {
  // Rank r's gradients: a (3) and a (4) tensor, an inf in rank 1's second.
  auto gradients_of = [](int r) {
    auto second = torch::full({4}, 2.0f);
    if (r == 1) second[2] = INFINITY;
    return std::vector<torch::Tensor>{torch::ones({3}), second};
  };
  std::vector<int> own(2, -1), agreed(2, -1), clean(2, -1);
  std::vector<LossScaleDecision> decisions(2);
  const auto errors = testing_support::on_ranks(2, [&](Collective& group) {
    const int r = group.rank();
    auto local = gradients_of(r);
    own[r] = non_finite_check_and_unscale(local, 0.5);
    auto grads = gradients_of(r);
    agreed[r] = non_finite_check_and_unscale(grads, 0.5, group);
    EXPECT_TRUE(torch::equal(grads[0], torch::full({3}, 0.5))) << "rank " << r << " unscales as well";
    LossScaler scaler;
    decisions[r] = scaler.update(agreed[r]);
    std::vector<torch::Tensor> finite = {torch::ones({2})};
    clean[r] = non_finite_check_and_unscale(finite, 0.5, group);
  });
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  EXPECT_EQ(own[0], 0) << "rank 0's own gradients are finite: alone it would step";
  EXPECT_EQ(own[1], 1);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agreed[r], 1) << "rank " << r << " must see rank 1's inf";
    EXPECT_FALSE(decisions[r].step) << "rank " << r << " must skip the step";
    EXPECT_EQ(decisions[r].scale, 32768.0) << "rank " << r << ": S backed off from 65536 on both";
    EXPECT_EQ(clean[r], 0) << "no rank has a non-finite value: rank " << r << " steps";
  }
}

}  // namespace
}  // namespace dloco
