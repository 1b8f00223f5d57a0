// Reading the event logs of a run folder; see event_logs.h.
#include "chaos/event_logs.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/check.h"

namespace dloco::chaos_detail {

namespace fs = std::filesystem;

std::vector<nlohmann::json> read_log(const fs::path& path, bool required, int64_t* torn) {
  std::vector<nlohmann::json> out;
  if (!fs::exists(path)) {
    if (required) throw InputError("chaos analysis: " + path.string() + " is missing (is this a decoupled run folder?)");
    return out;
  }
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      // A line cut off by a SIGKILL: at the end of the log, or in its middle once a restarted process appended
      // after it. Skipped (and counted by the caller through `torn`).
      ++*torn;
    }
  }
  return out;
}

std::string name(const nlohmann::json& e) { return e.value("event", ""); }
double time_of(const nlohmann::json& e) { return e.value("t", 0.0); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Mean of the intervals no longer than 3× their median: a step's time while training, without the intervals
// that contain a pause, a restart or a wait (the median alone overstates it when most steps are a bit shorter).
double trimmed_mean(const std::vector<double>& v) {
  const double cut = 3.0 * median(v);
  double sum = 0;
  int n = 0;
  for (double x : v) {
    if (x <= cut) {
      sum += x;
      ++n;
    }
  }
  return n > 0 ? sum / n : 0;
}

// The final loss, from the launcher's report; a missing or non-finite one fails the NaN check.
void read_final_loss(const fs::path& run_dir, ChaosAnalysis& a) {
  if (!fs::exists(run_dir / "report.json")) return;
  const auto report = nlohmann::json::parse(std::ifstream(run_dir / "report.json"), nullptr, false);
  const auto loss = report.find("final_val_loss");
  a.final_val_loss = loss != report.end() && loss->is_number() ? loss->get<double>() : NAN;
  if (!std::isfinite(a.final_val_loss)) a.nan_free = false;
}

}  // namespace dloco::chaos_detail
