// Exact data across kills and restarts (docs/protocol.md §7, "Data streams"): an append-only log per data
// stream of every batch handed to training. A learner records the batch's cursor here, flushed to the kernel,
// *before* the step that trains it; a restarted learner resumes one batch after the last record. So no batch of a
// stream is trained twice or skipped, whatever moment a SIGKILL lands; a batch whose step never reached a merge
// is lost work (reported), never retrained. The log is also the record a chaos run checks afterwards.
// Format (version 1): a header line {"format":"dloco.stream_log","version":1}, then one line per batch:
// {"stream":s,"position":…,"epoch":…,"tokens_served":…,"learner":m,"step":t}. Logs written before the header
// existed (legacy, version 0) are the same records without it: they are read, and appended to as they are
// (a header cannot be put in front of an append-only log). A header naming another format or a newer version is
// refused, never guessed at.
// Durability: write + fflush, no fsync: it survives the death of the process (the fault plans inject), not a
// power cut of the machine.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/stream.h"

namespace dloco {

/// The stream log format this build writes, and the version it reports for a log without a header.
inline constexpr const char* kStreamLogFormat = "dloco.stream_log";
inline constexpr int kStreamLogVersion = 1;
inline constexpr int kStreamLogLegacyVersion = 0;

/// Path of stream s's log in a run folder: run_dir/streams/stream_<s>.jsonl.
std::filesystem::path stream_log_path(const std::filesystem::path& run_dir, int64_t stream);

/// Another live process holds the stream's log (its lease): this process must not train the stream.
class StreamBusy : public InputError {
 public:
  using InputError::InputError;
};

class StreamLog {
 public:
  /// Opens (creating it and its folder) the log at `path` and takes an exclusive lock on it (flock) for as long
  /// as this object lives: on one machine (or a shared file system with working locks) two processes can never
  /// train the same stream, whatever the syncer's view of its leases. The kernel drops the lock when the process
  /// dies. A last line cut off mid-write (the writer was killed) is removed: that batch was never trained. A new
  /// (or empty) log starts with the version-1 header; a legacy log is continued without one.
  /// Throws StreamBusy if another process holds the lock, InputError if the file cannot be opened, its header
  /// names another format or version, or a complete line is not a cursor.
  explicit StreamLog(const std::filesystem::path& path);
  ~StreamLog();
  StreamLog(const StreamLog&) = delete;
  StreamLog& operator=(const StreamLog&) = delete;

  /// Cursor of the last batch taken (the position it was read from), if any.
  const std::optional<StreamCursor>& last_taken() const { return last_; }
  /// Format version of the file: kStreamLogVersion, or kStreamLogLegacyVersion for a log continued without header.
  int version() const { return version_; }
  /// Records that the batch at `cursor` (the stream's cursor before reading it) is about to be trained by
  /// `learner` at its step `step`. Returns once the line is in the kernel. Throws InputError on a write error.
  void take(const StreamCursor& cursor, int learner, int64_t step);

 private:
  void resume();  // reads the locked file: drops a torn line, checks or writes the header, finds last_
  void append_line(const std::string& line);  // line + '\n', flushed to the kernel

  std::filesystem::path path_;
  FILE* file_ = nullptr;
  std::optional<StreamCursor> last_;
  int version_ = kStreamLogVersion;
};

/// One record of a stream log.
struct StreamRecord {
  StreamCursor cursor;
  int learner = -1;
  int64_t step = 0;
};

/// Every complete record of a log, in order (a torn last line is ignored); the header, if any, is not a record.
/// Sets *version (if given) to the file's format version (kStreamLogLegacyVersion without a header). Throws
/// InputError if the file is missing, its header names another format or an unknown version, or a line is
/// malformed.
std::vector<StreamRecord> read_stream_log(const std::filesystem::path& path, int* version = nullptr);

/// Exactly-once check of one stream's log: batches must follow each other by `tokens_per_batch` from
/// tokens_served 0, with no repeat and no gap.
struct ExactDataCheck {
  int64_t batches = 0;     // records
  int64_t duplicates = 0;  // records whose tokens_served did not move forward (a batch taken twice)
  int64_t gaps = 0;        // records that jumped over at least one batch (tokens skipped)
  int64_t skipped_tokens = 0;
  bool ok() const { return duplicates == 0 && gaps == 0; }
};
ExactDataCheck check_stream_log(const std::vector<StreamRecord>& records, int64_t tokens_per_batch);

}  // namespace dloco
