// The checks a SkipPipe pipeline of processes needs before any process starts, beyond the file parsers
// (docs/skippipe.md "Pipeline nodes as processes" and "A SkipPipe learner"): every node of the setting placed in a
// stage (one rank per node), S stages dividing the model's blocks, a schedule the exact simulator runs to the end
// (no deadlock), and for a learner one micro-batch of the schedule per train.grad_accum window. Shared by
// `dloco skippipe train`, `dloco train`'s pre-flight and the learner's rank engine, so all three refuse the same
// input with the same words. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"
#include "skippipe/schedule.h"
#include "skippipe/setting.h"

namespace dloco::skippipe {

/// A setting and a schedule that passed every check, with the exact simulator's iteration time (s, unscaled).
struct CheckedPipeline {
  Setting setting;
  Schedule schedule;
  double iteration_time_s = 0;
};

/// Loads both files and checks them against each other and a model of `n_layer` blocks. Throws InputError naming
/// the file and what is wrong (an unplaced node, S ∤ n_layer, a deadlock, and every parser error).
CheckedPipeline load_checked_pipeline(const std::string& setting_path, const std::string& schedule_path,
                                      int64_t n_layer);

/// load_checked_pipeline for the SkipPipe learner group `g` of config `c` (`key` names it in messages, e.g.
/// "parallel.learner[id = 0]"), and the learner's batch: the schedule's micro-batch count must equal
/// train.grad_accum (one window of train.batch_size sequences per micro-batch). Throws InputError.
CheckedPipeline check_skippipe_learner(const Config& c, const ParallelConfig& g, const std::string& key);

}  // namespace dloco::skippipe
