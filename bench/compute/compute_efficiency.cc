// Compute efficiency of the training step: model FLOP/s of InnerTrainer::step against a large fp32 GEMM on
// the same threads, measured in one run with alternating repeats (medians).
// Model FLOPs per token = gpt_flops_per_token(): 6·N_matmul (forward + backward of every weight matmul,
// output head included, embedding lookup excluded) + 12·L·T·C (attention scores and values, fwd + bwd).
// Usage: bench_compute_efficiency [--preset small|base-124m|tiny] [--batch B] [--repeats R] [--threads N] [--profile TRACE.json]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/csrc/autograd/profiler_legacy.h>

#include "data/shards.h"
#include "data/stream.h"
#include "train/threads.h"
#include "train/trainer.h"

using namespace dloco;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double gemm_flops(int n) {
  auto a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::mm(a, b);  // warm-up
  const auto t0 = Clock::now();
  auto c = torch::mm(a, b);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return 2.0 * n * n * n / s;
}

// The GEMMs of one training step alone (forward y = x·Wᵀ, backward dx = dy·W and dW = dyᵀ·x for every weight
// matmul, output head included, plus the attention bmm's), timed back to back: their FLOP/s is the ceiling the
// step could reach if everything else (norms, RoPE, softmax, cross-entropy, AdamW) cost nothing.
double step_gemm_flops(const ModelConfig& m, int64_t batch) {
  const int64_t N = batch * m.seq_len, C = m.d_model, Fw = m.ff_dim(), V = m.vocab_size;
  const int64_t NH = m.n_head, hs = C / NH, T = m.seq_len;
  std::vector<std::pair<int64_t, int64_t>> weights;  // (in, out)
  for (int64_t l = 0; l < m.n_layer; ++l) {
    weights.insert(weights.end(), {{C, 3 * C}, {C, C}, {C, Fw}, {C, Fw}, {Fw, C}});
  }
  weights.push_back({C, V});
  struct Gemm { torch::Tensor x, w, dy; };  // operands made before the clock starts
  std::vector<Gemm> gemms;
  for (const auto& [in, out] : weights) gemms.push_back({torch::randn({N, in}), torch::randn({out, in}), torch::randn({N, out})});
  std::vector<torch::Tensor> qs, ks;
  for (int64_t l = 0; l < m.n_layer; ++l) {
    qs.push_back(torch::randn({batch * NH, T, hs}));
    ks.push_back(torch::randn({batch * NH, T, hs}));
  }
  double flops = 0;
  const auto t0 = Clock::now();
  for (const auto& g : gemms) {
    auto y = torch::mm(g.x, g.w.t());
    auto dx = torch::mm(g.dy, g.w);
    auto dw = torch::mm(g.dy.t(), g.x);
    flops += 3 * 2.0 * g.x.size(0) * g.x.size(1) * g.w.size(0);
  }
  for (size_t l = 0; l < qs.size(); ++l) {
    auto att = torch::bmm(qs[l], ks[l].transpose(1, 2));  // scores, then three more bmm's of the same size
    auto y = torch::bmm(att, ks[l]);
    auto da = torch::bmm(y, ks[l].transpose(1, 2));
    auto dv = torch::bmm(att.transpose(1, 2), y);
    flops += 4 * 2.0 * batch * NH * T * T * hs;
  }
  return flops / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "small", profile;
  int64_t batch = 16;
  int repeats = 5, threads = 0;
  CLI::App app{"Model FLOP/s of one training step against an fp32 GEMM of the same machine",
               "bench_compute_efficiency"};
  app.add_option("--preset", preset, "model preset (core/config.h)")->capture_default_str();
  app.add_option("--batch", batch, "sequences per step")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed steps (median)")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "LibTorch + BLAS threads (0: all cores)")->capture_default_str();
  app.add_option("--profile", profile, "write one more step's autograd profile here (Chrome trace JSON)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  const ThreadBudget budget = thread_budget(threads);
  apply_thread_budget(budget);
  ModelConfig m = model_preset(preset);
  if (preset == "base-124m") m.vocab_size = 4096;  // the KJV tokenizer's vocabulary
  // Random tokens: the step's cost does not depend on the data.
  const auto dir = std::filesystem::temp_directory_path() / ("dloco_bench_compute_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens(static_cast<size_t>((batch * m.seq_len + 1) * (repeats + 3) + 1));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 2654435761u) % m.vocab_size);
  write_shard(dir / "train_000.bin", tokens, static_cast<uint32_t>(m.vocab_size));
  auto split = std::make_shared<TokenSplit>(std::vector<std::filesystem::path>{dir / "train_000.bin"});
  DataStream stream(split, 0, 1, batch, m.seq_len, StreamCursor{});

  torch::manual_seed(0);
  GPT model(m);
  TrainConfig t;
  t.batch_size = batch;
  InnerTrainer trainer(model, t, LrSchedule{}, torch::kCPU);
  trainer.step(stream, 0);  // warm-up

  if (!profile.empty()) {  // one more step under the autograd profiler, written as a Chrome trace
    torch::autograd::profiler::RecordProfile guard(profile);
    trainer.step(stream, 0);
  }
  std::vector<double> model_flops, peak_flops, ceiling_flops;
  const double per_token = gpt_flops_per_token(m);
  for (int r = 0; r < repeats; ++r) {  // alternate: step, GEMM, step, GEMM…
    const auto t0 = Clock::now();
    const StepResult s = trainer.step(stream, r + 1);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    model_flops.push_back(per_token * static_cast<double>(s.tokens) / secs);
    peak_flops.push_back(gemm_flops(2048));
    ceiling_flops.push_back(step_gemm_flops(m, batch));
  }
  std::filesystem::remove_all(dir);
  const double mf = median(model_flops), pf = median(peak_flops), cf = median(ceiling_flops);
  std::printf("preset %s (%lld parameters), B=%lld T=%lld, threads torch %d + BLAS %d, %s, %s\n", preset.c_str(),
              static_cast<long long>(gpt_parameter_count(m)), static_cast<long long>(batch),
              static_cast<long long>(m.seq_len), budget.torch_threads, budget.blas_threads, blas_description().c_str(),
              allocator_description().c_str());
  std::printf("model FLOP/s (6N + 12LTC per token): %.2f GFLOP/s; fp32 GEMM 2048^3: %.2f GFLOP/s; ratio %.3f "
              "(target >= 0.6; medians of %d alternating repeats)\n",
              mf / 1e9, pf / 1e9, mf / pf, repeats);
  std::printf("the step's own GEMM shapes alone: %.2f GFLOP/s = %.3f of the 2048^3 GEMM (the ceiling for the ratio "
              "above); the step reaches %.3f of that ceiling\n",
              cf / 1e9, cf / pf, mf / cf);
  return 0;
}
