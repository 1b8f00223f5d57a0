// The deadline of a learner group's step from its measured step times (issue 30 item 5; docs/parallel.md
// "Failures"): a hung rank (stopped, swapping, a lost packet) blocks its peers until their collectives time out, so
// the deadline inside a step is a multiple of the slowest recent step, floored and capped — a slow but healthy
// group is not killed (its own steps set the deadline), and a hung one is given up within seconds, not after
// parallel.timeout_s. Outside steps (fragments, saves, the wait for the next command) the cap applies.
//   deadline = clamp(multiple · max(last `window` step times), floor, cap); the cap until `warmup` steps are known.
// Deliberately not here: applying it (learner/group_inner_job.cc sets the group's and the engine's collectives).
#pragma once

#include <deque>

namespace dloco {

class StepDeadline {
 public:
  /// `cap_s`: the group's deadline (parallel.timeout_s). Throws InputError unless 0 < floor_s ≤ cap_s, multiple ≥ 1,
  /// window ≥ 1, warmup ≥ 1.
  explicit StepDeadline(double cap_s, double floor_s = 5, double multiple = 20, int window = 20, int warmup = 3);
  /// A step that took `seconds` (wall clock, the engine's step alone).
  void record(double seconds);
  /// The deadline of the next step's collectives, s.
  double seconds() const;
  double cap() const { return cap_; }

 private:
  double cap_, floor_, multiple_;
  int window_, warmup_;
  int recorded_ = 0;
  std::deque<double> recent_;  // the last `window_` step times
};

}  // namespace dloco
