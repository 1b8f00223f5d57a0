// What the chaos analyses (chaos/chaos_report.cc, baselines/chaos_report.cc) share: reading a role's JSONL event
// log (a line cut off by a SIGKILL is skipped and counted), the event's name and time, the trimmed mean step interval
// and the final loss of the launcher's report. Internal to src/chaos and src/baselines.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chaos/chaos_report.h"

namespace dloco::chaos_detail {

/// Every event of the log at `path` (in file order); a missing log throws InputError when `required`, else is
/// empty. Torn lines are skipped and added to *torn.
std::vector<nlohmann::json> read_log(const std::filesystem::path& path, bool required, int64_t* torn);
std::string name(const nlohmann::json& e);
double time_of(const nlohmann::json& e);
double median(std::vector<double> v);
/// Mean of the intervals no longer than 3× their median: a step's time while training, without the intervals
/// that contain a pause, a restart or a wait.
double trimmed_mean(const std::vector<double>& v);
/// The final loss, from the launcher's report; a missing or non-finite one fails the NaN check.
void read_final_loss(const std::filesystem::path& run_dir, ChaosAnalysis& a);

}  // namespace dloco::chaos_detail
