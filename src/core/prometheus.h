// Prometheus text exposition format 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/), written
// by hand: a metric is a name, a type (counter or gauge), a help line and samples with labels. Names follow the
// conventions: the `dloco_` prefix, base units in the name (`_seconds`, `_bytes`), `_total` on counters; labels are
// learner and fragment ids and reasons, never a step (an unbounded label set). Pure: no I/O.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dloco {

/// Label name → value of one sample, e.g. {{"learner", "3"}}.
using PrometheusLabels = std::vector<std::pair<std::string, std::string>>;

/// Collects samples and renders them grouped by metric, each with its # HELP and # TYPE lines once.
class PrometheusText {
 public:
  /// A counter sample (a value that only grows: tokens, merges, bytes). `name` must end in "_total" and match
  /// [a-zA-Z_:][a-zA-Z0-9_:]*; InvariantError otherwise (a bug: names are written in the code).
  void counter(const std::string& name, const std::string& help, double value, const PrometheusLabels& labels = {});
  /// A gauge sample (a value that goes up and down: loss, tokens/s, quorum size).
  void gauge(const std::string& name, const std::string& help, double value, const PrometheusLabels& labels = {});
  /// The exposition text; NaN renders as NaN, infinities as +Inf/-Inf, label values escaped (\\, \", \n).
  std::string str() const;

 private:
  struct Metric {
    std::string type, help;
    std::vector<std::pair<PrometheusLabels, double>> samples;
  };
  void add(const std::string& name, const char* type, const std::string& help, double value,
           const PrometheusLabels& labels);
  std::vector<std::string> order_;  // names in the order first added
  std::map<std::string, Metric> metrics_;
};

}  // namespace dloco
