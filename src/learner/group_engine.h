// The rank engine of one rank of a learner group: SkipPipe's (skippipe/engine.h) for parallel.skippipe_schedule,
// else src/parallel's (TP, PP, DP/ZeRO, bf16: parallel/rank_engine.h). The one place that knows both, so neither
// src/parallel nor src/skippipe includes the other's engine.
#pragma once

#include <filesystem>
#include <memory>

#include "core/check.h"
#include "parallel/rank_engine.h"
#include "parallel/sharded_init.h"
#include "skippipe/engine.h"

namespace dloco {

/// make_rank_engine or make_skippipe_engine, by `parallel`; arguments and errors as theirs (parallel/rank_engine.h).
inline std::unique_ptr<RankEngine> make_group_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                                     Collective& group, const std::filesystem::path& offload_dir = {}) {
  if (!parallel.skippipe()) return make_rank_engine(std::move(full), parallel, train, group, offload_dir);
  if (group.world() != parallel.ranks()) {
    throw InputError("a SkipPipe group of " + std::to_string(parallel.ranks()) + " nodes over a collective of " +
                     std::to_string(group.world()));
  }
  return make_skippipe_engine(std::move(full), parallel, train, group);
}

/// The same from the model config and the seed of the initial GPT: a ZeRO-3 × TP group initialises its slices
/// without building the model (parallel/sharded_init.h, bitwise the same Θ₀); every other kind builds GPT(model)
/// after torch::manual_seed(seed).
inline std::unique_ptr<RankEngine> make_group_engine(const ModelConfig& model, uint64_t seed,
                                                     const ParallelConfig& parallel, const TrainConfig& train,
                                                     Collective& group, const std::filesystem::path& offload_dir = {}) {
  if (!parallel.skippipe()) return make_rank_engine(model, seed, parallel, train, group, offload_dir);
  return make_group_engine(seeded_gpt(model, seed), parallel, train, group, offload_dir);
}

}  // namespace dloco
