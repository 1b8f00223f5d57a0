// The /metrics page of a role: samples collected per scrape, rendered in the Prometheus text exposition format 0.0.4
// by prometheus-cpp-core's TextSerializer (Debian prometheus-cpp-dev; no server of its own: the page is served by
// monitor/monitor_server.h). A metric is a name, a type (counter or gauge), a help line and samples with labels.
// Names follow the conventions: the `dloco_` prefix, base units in the name (`_seconds`, `_bytes`), `_total` on
// counters; labels are learner and fragment ids and reasons, never a step (an unbounded label set). No I/O.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/metric_family.h>

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
  /// The exposition text, metrics in the order first added, each with one # HELP and # TYPE; NaN renders as Nan,
  /// infinities as +Inf/-Inf, label values escaped (\\, \", \n) — prometheus-cpp's serializer.
  std::string str() const;

 private:
  void add(const std::string& name, bool counter, const std::string& help, double value,
           const PrometheusLabels& labels);
  std::vector<prometheus::MetricFamily> families_;  // in the order first added
  std::map<std::string, size_t> index_;             // name → its family in families_
};

}  // namespace dloco
