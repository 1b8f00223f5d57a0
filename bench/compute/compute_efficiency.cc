// Compute efficiency of the training step: model FLOP/s of InnerTrainer::step against a large fp32 GEMM on
// the same threads, measured in one run with alternating repeats (medians).
// Model FLOPs per token = gpt_flops_per_token(): 6·N_matmul (forward + backward of every weight matmul,
// output head included, embedding lookup excluded) + 12·L·T·C (attention scores and values, fwd + bwd).
// Usage: bench_compute_efficiency [--preset small|base-124m|tiny] [--batch B] [--repeats R] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  std::string preset = "small";
  int64_t batch = 16;
  int repeats = 5, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--preset") preset = argv[i + 1];
    else if (flag == "--batch") batch = std::stoll(argv[i + 1]);
    else if (flag == "--repeats") repeats = std::stoi(argv[i + 1]);
    else if (flag == "--threads") threads = std::stoi(argv[i + 1]);
  }
  const ThreadBudget budget = thread_budget(threads);
  apply_thread_budget(budget);
  ModelConfig m = model_preset(preset);
  if (preset == "base-124m") m.vocab_size = 4096;  // the KJV tokenizer's vocabulary
  // Random tokens: the step's cost does not depend on the data.
  const auto dir = std::filesystem::temp_directory_path() / ("dloco_bench_compute_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<int32_t> tokens(static_cast<size_t>((batch * m.seq_len + 1) * (repeats + 2) + 1));
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

  std::vector<double> model_flops, peak_flops;
  const double per_token = gpt_flops_per_token(m);
  for (int r = 0; r < repeats; ++r) {  // alternate: step, GEMM, step, GEMM…
    const auto t0 = Clock::now();
    const StepResult s = trainer.step(stream, r + 1);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    model_flops.push_back(per_token * static_cast<double>(s.tokens) / secs);
    peak_flops.push_back(gemm_flops(2048));
  }
  std::filesystem::remove_all(dir);
  const double mf = median(model_flops), pf = median(peak_flops);
  std::printf("preset %s (%lld parameters), B=%lld T=%lld, threads torch %d + BLAS %d, %s\n", preset.c_str(),
              static_cast<long long>(gpt_parameter_count(m)), static_cast<long long>(batch),
              static_cast<long long>(m.seq_len), budget.torch_threads, budget.blas_threads, blas_description().c_str());
  std::printf("model FLOP/s (6N + 12LTC per token): %.2f GFLOP/s; fp32 GEMM 2048^3: %.2f GFLOP/s; ratio %.3f "
              "(target >= 0.6; medians of %d alternating repeats)\n",
              mf / 1e9, pf / 1e9, mf / pf, repeats);
  return 0;
}
