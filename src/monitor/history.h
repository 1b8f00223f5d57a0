// What a live page draws over time: named series (bytes sent, merges, each learner's loss, …) sampled together at
// one clock, kept for the whole run in bounded memory. Samples are kept `spacing` apart; the newest one stands in for
// the interval it opens (replaced by each later sample until it is `spacing` after the one before), so the curves
// always end at the newest values. When `capacity` samples are held, every other one is dropped and the spacing
// doubles, so a run of any length keeps its whole span at roughly uniform resolution.
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
  /// `capacity` ≥ 4 samples (InvariantError otherwise); `min_spacing_s` ≥ 0: the spacing between kept samples (it
  /// doubles each time the history is thinned).
  explicit MetricHistory(size_t capacity = 512, double min_spacing_s = 1.0);

  /// Adds a sample at time `t_s` (seconds, non-decreasing) with `values` by series name; it replaces the newest
  /// sample if that one is less than the spacing after the one before it. Returns false, changing nothing, for a t
  /// earlier than the newest sample's or not finite. Non-finite values are stored as null.
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
