// Prometheus text format; see prometheus.h.
#include "core/prometheus.h"

#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace dloco {

namespace {

bool valid_name(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

}  // namespace

void PrometheusText::add(const std::string& name, const char* type, const std::string& help, double value,
                         const PrometheusLabels& labels) {
  DLOCO_CHECK(valid_name(name) && "a Prometheus metric name");
  for (const auto& [label, _] : labels) DLOCO_CHECK(valid_name(label) && label.rfind("__", 0) != 0);
  auto [it, inserted] = metrics_.try_emplace(name, Metric{type, help, {}});
  if (inserted) order_.push_back(name);
  DLOCO_CHECK(it->second.type == type && "one metric name, one type");
  it->second.samples.emplace_back(labels, value);
}

void PrometheusText::counter(const std::string& name, const std::string& help, double value,
                             const PrometheusLabels& labels) {
  DLOCO_CHECK(name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0 && "counters end in _total");
  add(name, "counter", help, value, labels);
}

void PrometheusText::gauge(const std::string& name, const std::string& help, double value,
                           const PrometheusLabels& labels) {
  add(name, "gauge", help, value, labels);
}

std::string PrometheusText::str() const {
  std::string out;
  for (const auto& name : order_) {
    const Metric& m = metrics_.at(name);
    out += "# HELP " + name + " " + m.help + "\n# TYPE " + name + " " + m.type + "\n";
    for (const auto& [labels, value] : m.samples) {
      out += name;
      if (!labels.empty()) {
        out += "{";
        for (size_t i = 0; i < labels.size(); ++i) {
          out += (i ? "," : "") + labels[i].first + "=\"" + escape(labels[i].second) + "\"";
        }
        out += "}";
      }
      out += " " + number(value) + "\n";
    }
  }
  return out;
}

}  // namespace dloco
