// Learning-rate schedule of the inner optimizer: linear warmup, then cosine decay to a floor.
// A pure function of the global step, so a learner that (re)joins at global step t adopts the same lr as
// every other learner (docs/protocol.md §4, "A learner adopts t") — except that one whose AdamW moments start fresh
// in a warm run repeats the warmup on its own first steps (rewarm_from below, docs/protocol.md §10).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/config.h"

namespace dloco {

/// Warmup + cosine schedule. Units: steps. lr(t) = peak·t/warmup for t < warmup, then cosine from peak down to
/// peak·min_ratio at `total_steps`, flat afterwards.
///
/// Re-warming (`rewarm_from` = s > 0): a learner whose AdamW moments start fresh at global step s, among learners
/// whose moments are warm (a joiner, a restart without saved state), repeats the linear warmup on its own steps:
/// lr(t) × min(1, (t − s + 1)/warmup) for t ≥ s. Bias-corrected Adam's k-th update is about
/// √((1 + β1^k)/(1 − β1^k)) times its steady size for noise-dominated gradients (4.4× at k = 1, β1 = 0.9): unramped,
/// a joiner's first answers were 10–11× the others' per step and the syncer's norm screen refused them
/// (docs/protocol.md §10). The same reason the run starts with a warmup (RAdam, Liu et al. 2019).
struct LrSchedule {
  double peak_lr = 1e-3;      // peak learning rate of the inner AdamW
  int64_t warmup_steps = 50;  // linear warmup length, steps
  int64_t total_steps = 1000; // horizon of the cosine, steps (from the token budget)
  double min_ratio = 0.1;     // floor as a fraction of peak_lr
  int64_t rewarm_from = -1;   // global step its fresh AdamW started at (> 0), −1 = none

  /// Learning rate at step t (t ≥ 0).
  double at(int64_t t) const {
    const double lr = global_at(t);
    if (rewarm_from > 0 && warmup_steps > 0 && t >= rewarm_from && t - rewarm_from < warmup_steps) {
      return lr * static_cast<double>(t - rewarm_from + 1) / static_cast<double>(warmup_steps);
    }
    return lr;
  }

  /// The run's schedule at global step t, without re-warming (what the syncer's screening divides by).
  double global_at(int64_t t) const {
    if (warmup_steps > 0 && t < warmup_steps) return peak_lr * static_cast<double>(t + 1) / warmup_steps;
    if (t >= total_steps) return peak_lr * min_ratio;
    const double span = static_cast<double>(total_steps - warmup_steps);
    const double progress = span > 0 ? static_cast<double>(t - warmup_steps) / span : 1.0;
    const double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
    return peak_lr * (min_ratio + (1.0 - min_ratio) * cosine);
  }
};

/// The run's schedule: peak train.lr, train.warmup_steps, train.min_lr_ratio, and the cosine's horizon the global
/// steps of the budget (train.total_tokens over M learners' B·T·grad_accum).
inline LrSchedule make_schedule(const Config& c) {
  LrSchedule s;
  s.peak_lr = c.train.lr;
  s.warmup_steps = c.train.warmup_steps;
  s.min_ratio = c.train.min_lr_ratio;
  const int64_t per_step = c.train.tokens_per_step(c.model) * std::max<int64_t>(1, c.diloco.learners);
  s.total_steps = std::max<int64_t>(1, c.train.total_tokens / per_step);
  return s;
}

}  // namespace dloco
