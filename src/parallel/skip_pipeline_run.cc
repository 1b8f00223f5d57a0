// One SkipPipe node as a process; see skip_pipeline_run.h.
#include "parallel/skip_pipeline_run.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/config.h"
#include "data/shards.h"
#include "data/stream.h"
#include "parallel/skip_pipeline.h"
#include "pipeline/schedule.h"
#include "pipeline/setting.h"
#include "train/trainer.h"

namespace dloco {
namespace {

// FNV-1a 64 over every parameter's name and fp32 bytes, in name order: equal hashes = bitwise equal replicas.
std::pair<std::string, int64_t> parameter_hash(const std::map<std::string, torch::Tensor>& params) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  };
  int64_t count = 0;
  for (const auto& [name, t] : params) {
    mix(reinterpret_cast<const unsigned char*>(name.data()), name.size());
    const torch::Tensor c = t.detach().to(torch::kFloat32).contiguous();
    mix(static_cast<const unsigned char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * sizeof(float));
    count += c.numel();
  }
  std::ostringstream hex;
  hex << std::hex << std::setw(16) << std::setfill('0') << h;
  return {hex.str(), count};
}

nlohmann::json to_json(const SkipIterationStats& s, int64_t iteration, double wall_s) {
  return {{"iteration", iteration},         {"wall_s", wall_s},
          {"loss", s.loss},                 {"grad_norm", s.grad_norm},
          {"lr", s.lr},                     {"skipped", s.skipped},
          {"micro_batches", s.micro_batches}, {"peak_held", s.peak_held},
          {"bytes_sent", s.bytes_sent},     {"allreduce_bytes", s.allreduce_bytes},
          {"link_wait_s", s.link_wait_s},   {"delayed_messages", s.delayed_messages},
          {"compute_pad_s", s.compute_pad_s}};
}

void run_node(const SkipNodeOptions& o) {
  torch::set_num_threads(1);  // the parent set OMP/BLAS threads to 1 in the environment as well
  const Config config = load_config(o.config);
  const pipeline::Setting setting = pipeline::load_setting(o.setting);
  const pipeline::Schedule schedule = pipeline::load_schedule(o.schedule, setting);
  const int N = static_cast<int>(setting.node_count());
  if (o.node < 0 || o.node >= N) throw InputError("--node " + std::to_string(o.node) + ": out of range");

  CollectiveOptions copts;
  copts.store_file = o.out_dir / "store";
  copts.rank = o.node;
  copts.world = N;
  copts.timeout_s = o.timeout_s;
  Collective group(copts);

  torch::manual_seed(config.run.seed);
  GPT full(config.model);  // the same initial model on every node
  SkipPipeNode node(full, setting, schedule, group, config.train, make_schedule(config));
  node.set_link_time_scale(o.link_scale);
  node.set_compute_time_scale(o.compute_scale);
  std::unique_ptr<DataStream> stream;
  if (node.stage() == 0) {
    auto split = std::make_shared<TokenSplit>(split_shards(config.data.dir, "train"));
    stream = std::make_unique<DataStream>(split, 0, 1, config.train.batch_size, config.model.seq_len, StreamCursor{});
  }

  nlohmann::json iterations = nlohmann::json::array();
  for (int64_t k = 0; k < o.iterations; ++k) {
    if (k == o.die_at_iteration) {
      std::fprintf(stderr, "[skippipe node %d iteration %lld] killing itself (fault injected for a test)\n", o.node,
                   static_cast<long long>(k));
      std::fflush(stderr);
      ::kill(::getpid(), SIGKILL);
    }
    if (k == o.hang_at_iteration) {
      std::fprintf(stderr, "[skippipe node %d iteration %lld] hanging (fault injected for a test)\n", o.node,
                   static_cast<long long>(k));
      std::fflush(stderr);
      for (;;) ::pause();  // until a signal ends the process
    }
    const auto began = std::chrono::steady_clock::now();
    const SkipIterationStats s = node.run_iteration(stream.get(), k);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    iterations.push_back(to_json(s, k, wall));
    std::printf("[skippipe node %d iteration %lld] loss %.6f grad_norm %.6f wall %.3f s sent %lld B\n", o.node,
                static_cast<long long>(k), s.loss, s.grad_norm, wall, static_cast<long long>(s.bytes_sent));
    std::fflush(stdout);
  }
  const auto [hash, count] = parameter_hash(node.named_parameters());
  const nlohmann::json out = {{"node", o.node},        {"stage", node.stage()}, {"iterations", iterations},
                              {"param_hash", hash},    {"param_count", count}};
  write_file_atomically(o.out_dir / ("node_" + std::to_string(o.node) + ".json"), out.dump(1) + "\n");
}

}  // namespace

int run_skippipe_node(const SkipNodeOptions& o) {
  try {
    run_node(o);
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "[skippipe node %d] stopped: %s\n", o.node, e.what());
    return kSkipNodePeerFailedExit;
  }
  return 0;
}

}  // namespace dloco
