// How a baseline worker's process is made up: which learner slot each rank of the Gloo group trains, and the
// ranks of its own learner group when it is one (R > 1 or bf16). Split from run_worker.cc.
#pragma once

#include <memory>
#include <vector>

#include "baselines/worker.h"
#include "core/config.h"
#include "learner/group_ranks.h"

namespace dloco {

/// The learner slot (data stream) of each rank of this group: --slots, or every slot in rank order. Throws
/// InputError for a rank outside the group, a slot outside [0, M) or listed twice, or --slots outside dp.
std::vector<int> group_slots(const Config& config, const WorkerOptions& options);

/// A learner group (R > 1 or bf16): its ranks 1 … R − 1, spawned before this rank builds its model, each with an
/// equal share of the worker's cores. dp: each rank also meets the same rank of every other worker at
/// "<store>.rank_<r>" (a fresh store per generation). Null for a one-process worker.
std::unique_ptr<GroupRanks> spawn_group_ranks(const Config& config, const WorkerOptions& options,
                                              const std::vector<int>& slots);

}  // namespace dloco
