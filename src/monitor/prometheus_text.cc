// The /metrics text; see prometheus_text.h.
#include "monitor/prometheus_text.h"

#include <prometheus/check_names.h>
#include <prometheus/text_serializer.h>

#include "core/check.h"

namespace dloco {

void PrometheusText::add(const std::string& name, bool counter, const std::string& help, double value,
                         const PrometheusLabels& labels) {
  DLOCO_CHECK(prometheus::CheckMetricName(name) && "a Prometheus metric name");
  prometheus::ClientMetric sample;
  for (const auto& [label, label_value] : labels) {
    DLOCO_CHECK(prometheus::CheckLabelName(label) && "a Prometheus label name");
    sample.label.push_back({label, label_value});
  }
  if (counter) {
    sample.counter.value = value;
  } else {
    sample.gauge.value = value;
  }
  const prometheus::MetricType type = counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge;
  auto [it, inserted] = index_.try_emplace(name, families_.size());
  if (inserted) families_.push_back(prometheus::MetricFamily{name, help, type, {}});
  prometheus::MetricFamily& family = families_[it->second];
  DLOCO_CHECK(family.type == type && "one metric name, one type");
  family.metric.push_back(std::move(sample));
}

void PrometheusText::counter(const std::string& name, const std::string& help, double value,
                             const PrometheusLabels& labels) {
  DLOCO_CHECK(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0 && "counters end in _total");
  add(name, true, help, value, labels);
}

void PrometheusText::gauge(const std::string& name, const std::string& help, double value,
                           const PrometheusLabels& labels) {
  add(name, false, help, value, labels);
}

std::string PrometheusText::str() const { return prometheus::TextSerializer().Serialize(families_); }

}  // namespace dloco
