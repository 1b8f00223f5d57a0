// Compute overhead of activation checkpointing (parallel/activation_checkpoint.h), one process, measured two ways
// in one run with alternating repeats (medians):
//   model   the whole GPT as one PipelineStage (stages = 1: embedding, every block, ln_f, head and loss), forward +
//           backward with checkpoint_activations off and on; only the blocks are recomputed, so the expected ratio
//           is 1 + (the blocks' forward FLOPs) / (the model's forward + backward FLOPs), printed beside it;
//   blocks  the GPT's L blocks alone on a random residual stream x (B, T, C): y = blocks(x), backward of ⟨y, g⟩,
//           plain against each block through checkpoint(); expected 4/3 (forward + backward ≈ 3 forwards, plus one
//           recomputed forward).
// Timed by the wall clock and by the process's CPU time (one thread for LibTorch, one for OpenBLAS, which runs in
// the calling thread): on a loaded machine the CPU time is the steadier of the two.
// Deliberately not measured: memory (activation_checkpoint_test counts the bytes kept), the pipeline's send/recv,
// the optimizer step.
// Usage: bench_parallel_checkpoint [--preset small] [--batch 8] [--threads 1] [--iters 3] [--repeats 7]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "model/gpt.h"
#include "parallel/activation_checkpoint.h"
#include "parallel/pipeline_stage.h"
#include "rank_processes.h"

using namespace dloco;
using namespace dloco::bench;
using Clock = std::chrono::steady_clock;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Seconds per call of fn over `iters` calls: wall clock, and this process's CPU time (all its threads), which
// leaves out the time the machine's other work kept it off the cores.
std::pair<double, double> time_it(const std::function<void()>& fn, int iters) {
  const double c0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) fn();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  return {wall / iters, (cpu_seconds() - c0) / iters};
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured, also into a file
  const Flags f = parse_flags("bench_parallel_checkpoint", "Compute overhead of activation checkpointing, one process",
                              {{"preset", "small", "model preset (core/config.h)"},
                               {"batch", "8", "sequences per step"},
                               {"threads", "1", "BLAS threads"},
                               {"iters", "3", "steps per timing"},
                               {"repeats", "7", "alternating repeats (medians)"}},
                              argc, argv);
  const int threads = static_cast<int>(flag_int(f, "threads", 1)), iters = static_cast<int>(flag_int(f, "iters", 3)),
            repeats = static_cast<int>(flag_int(f, "repeats", 7));
  const ThreadBudget budget = thread_budget(threads);
  apply_thread_budget(budget);
  const ModelConfig m = model_preset(flag(f, "preset", "small"));
  const int64_t B = flag_int(f, "batch", 8), T = m.seq_len, C = m.d_model;
  torch::manual_seed(0);
  GPT full(m);
  PipelineStageOptions plain_options, ckpt_options;
  ckpt_options.checkpoint_activations = true;
  PipelineStage plain(full, plain_options), ckpt(full, ckpt_options);
  const auto tokens = torch::randint(m.vocab_size, {B, T + 1}, torch::kLong);  // (B, T + 1)
  const auto idx = tokens.narrow(1, 0, T), targets = tokens.narrow(1, 1, T);   // (B, T)
  auto model_step = [&](PipelineStage& stage) {
    return [&stage, &idx, &targets] {
      stage.zero_grad();
      stage.forward_chunk(0, idx, targets).backward();
    };
  };

  // The blocks alone, with the GPT's own rotary tables and causal mask.
  auto buffers = full->named_buffers();
  const auto cos = buffers["rope_cos"], sin = buffers["rope_sin"], causal = buffers["causal"];
  std::vector<BlockImpl*> blocks;
  std::vector<torch::Tensor> block_params;
  for (size_t i = 0; i < full->h->size(); ++i) {
    blocks.push_back(full->h->ptr<BlockImpl>(i).get());
    for (auto& p : blocks.back()->parameters()) block_params.push_back(p);
  }
  const auto x = torch::randn({B, T, C}).requires_grad_(true);  // (B, T, C)
  const auto g = torch::randn({B, T, C});                       // (B, T, C) incoming gradient
  auto blocks_step = [&](bool checkpointed) {
    return [&, checkpointed] {
      for (auto& p : block_params) {
        if (p.grad().defined()) p.mutable_grad().zero_();
      }
      auto y = x;
      for (BlockImpl* b : blocks) {
        if (checkpointed) {
          auto fn = [b, cos, sin, causal](const torch::Tensor& in) { return b->forward(in, cos, sin, causal); };
          y = checkpoint(fn, y, b->parameters());
        } else {
          y = b->forward(y, cos, sin, causal);
        }
      }
      y.backward(g);
    };
  };

  // Check once that both ways give the same gradients (the comparison is of the same work).
  {
    model_step(plain)();
    model_step(ckpt)();
    double worst = 0;
    auto pp = plain.named_parameters(), cp = ckpt.named_parameters();
    for (auto& [name, t] : pp) worst = std::max(worst, (t.grad() - cp[name].grad()).abs().max().item<double>());
    std::printf("gradients with and without checkpointing: largest difference %.3g\n", worst);
  }
  const auto fns =
      std::vector<std::function<void()>>{model_step(plain), model_step(ckpt), blocks_step(false), blocks_step(true)};
  for (const auto& fn : fns) fn();  // warm-up
  std::vector<std::vector<double>> secs(4), cpu(4);
  for (int r = 0; r < repeats; ++r) {
    for (int i = 0; i < 4; ++i) {
      const int k = (r % 2 == 0) ? i : 3 - i;  // alternate the order
      const auto [wall, c] = time_it(fns[k], iters);
      secs[k].push_back(wall);
      cpu[k].push_back(c);
    }
  }
  const double mp = median(secs[0]), mc = median(secs[1]), bp = median(secs[2]), bc = median(secs[3]);
  auto lo = [&](int k) { return *std::min_element(secs[k].begin(), secs[k].end()); };  // the least disturbed repeat
  auto c = [&](int k) { return median(cpu[k]); };
  const double Cd = C, F = m.ff_dim(), L = m.n_layer, Td = T;
  const double block_fwd_per_token = 2 * L * (4 * Cd * Cd + 3 * Cd * F) + 4 * L * Td * Cd;
  const double expected_model = 1 + block_fwd_per_token / gpt_flops_per_token(m);
  std::printf(
      "preset %s (C=%lld L=%lld V=%lld T=%lld), B=%lld, threads torch %d + BLAS %d, %s; medians of %d "
      "alternating repeats x %d iterations\n",
      flag(f, "preset", "small").c_str(), static_cast<long long>(C), static_cast<long long>(m.n_layer),
      static_cast<long long>(m.vocab_size), static_cast<long long>(T), static_cast<long long>(B), budget.torch_threads,
      budget.blas_threads, blas_description().c_str(), repeats, iters);
  std::printf(
      "model  (PipelineStage, stages = 1) forward + backward: plain %.4f s, checkpointed %.4f s (medians), ratio "
      "%.3f; fastest repeats %.3f (expected from FLOPs %.3f)\n",
      mp, mc, mc / mp, lo(1) / lo(0), expected_model);
  std::printf(
      "blocks (%lld blocks alone)           forward + backward: plain %.4f s, checkpointed %.4f s (medians), ratio "
      "%.3f; fastest repeats %.3f (expected 4/3 = 1.333)\n",
      static_cast<long long>(m.n_layer), bp, bc, bc / bp, lo(3) / lo(2));
  std::printf(
      "CPU time (medians): model plain %.4f s, checkpointed %.4f s, ratio %.3f; blocks plain %.4f s, "
      "checkpointed %.4f s, ratio %.3f\n",
      c(0), c(1), c(1) / c(0), c(2), c(3), c(3) / c(2));
  return 0;
}
