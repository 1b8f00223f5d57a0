// Structured events: one JSON object per line, one schema for every role (docs/protocol.md: each quorum, grace and
// drop decision is logged with its reason).
//
// Schema: {"t": unix time in seconds (double), "role": "syncer"|"learner"|"evaluator"|"launcher", "id": int,
//          "event": name, ...fields}. Lines are appended and flushed one by one, so a crash loses at most the line
// being written and `tail -f` works. Thread-safe: emit() may be called from any thread.
#pragma once

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dloco {

enum class Role { kSyncer, kLearner, kEvaluator, kLauncher };

/// "syncer", "learner", "evaluator", "launcher".
const char* to_string(Role role);

class EventLog {
 public:
  /// A disabled log: emit() does nothing. Handy in tests and tools.
  EventLog() = default;

  /// Opens `path` for appending (creating it; the directory must exist). Throws InputError naming the path and
  /// the errno text if it cannot be opened.
  EventLog(const std::filesystem::path& path, Role role, int id);

  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  /// Appends {"t", "role", "id", "event", ...fields} as one line and flushes it. `fields` must be a JSON object
  /// (or null for none) and must not use the reserved keys t/role/id/event (InvariantError otherwise: a bug).
  /// A write failure throws InputError naming the path.
  void emit(std::string_view event, const nlohmann::json& fields = nlohmann::json::object());

  bool enabled() const { return file_ != nullptr; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::string role_;
  int id_ = 0;
  std::FILE* file_ = nullptr;
  std::mutex mutex_;
};

}  // namespace dloco
