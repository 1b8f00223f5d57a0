// How many stages a SkipPipe path visits (docs/skippipe.md "Structure"): the one formula the config checks, the
// model's stage subsets, the trainer and the scheduler share. Deliberately nothing else.
#pragma once

#include <cmath>
#include <cstdint>

namespace dloco {

/// Stages a path visits, stage 0 included: round(S·(1 − k)) for S stages and skip ratio k, halves rounded away from
/// zero (S = 5, k = 0.5 keeps 3). No checks: each caller refuses what it cannot run (fewer than 2 stages, k outside
/// [0, 1)) with its own message.
inline int64_t stages_per_path(int64_t S, double k) { return std::llround(static_cast<double>(S) * (1.0 - k)); }

}  // namespace dloco
