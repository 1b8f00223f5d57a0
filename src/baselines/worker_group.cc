// Which slot each rank trains, and a worker's own learner group; see worker_group.h.
#include "baselines/worker_group.h"

#include <string>

#include "train/threads.h"

namespace dloco {

std::vector<int> group_slots(const Config& config, const WorkerOptions& options) {
  const Mode mode = config.diloco.mode;
  if (!is_collective_mode(mode)) {
    throw InputError(std::string("dloco worker runs the baselines (diloco.mode = dp, diloco or streaming), not \"") + to_string(mode) + "\"");
  }
  const int M = static_cast<int>(config.diloco.learners), rank = options.rank;
  std::vector<int> slots = options.slots;
  if (slots.empty()) {
    for (int s = 0; s < M; ++s) slots.push_back(s);
  } else if (mode != Mode::kDp) {
    throw InputError("--slots (a group without every worker) applies to diloco.mode = \"dp\" only");
  }
  const int W = static_cast<int>(slots.size());
  if (rank < 0 || rank >= W) {
    throw InputError("worker rank " + std::to_string(rank) + " is outside [0, world = " + std::to_string(W) + ")");
  }
  std::vector<bool> seen(M, false);
  for (int s : slots) {
    if (s < 0 || s >= M || seen[s]) {
      throw InputError("--slots: slot " + std::to_string(s) + " is outside [0, M = " + std::to_string(M) +
                       ") or listed twice");
    }
    seen[s] = true;
  }
  return slots;
}

std::unique_ptr<GroupRanks> spawn_group_ranks(const Config& config, const WorkerOptions& options,
                                              const std::vector<int>& slots) {
  const int slot = slots[options.rank];
  const ParallelConfig& parallel = config.parallel_for(slot);
  if (parallel.ranks() == 1 && parallel.precision == Precision::kFp32) return nullptr;
  const int cores = config.run.threads > 0 ? static_cast<int>(config.run.threads) : machine_cores();
  const int threads = std::max(1, cores / static_cast<int>(parallel.ranks()));
  apply_thread_budget(thread_budget(threads));
  GroupOptions o;
  if (config.diloco.mode == Mode::kDp) {
    o.replica_store = options.store;
    o.replica_rank = options.rank;
    o.replicas = static_cast<int>(slots.size());
  }
  return std::make_unique<GroupRanks>(config, slot, options.run_dir, o, threads,
                                      config.run.collective_timeout_s);  // the workers' rendezvous comes first
}

}  // namespace dloco
