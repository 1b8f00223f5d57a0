// A slowdown the launcher asks a learner or worker for while the run goes on (fault plans: slow_learner), from
// run_dir/control/learner_<slot>.json = {"factor": f, "until_unix": t}, written atomically by the launcher.
#pragma once

#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/json_read.h"
#include "process/json_file.h"

namespace dloco {

/// Reads the control file of one slot; re-reads it only when its modification time changes (one stat per call).
class ControlFile {
 public:
  explicit ControlFile(std::filesystem::path path) : path_(std::move(path)) {}

  /// The slowdown factor in force now: ≥ 1 (1 = none, also when the file is missing, foreign or half-written).
  double slowdown() {
    std::error_code ec;
    const auto mtime = std::filesystem::last_write_time(path_, ec);
    if (!ec && mtime != mtime_) {
      mtime_ = mtime;
      try {
        const nlohmann::json j = read_json_file(path_);
        factor_ = json_number(j.at("factor"), path_.string() + ": factor");
        until_ = json_number(j.at("until_unix"), path_.string() + ": until_unix");
      } catch (const std::exception&) {  // InputError, or nlohmann's out_of_range for a missing key
        factor_ = 1.0;
      }
    }
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    return now < until_ && factor_ > 1.0 ? factor_ : 1.0;
  }

 private:
  std::filesystem::path path_;
  std::filesystem::file_time_type mtime_{};
  double factor_ = 1.0, until_ = 0;
};

}  // namespace dloco
