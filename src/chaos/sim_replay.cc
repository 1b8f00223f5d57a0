// Replaying a chaos run in the goodput simulator; see sim_replay.h.
#include "chaos/sim_replay.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace dloco {

sim::GoodputConfig replay_config(const ChaosAnalysis& analysis, const ReplayShape& shape) {
  if (!(analysis.window_s > 0) || !(analysis.nominal_step_s > 0)) {
    throw InputError("cannot replay a chaos run without a training window and a measured step time");
  }
  sim::GoodputConfig c;
  c.method = sim::Method::kDecoupled;
  c.chips = shape.learners;
  c.slice_chips = 1;
  c.learners = shape.learners;
  c.quorum = shape.quorum;
  c.inner_steps = shape.inner_steps;
  c.fragments = shape.fragments;
  c.overlap_steps = shape.overlap;
  c.step_s = analysis.nominal_step_s;
  c.detect_s = 0;
  c.speed_cv = 0;
  c.learner_fatal_fraction = 1.0;
  c.horizon_s = analysis.window_s;
  c.upscale_s = 0;  // a paused learner resumes at once
  double rejoin = 0;
  int rejoined = 0;
  for (const Recovery& r : analysis.recoveries) {
    if (r.back_s >= 0) {
      rejoin += std::max(0.0, r.back_s - std::max(0.0, r.restart_after_s));
      ++rejoined;
    }
  }
  c.rejoin_s = rejoined > 0 ? rejoin / rejoined : 0.0;
  for (const auto& f : analysis.faults) {
    const std::string action = f.value("action", "");
    const double t = f.value("t", 0.0);
    const int64_t learner = f.value("learner", int64_t{-1});
    if (learner < 0 || learner >= shape.learners) continue;
    if (action == "kill_learner") {
      const double restart = f.value("restart_after_s", 0.0);
      if (restart < 0) {
        c.trace.push_back({t, learner, analysis.window_s + 1.0, false});  // never restarted
      } else {
        c.trace.push_back({t, learner, restart, false});
      }
    } else if (action == "pause_learner") {
      c.trace.push_back({t, learner, f.value("duration_s", 0.0), true});
    } else if (action == "slow_learner") {
      const double factor = f.value("factor", 1.0);
      c.trace.push_back({t, learner, f.value("duration_s", 0.0) * (1.0 - 1.0 / std::max(1.0, factor)), true});
    }
  }
  std::stable_sort(c.trace.begin(), c.trace.end(),
                   [](const sim::TracedFailure& a, const sim::TracedFailure& b) { return a.t_s < b.t_s; });
  c.return_dist = sim::ReturnDist::kFixed;
  return c;
}

}  // namespace dloco
