// Throughput of a learner group of 2 ranks (2 processes, one BLAS thread each, the same cores) for four group
// kinds built by make_rank_engine (parallel/rank_engine.h) from one ParallelConfig each and the same TrainConfig:
// tensor = 2, pipeline = 2 (1F1B, m micro-batches), ZeRO-2 over data = 2, against plain data = 2 (zero = 0).
// Both ranks build all four engines from the same seeded GPT in one group, then every repeat times `steps` steps
// of each engine in turn (the order alternates the configurations, so load changes hit all of them); tokens/s
// = B·T·grad_accum per step over the median step time, and the ratios to DP.
// Deliberately not measured: memory (bench_parallel_memory), learning (random tokens; the cost of a step does not
// depend on them), anything outside RankEngine::step (the syncer, fragments, data loading).
// Usage: bench_parallel_throughput [--preset small] [--batch 8] [--micro-batches 4] [--warmup 2] [--steps 3]
//                                  [--repeats 9]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "data/stream.h"
#include "model/gpt.h"
#include "parallel/rank_engine.h"
#include "rank_processes.h"

using namespace dloco;
using namespace dloco::bench;
using Clock = std::chrono::steady_clock;

namespace {

double cpu_seconds() {  // this process's CPU time, all threads
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Kind {
  const char* name;
  ParallelConfig parallel;
};

std::vector<Kind> kinds(int64_t micro_batches) {
  ParallelConfig dp, tp, pp, z2;
  dp.data = 2;
  tp.tensor = 2;
  pp.pipeline = 2;
  pp.schedule = PipelineScheduleChoice::k1F1B;
  pp.micro_batches = micro_batches;
  z2.data = 2;
  z2.zero = 2;
  return {{"DP d=2 (zero 0)", dp}, {"TP t=2", tp}, {"PP p=2 1F1B", pp}, {"ZeRO-2 d=2", z2}};
}

int rank_main(const Flags& f) {
  const RankArgs a = rank_args(f);
  one_thread_each();
  auto group = join_group(a);
  const ModelConfig m = model_preset(flag(f, "preset", "small"));
  TrainConfig train;
  train.batch_size = flag_int(f, "batch", 8);
  const int64_t warmup = flag_int(f, "warmup", 2), steps = flag_int(f, "steps", 3), repeats = flag_int(f, "repeats", 9);
  const auto ks = kinds(flag_int(f, "micro-batches", 4));
  std::vector<std::unique_ptr<RankEngine>> engines;
  for (const auto& k : ks) {
    torch::manual_seed(0);
    engines.push_back(make_rank_engine(GPT(m), k.parallel, train, *group));
  }
  auto gen = at::detail::createCPUGenerator(7);  // the same windows on both ranks
  const int64_t per_window = window_tokens(train.batch_size, m.seq_len);
  std::vector<torch::Tensor> windows;  // (grad_accum, B·(T + 1)) each
  for (int i = 0; i < 4; ++i)
    windows.push_back(torch::randint(m.vocab_size, {train.grad_accum, per_window}, gen, torch::kLong));
  for (auto& e : engines) {
    for (int64_t s = 0; s < warmup; ++s) e->step(windows[s % windows.size()], train.lr);
  }
  std::vector<std::vector<double>> secs(engines.size());  // per engine: seconds per step of each repeat
  std::vector<std::vector<double>> cpu(engines.size());   // per engine: this rank's CPU seconds per step
  std::vector<double> losses(engines.size());
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < engines.size(); ++i) {
      const size_t e = (r % 2 == 0) ? i : engines.size() - 1 - i;  // forward order, then backward
      group->barrier();
      const double c0 = cpu_seconds();
      const auto t0 = Clock::now();
      for (int64_t s = 0; s < steps; ++s) losses[e] = engines[e]->step(windows[s % windows.size()], train.lr).loss;
      group->barrier();
      secs[e].push_back(std::chrono::duration<double>(Clock::now() - t0).count() / static_cast<double>(steps));
      cpu[e].push_back((cpu_seconds() - c0) / static_cast<double>(steps));
    }
  }
  nlohmann::json out;
  out["secs"] = secs;
  out["cpu"] = cpu;
  out["losses"] = losses;
  out["tokens_per_step"] = train.tokens_per_step(m);
  out["parameters"] = gpt_parameter_count(m);
  std::vector<std::string> names;
  for (const auto& e : engines) names.push_back(e->describe());
  out["describe"] = names;
  out["blas"] = blas_description();
  write_result(a.out, out);
  return 0;
}

int parent_main(const Flags& f, int argc, char** argv) {
  const std::vector<std::string> pass = forward_flags(f);
  const auto ranks = run_ranks(2, pass, 3600, "throughput");
  if (ranks.empty()) return 1;
  const auto& j = ranks[0];
  const ModelConfig m = model_preset(flag(f, "preset", "small"));
  const auto ks = kinds(flag_int(f, "micro-batches", 4));
  std::printf(
      "preset %s (Psi = %lld, C=%lld L=%lld V=%lld T=%lld), B=%lld, %lld tokens per step; 2 rank processes, "
      "1 LibTorch + 1 BLAS thread each (%s); %lld warm-up steps, then %lld repeats x %lld steps per kind, "
      "alternating\n",
      flag(f, "preset", "small").c_str(), static_cast<long long>(j["parameters"].get<int64_t>()),
      static_cast<long long>(m.d_model), static_cast<long long>(m.n_layer), static_cast<long long>(m.vocab_size),
      static_cast<long long>(m.seq_len), static_cast<long long>(flag_int(f, "batch", 8)),
      static_cast<long long>(j["tokens_per_step"].get<int64_t>()), j["blas"].get<std::string>().c_str(),
      static_cast<long long>(flag_int(f, "warmup", 2)), static_cast<long long>(flag_int(f, "repeats", 9)),
      static_cast<long long>(flag_int(f, "steps", 3)));
  const double tokens = j["tokens_per_step"].get<double>();
  // Under load the spread between repeats is large; the fastest repeat is the one least disturbed, so its ratio
  // is printed beside the medians'.
  const auto dp_secs = j["secs"][0].get<std::vector<double>>();
  const double dp = median(dp_secs), dp_min = *std::min_element(dp_secs.begin(), dp_secs.end());
  for (size_t e = 0; e < ks.size(); ++e) {
    const auto s = j["secs"][e].get<std::vector<double>>();
    const double med = median(s), lo = *std::min_element(s.begin(), s.end());
    std::printf(
        "%-16s (%s): s/step median %.3f (min %.3f, max %.3f); tokens/s median %.0f, best %.0f; ratio to DP "
        "median %.3f, best %.3f; last loss %.4f\n",
        ks[e].name, j["describe"][e].get<std::string>().c_str(), med, lo, *std::max_element(s.begin(), s.end()),
        tokens / med, tokens / lo, dp / med, dp_min / lo, j["losses"][e].get<double>());
  }
  // CPU seconds per step of each rank (medians): the compute and communication work each kind costs, without
  // the time the machine's other work kept a rank off the cores (nor the time it waited for its peer).
  std::printf("CPU s/step per rank (medians):");
  for (size_t e = 0; e < ks.size(); ++e) {
    std::printf(" %s", ks[e].name);
    for (const auto& r : ranks) std::printf(" %.3f", median(r["cpu"][e].get<std::vector<double>>()));
    std::printf(";");
  }
  std::printf("\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return bench_main("bench_parallel_throughput", "Tokens/s of TP, PP and ZeRO-2 against DP, 2 rank processes",
                    {{"preset", "small", "model preset (core/config.h)"},
                     {"batch", "8", "sequences per step"},
                     {"micro-batches", "4", "pipeline micro-batches m"},
                     {"warmup", "2", "untimed steps per engine"},
                     {"steps", "3", "timed steps per engine and repeat"},
                     {"repeats", "9", "alternating repeats (medians)"}},
                    argc, argv, rank_main, parent_main);
}
