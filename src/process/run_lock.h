// One run folder, one writer: an exclusive lock on RUN_DIR/.lock for as long as the process holding it lives
// (flock(2): the kernel releases it when the process ends, also by SIGKILL). `dloco train` takes it before it
// starts anything, so a second `dloco train --resume` of a run that is still training, or a new run of the same
// name, is refused instead of starting a second syncer that overwrites the first one's state and report. The file
// holds the holder's pid and command line, for the message.
// Deliberately not here: roles started by hand (`dloco syncer`, `dloco learner`): a launcher's children are such
// roles, and they write under the lock their launcher holds.
#pragma once

#include <filesystem>

namespace dloco {

class RunLock {
 public:
  /// Creates `run_dir` if needed and locks it. Throws InputError naming the holder (its pid and command) when
  /// another process holds the lock, or naming the file when it cannot be opened.
  explicit RunLock(const std::filesystem::path& run_dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace dloco
