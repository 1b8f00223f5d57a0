// The sampled history of a live page; see history.h.
#include "monitor/history.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace dloco {

MetricHistory::MetricHistory(size_t capacity, double min_spacing_s) : capacity_(capacity), spacing_s_(min_spacing_s) {
  DLOCO_CHECK(capacity >= 4);
  DLOCO_CHECK(min_spacing_s >= 0 && std::isfinite(min_spacing_s));
}

bool MetricHistory::add(double t_s, const std::map<std::string, double>& values) {
  if (!std::isfinite(t_s) || (!t_.empty() && t_s < t_.back())) return false;
  // The newest sample stands in for the interval it opens: it is replaced until it is `spacing` after the one
  // before, so the curves always end at the newest values.
  const size_t n = t_.size();
  if (n >= 2 && t_[n - 1] - t_[n - 2] < spacing_s_) {
    t_.pop_back();
    for (auto& [name, column] : series_) column.pop_back();
  }
  if (t_.size() >= capacity_) thin();
  constexpr double kAbsent = std::numeric_limits<double>::quiet_NaN();
  for (const auto& [name, value] : values) {
    auto [it, inserted] = series_.try_emplace(name, std::vector<double>(t_.size(), kAbsent));
    it->second.push_back(value);
  }
  t_.push_back(t_s);
  for (auto& [name, column] : series_) {
    if (column.size() < t_.size()) column.push_back(kAbsent);
  }
  return true;
}

void MetricHistory::thin() {
  auto keep_even = [](std::vector<double>& v) {
    size_t n = 0;
    for (size_t i = 0; i < v.size(); i += 2) v[n++] = v[i];
    v.resize(n);
  };
  keep_even(t_);
  for (auto& [name, column] : series_) keep_even(column);
  const double mean = t_.size() > 1 ? (t_.back() - t_.front()) / static_cast<double>(t_.size() - 1) : 0.0;
  spacing_s_ = std::max(2 * spacing_s_, mean);
}

nlohmann::json MetricHistory::to_json() const {
  nlohmann::json series = nlohmann::json::object();
  for (const auto& [name, column] : series_) {
    nlohmann::json values = nlohmann::json::array();
    for (double v : column) values.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr));
    series[name] = std::move(values);
  }
  return {{"t", t_}, {"series", std::move(series)}};
}

}  // namespace dloco
