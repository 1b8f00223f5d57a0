// What a live page draws over time: named series (bytes sent, merges, each learner's loss, …) sampled together at
// one clock, kept for the whole run in bounded memory. When `capacity` samples are held, every other one is dropped
// and the spacing between samples doubles, so a run of any length keeps its whole span at roughly uniform
// resolution (a 10-hour run sampled every second keeps ≤ capacity points, about one per 2^k s).
// A series absent from a sample (a learner not yet joined, or gone) is null there. Pure: no clock, no I/O.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco {

class MetricHistory {
 public:
  /// `capacity` ≥ 4 samples (InvariantError otherwise); `min_spacing_s` ≥ 0: a sample closer than that to the
  /// previous one kept is ignored (it doubles each time the history is thinned).
  explicit MetricHistory(size_t capacity = 512, double min_spacing_s = 1.0);

  /// Adds a sample at time `t_s` (seconds, non-decreasing; an earlier t is ignored) with `values` by series name.
  /// Returns false if it was ignored (too close to the previous sample or earlier). Non-finite values are stored as
  /// null.
  bool add(double t_s, const std::map<std::string, double>& values);

  /// {"t": [t_s …], "series": {name: [value or null …]}} — every array as long as "t", oldest first.
  nlohmann::json to_json() const;

  size_t size() const { return t_.size(); }
  double spacing_s() const { return spacing_s_; }

 private:
  void thin();  // keeps samples 0, 2, 4, … and doubles the spacing

  size_t capacity_;
  double spacing_s_;
  std::vector<double> t_;
  std::map<std::string, std::vector<double>> series_;  // NaN where absent; each as long as t_
};

}  // namespace dloco
