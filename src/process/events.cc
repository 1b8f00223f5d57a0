// Structured events as JSON lines, flushed per line.
#include "process/events.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/check.h"

namespace dloco {

const char* to_string(Role role) {
  switch (role) {
    case Role::kSyncer: return "syncer";
    case Role::kLearner: return "learner";
    case Role::kEvaluator: return "evaluator";
    case Role::kLauncher: return "launcher";
  }
  return "unknown";
}

EventLog::EventLog(const std::filesystem::path& path, Role role, int id) : path_(path), role_(to_string(role)), id_(id) {
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) {
    throw InputError("cannot open event log " + path.string() + ": " + std::strerror(errno) +
                     " (does its directory exist?)");
  }
}

EventLog::~EventLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void EventLog::emit(std::string_view event, const nlohmann::json& fields) {
  if (file_ == nullptr) return;
  DLOCO_CHECK(fields.is_object() || fields.is_null());
  const double t =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  nlohmann::ordered_json line;
  line["t"] = t;
  line["role"] = role_;
  line["id"] = id_;
  line["event"] = std::string(event);
  if (fields.is_object()) {
    for (const auto& [key, value] : fields.items()) {
      DLOCO_CHECK(key != "t" && key != "role" && key != "id" && key != "event");
      line[key] = value;
    }
  }
  // Replace invalid UTF-8 rather than throw: an event must never take the process down.
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::fputs(text.c_str(), file_) == EOF || std::fflush(file_) != 0) {
    throw InputError("cannot write event log " + path_.string() + ": " + std::strerror(errno));
  }
}

}  // namespace dloco
