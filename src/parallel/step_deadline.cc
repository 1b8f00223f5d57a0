// The adaptive step deadline of a learner group; see step_deadline.h.
#include "parallel/step_deadline.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/check.h"

namespace dloco {

StepDeadline::StepDeadline(double cap_s, double floor_s, double multiple, int window, int warmup)
    : cap_(cap_s), floor_(floor_s), multiple_(multiple), window_(window), warmup_(warmup) {
  if (!(floor_s > 0 && floor_s <= cap_s) || !(multiple >= 1) || window < 1 || warmup < 1) {
    throw InputError("step deadline: want 0 < floor (" + std::to_string(floor_s) + " s) ≤ cap (" +
                     std::to_string(cap_s) + " s), multiple ≥ 1, window ≥ 1, warmup ≥ 1");
  }
}

void StepDeadline::record(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  recent_.push_back(seconds);
  if (static_cast<int>(recent_.size()) > window_) recent_.pop_front();
  ++recorded_;
}

double StepDeadline::seconds() const {
  if (recorded_ < warmup_) return cap_;
  const double slowest = *std::max_element(recent_.begin(), recent_.end());
  return std::clamp(multiple_ * slowest, floor_, cap_);
}

}  // namespace dloco
