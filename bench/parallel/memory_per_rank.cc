// Memory per rank of plain data parallelism and ZeRO-1/2/3 (parallel/zero.h) at N = 4, fp32, of bf16 data
// parallelism (parallel/mixed_precision.h, "stage" 4 here), and of Megatron's layout ("stage" 5: TP2 × PP2 × DP2
// with the distributed optimizer in bf16, parallel/distributed_optimizer.h, 8 ranks, measured per parameter the
// rank holds against 2 + 4 + 12/d = 12 bytes, counted after the last step: the engine frees each window's .grad
// once it is in the fp32 main gradients, which persist), and of FSDP × TP ("stage" 6: ZeRO-3 × TP2 × DP2 in bf16
// with sharded initialisation, parallel/sharded_init.h, 4 ranks, per parameter the rank's TP part holds against
// (4 master + 4 gradient + 8 m, v) / d = 8 bytes, plus its peak RSS while it builds its slices against its state
// plus one full part of the model — the largest of wte, a block, lm_head — in fp32; "stage" 7 the same built from
// a full GPT, for comparison), each rank a process.
// Per stage, after a few steps, each rank reports (1) its live tensor bytes of model state by category, counted
// from the tensors between backward and step of the last step (ZeroAdamW::memory(); for DP the parameters, their
// .grad and AdamW's exp_avg / exp_avg_sq counted by hand; bf16: Bf16Optimizer::memory(), param = the bf16 copy +
// the fp32 masters), against 16 / 10 / 7 / 4 (bf16: 2 + 4 + 4 + 8 = 18) bytes per parameter; (2) its
// VmRSS after the last step and VmHWM, minus VmRSS measured after the group was formed and before the model was
// built, tcmalloc's bytes in use at the moment (1) is counted, and VmRSS again after tcmalloc returned its free
// pages (so the gap between RSS and the live bytes is measured); (3) the bytes it sent during the last step
// (Collective::traffic(), the adapter's ring-model count) against 6Ψ / 6Ψ / 6Ψ / 9Ψ bytes (bf16: 6Ψ, its
// gradients are all-reduced in fp32: Gloo cannot all-reduce bf16).
// Plain DP here is what parallel/rank_engine.cc's zero = 0 does (a replica, torch AdamW with the trainer's
// groups, the flat gradient all-reduced and averaged); ZeRO runs ZeroAdamW directly because RankEngine does not
// expose memory(). No clipping and no lr schedule (they change no byte counts).
// Deliberately not measured: speed (bench_parallel_throughput), activations by category (they are in RSS only;
// the per-rank batch is kept small so that state dominates), which transient buffer left which free pages.
// Usage: bench_parallel_memory [--ranks 4] [--d-model 512] [--layers 8] [--vocab 8192] [--seq 128] [--batch 1]
//                              [--steps 3] [--stages 0,1,2,3,4,5,6,7]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "collective/flat_model.h"
#include "model/gpt.h"
#include "parallel/distributed_optimizer.h"
#include "parallel/mixed_precision.h"
#include "parallel/rank_engine.h"
#include "parallel/zero.h"
#include "rank_processes.h"
#include "train/trainer.h"

using namespace dloco;
using namespace dloco::bench;

namespace {

ModelConfig model_from(const Flags& f) {
  ModelConfig m;
  m.preset = "bench";
  m.d_model = flag_int(f, "d-model", 512);
  m.n_layer = flag_int(f, "layers", 8);
  m.n_head = flag_int(f, "heads", 8);
  m.vocab_size = flag_int(f, "vocab", 8192);
  m.seq_len = flag_int(f, "seq", 128);
  m.tie_embeddings = false;  // ZeRO-3 needs untied embeddings; every stage runs the same model
  return m;
}

// One rank: build, train `steps` steps on its own random batch (b, T), report.
int rank_main(const Flags& f) {
  const RankArgs a = rank_args(f);
  one_thread_each();
  const int zero = static_cast<int>(flag_int(f, "zero", 0));
  const int64_t b = flag_int(f, "batch", 1), steps = flag_int(f, "steps", 3);
  auto group = join_group(a);
  const ModelConfig m = model_from(f);
  {  // warm the BLAS and autograd paths on something small, so the baseline includes their buffers
    auto w = torch::randn({64, 64}, torch::requires_grad());
    torch::mm(w, w).sum().backward();
  }
  const ProcStatus base = proc_status();
  const HeapStats base_heap = heap_stats();
  HeapStats measured_heap;  // between backward and step of the last step, where the live bytes are counted

  GPT model{nullptr};  // stage 6 never builds it
  if (zero != 6) {
    torch::manual_seed(0);
    model = GPT(m);
  }
  auto gen = at::detail::createCPUGenerator(1000 + a.rank);
  const auto tokens = torch::randint(m.vocab_size, {b, m.seq_len + 1}, gen, torch::kLong);    // (b, T + 1)
  const auto idx = tokens.narrow(1, 0, m.seq_len), targets = tokens.narrow(1, 1, m.seq_len);  // (b, T)
  TrainConfig train;
  nlohmann::json out;
  out["parameters"] = gpt_parameter_count(m);
  int64_t param_bytes = 0, grad_bytes = 0, adam_bytes = 0, sent = 0, peak_full_grad = 0, peak_gathered = 0;
  std::vector<double> losses;
  // After the last step, while the optimizer and the model still exist: RSS, tcmalloc's heap, then RSS once
  // tcmalloc has returned its free pages.
  auto after_last_step = [&out] {
    out["after"] = to_json(proc_status());
    out["after_heap"] = to_json(heap_stats());
    release_free_memory();
    out["released"] = to_json(proc_status());
  };
  // `steps` steps of a learner group's engine on one window (W = 1) the same on every rank; the last one's traffic.
  const auto train_engine = [&](RankEngine& engine, const TrainConfig& train) {
    auto gen_all = at::detail::createCPUGenerator(1000);
    const auto windows = torch::randint(m.vocab_size, {1, window_tokens(train.batch_size, m.seq_len)}, gen_all, torch::kLong);
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t before = group->bytes_sent();
      losses.push_back(engine.step(windows, train.lr).loss);
      sent = group->bytes_sent() - before;
    }
  };
  if (zero == 6 || zero == 7) {  // FSDP × TP in bf16 through the learner group's own engine
    ParallelConfig parallel;
    parallel.tensor = parallel.data = 2;
    parallel.zero = 3;
    parallel.precision = Precision::kBf16;
    train.batch_size = 2 * b;  // d replicas × b sequences
    auto engine = zero == 6 ? make_rank_engine(m, 0, parallel, train, *group)
                            : make_rank_engine(model, parallel, train, *group);
    model = GPT(nullptr);
    out["start"] = to_json(proc_status());  // VmHWM now: the peak while the slices were built
    train_engine(*engine, train);
    const ZeroMemory mem = engine->zero_optimizer()->memory();  // gradient slices persist between steps
    param_bytes = mem.parameter_bytes;
    grad_bytes = mem.gradient_bytes;
    adam_bytes = mem.optimizer_state_bytes;
    peak_gathered = mem.peak_gathered_parameter_bytes;
    out["held"] = engine->zero_optimizer()->parameter_count();
    measured_heap = heap_stats();
    after_last_step();
  } else if (zero == 5) {  // Megatron's layout in bf16 through the learner group's own engine
    ParallelConfig parallel;
    parallel.tensor = parallel.pipeline = parallel.data = 2;
    parallel.zero = 1;
    parallel.micro_batches = 2;
    parallel.precision = Precision::kBf16;
    train.batch_size = 2 * 2 * b;  // d replicas × m micro-batches × b sequences
    auto engine = make_rank_engine(model, parallel, train, *group);
    model = GPT(nullptr);  // the stage holds copies of its own share
    train_engine(*engine, train);
    const DistributedMemory mem = engine->distributed_optimizer()->memory();  // main gradients persist
    param_bytes = mem.parameter_bytes + mem.master_bytes;
    grad_bytes = mem.gradient_bytes;
    adam_bytes = mem.moment_bytes;
    out["held"] = mem.parameters;
    measured_heap = heap_stats();
    after_last_step();
  } else if (zero == 4) {  // bf16 data parallelism, as parallel/rank_engine.cc's Bf16DataParallelEngine
    Bf16Optimizer opt(*model, train);
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t before = group->bytes_sent();
      opt.zero_grad();
      auto loss = model->loss(idx, targets);
      loss.backward();
      {
        torch::NoGradGuard no_grad;
        std::vector<torch::Tensor> parts;
        for (const auto& g : opt.main_grads()) parts.push_back(g.reshape({-1}));
        auto flat = torch::cat(parts);  // (Ψ) fp32
        parts.clear();
        group->allreduce_sum(flat);
        flat.div_(group->world());
        int64_t offset = 0;
        for (const auto& g : opt.main_grads()) {
          g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
          offset += g.numel();
        }
      }
      if (s == steps - 1) {
        const PrecisionMemory mem = opt.memory();
        param_bytes = mem.model_bytes + mem.master_bytes;
        grad_bytes = mem.grad_bytes;
        adam_bytes = mem.m_bytes + mem.v_bytes;
        measured_heap = heap_stats();
      }
      opt.step(train.lr, loss.item<double>());
      losses.push_back(loss.item<double>());
      sent = group->bytes_sent() - before;
    }
    after_last_step();
  } else if (zero == 0) {
    auto adamw = make_inner_adamw(model->parameters(), train);
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t before = group->bytes_sent();
      adamw->zero_grad();
      auto loss = model->loss(idx, targets);
      loss.backward();
      auto flat = flatten_parameters(model, /*grads=*/true);  // (Ψ), as rank_engine.cc's average_gradients
      group->allreduce_sum(flat);
      flat.div_(group->world());
      unflatten_into(model, flat, /*grads=*/true);
      flat = torch::Tensor();
      if (s == steps - 1) {
        for (const auto& p : model->parameters()) {
          param_bytes += p.nbytes();
          if (p.grad().defined()) grad_bytes += p.grad().nbytes();
        }
        for (const auto& [key, state] : adamw->state()) {
          const auto& st = static_cast<const torch::optim::AdamWParamState&>(*state);
          adam_bytes += st.exp_avg().nbytes() + st.exp_avg_sq().nbytes();
          if (st.max_exp_avg_sq().defined()) adam_bytes += st.max_exp_avg_sq().nbytes();
        }
        measured_heap = heap_stats();
      }
      adamw->step();
      losses.push_back(loss.item<double>());
      sent = group->bytes_sent() - before;
    }
    after_last_step();
  } else {
    ZeroAdamW opt(model, *group, zero_options(train, zero));
    model = GPT(nullptr);  // ZeroAdamW holds the model now; stage 3 has released the full parameters
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t before = group->bytes_sent();
      auto loss = opt.loss(idx, targets);
      opt.backward(loss);
      if (s == steps - 1) {
        const ZeroMemory mem = opt.memory();
        param_bytes = mem.parameter_bytes;
        grad_bytes = mem.gradient_bytes;
        adam_bytes = mem.optimizer_state_bytes;
        peak_full_grad = mem.peak_full_gradient_bytes;
        peak_gathered = mem.peak_gathered_parameter_bytes;
        measured_heap = heap_stats();
      }
      opt.step();
      losses.push_back(loss.item<double>());
      sent = group->bytes_sent() - before;
    }
    after_last_step();
  }
  out["base_heap"] = to_json(base_heap);
  out["measured_heap"] = to_json(measured_heap);
  out["zero"] = zero;
  out["param_bytes"] = param_bytes;
  out["grad_bytes"] = grad_bytes;
  out["adam_bytes"] = adam_bytes;
  out["peak_full_grad_bytes"] = peak_full_grad;
  out["peak_gathered_bytes"] = peak_gathered;
  out["sent_last_step"] = sent;
  out["base"] = to_json(base);
  out["losses"] = losses;
  write_result(a.out, out);
  return 0;
}

const char* kNames[] = {"DP (zero = 0)", "ZeRO-1", "ZeRO-2", "ZeRO-3", "bf16 DP", "TP2xPP2xDP2 Z1", "Z3xTP2 sharded",
                        "Z3xTP2 full"};

// The largest full part of the model in fp32 bytes: wte (V·C), a block (4C² + 3C·F + 2C), lm_head (C·V).
double largest_part_bytes(const ModelConfig& m) {
  const double C = static_cast<double>(m.d_model), V = static_cast<double>(m.vocab_size),
               F = static_cast<double>(m.ff_dim());
  return 4 * std::max(V * C, 4 * C * C + 3 * C * F + 2 * C);
}

int parent_main(const Flags& f, int argc, char** argv) {
  const int N = static_cast<int>(flag_int(f, "ranks", 4));
  const ModelConfig m = model_from(f);
  const double psi = static_cast<double>(gpt_parameter_count(m));
  const std::vector<std::string> pass = forward_flags(f, {"ranks", "stages", "zero"});  // the model and run flags
  std::printf(
      "model C=%lld L=%lld V=%lld T=%lld untied: Psi = %.0f parameters; N = %d rank processes, fp32 (bf16 DP: bf16), "
      "per-rank batch %lld, %lld steps\n",
      static_cast<long long>(m.d_model), static_cast<long long>(m.n_layer), static_cast<long long>(m.vocab_size),
      static_cast<long long>(m.seq_len), psi, N, static_cast<long long>(flag_int(f, "batch", 1)),
      static_cast<long long>(flag_int(f, "steps", 3)));
  const double n = N;
  const double target_live[] = {16, 8 + 8 / n, 4 + 12 / n, 16 / n, 18, 2 + 4 + 12 / 2.0, 16 / 2.0, 16 / 2.0};
  // Stage 5: its traffic goes over the engine's TP, PP and DP sub-groups, whose counters the engine keeps: not
  // measured here (0).
  const double target_traffic[] = {2 * (n - 1) / n * 4, 2 * (n - 1) / n * 4, 2 * (n - 1) / n * 4, 3 * (n - 1) / n * 4,
                                   2 * (n - 1) / n * 4, 0, 0, 0};
  std::printf(
      "live: tensor bytes / parameter between backward and step of the last step; heap: tcmalloc's bytes in\n"
      "use at that moment minus before the model; RSS, HWM: VmRSS after the last step and VmHWM minus VmRSS before\n"
      "the model; rel: VmRSS after tcmalloc returned its free pages; traffic: bytes sent in the last step / Psi\n");
  std::printf("%-14s %4s | %6s %6s %6s %7s %6s %6s | %6s | %6s %6s %6s | %7s %6s %6s\n", "stage", "rank", "param",
              "grad", "adam", "live", "target", "ratio", "heap", "RSS", "HWM", "rel", "traffic", "target", "ratio");
  std::string stages = flag(f, "stages", "0,1,2,3,4,5,6,7");
  for (int zero = 0; zero <= 7; ++zero) {
    if (stages.find(std::to_string(zero)) == std::string::npos) continue;
    std::vector<std::string> args = pass;
    args.insert(args.end(), {"--zero", std::to_string(zero)});
    const int world = zero == 5 ? 8 : zero >= 6 ? 4 : N;
    const auto ranks = run_ranks(world, args, 1800, "memory_zero" + std::to_string(zero));
    if (ranks.empty()) return 1;
    for (int r = 0; r < world; ++r) {
      const auto& j = ranks[r];
      const double per = j.contains("held") ? j["held"].get<double>() : psi;  // stages 5-7: the rank's own parameters
      const double pb = j["param_bytes"].get<double>() / per, gb = j["grad_bytes"].get<double>() / per,
                   ab = j["adam_bytes"].get<double>() / per, live = pb + gb + ab;
      const double base = j["base"]["rss"].get<double>();
      const double rss = (j["after"]["rss"].get<double>() - base) / per;
      const double hwm = (j["after"]["hwm"].get<double>() - base) / per;
      const double rel = (j["released"]["rss"].get<double>() - base) / per;
      const double heap =
          (j["measured_heap"]["allocated"].get<double>() - j["base_heap"]["allocated"].get<double>()) / per;
      const double traffic = j["sent_last_step"].get<double>() / per;
      std::printf("%-14s %4d | %6.3f %6.3f %6.3f %7.3f %6.2f %6.3f | %6.2f | %6.2f %6.2f %6.2f | ", kNames[zero], r,
                  pb, gb, ab, live, target_live[zero], live / target_live[zero], heap, rss, hwm, rel);
      if (target_traffic[zero] > 0) {
        std::printf("%7.3f %6.2f %6.3f\n", traffic, target_traffic[zero], traffic / target_traffic[zero]);
      } else {
        std::printf("%7s %6s %6s\n", "-", "-", "-");  // the sub-groups' traffic is inside the engine
      }
    }
    if (zero >= 6) {  // the peak while building: the state (16/d B per held parameter) plus one full fp32 part
      for (int r = 0; r < world; ++r) {
        const auto& j = ranks[r];
        const double state = 16 / 2.0 * j["held"].get<double>(), part = largest_part_bytes(m);
        const double start_hwm = j["start"]["hwm"].get<double>() - j["base"]["rss"].get<double>();
        std::printf("%-14s %4d   start: peak RSS over the baseline %.1f MiB; state %.1f MiB + one full part %.1f "
                    "MiB = %.1f MiB (ratio %.3f); the full fp32 model alone %.1f MiB\n",
                    kNames[zero], r, start_hwm / (1 << 20), state / (1 << 20), part / (1 << 20),
                    (state + part) / (1 << 20), start_hwm / (state + part), 4 * psi / (1 << 20));
      }
    }
    const auto& j0 = ranks[0];
    std::printf(
        "%-14s       transient (rank 0, the code's own count): full gradients %.3f B/param, gathered "
        "parameters %.3f B/param; tcmalloc free after the step %.2f B/param; baseline RSS %.0f MiB; losses",
        kNames[zero], j0["peak_full_grad_bytes"].get<double>() / psi, j0["peak_gathered_bytes"].get<double>() / psi,
        j0["after_heap"]["free"].get<double>() / psi, j0["base"]["rss"].get<double>() / (1 << 20));
    for (double l : j0["losses"]) std::printf(" %.4f", l);
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench_main("bench_parallel_memory", "Memory per rank of DP, ZeRO-1/2/3 and bf16 DP, each rank a process",
                    {{"ranks", "4", "rank processes N"},
                     {"stages", "0,1,2,3,4,5,6,7",
                      "what to measure: 0 = DP, 1-3 = ZeRO-1/2/3, 4 = bf16 DP, 5 = TP2 x PP2 x DP2 + ZeRO-1 in bf16, "
                      "6 = ZeRO-3 x TP2 x DP2 in bf16 with sharded init, 7 = the same from a full GPT"},
                     {"layers", "8", "model: blocks L"},
                     {"d-model", "512", "model: C"},
                     {"heads", "8", "model: NH"},
                     {"vocab", "8192", "model: V"},
                     {"seq", "128", "model: T"},
                     {"batch", "1", "sequences per step and rank"},
                     {"steps", "3", "steps before measuring"},
                     {"zero", "0", "the stage a rank measures (set by the parent)"}},
                    argc, argv, rank_main, parent_main);
}
