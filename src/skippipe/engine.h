// The rank engine of a SkipPipe learner (docs/skippipe.md "A SkipPipe learner"): one node of the setting behind
// src/parallel's RankEngine interface, so that a learner group drives a SkipPipe pipeline as it drives a tensor- or
// pipeline-parallel group. learner/group_engine.h picks it for parallel.skippipe_schedule.
#pragma once

#include <memory>

#include "collective/process_group.h"
#include "core/config.h"
#include "model/gpt.h"
#include "parallel/rank_engine.h"

namespace dloco {

/// The engine of a SkipPipe learner (parallel.skippipe_schedule; skippipe/engine.cc): this rank is node
/// group.rank() of the setting. Throws InputError when the files do not fit the model or the batch
/// (skippipe/pipeline_check.h), CollectiveError.
std::unique_ptr<RankEngine> make_skippipe_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                                 Collective& group);

}  // namespace dloco
