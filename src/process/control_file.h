// A slowdown the launcher asks a learner or worker for while the run goes on (fault plans: slow_learner), from
// run_dir/control/learner_<slot>.json = {"factor": f, "until_unix": t}, written atomically by the launcher.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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
        std::ifstream in(path_);
        const auto j = nlohmann::json::parse(in);
        factor_ = j.at("factor").get<double>();
        until_ = j.at("until_unix").get<double>();
      } catch (const std::exception&) {
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
