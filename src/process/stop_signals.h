// The stop signals of a launcher (`dloco train` in every mode with children). SIGINT (Ctrl-C), SIGTERM, SIGHUP (its
// terminal was closed) and SIGPIPE (the reader of its output went away: `dloco train … | head -3`) all ask for the
// same clean stop: children stopped, the syncer's or rank 0's checkpoint kept, the report written. A second SIGINT,
// SIGTERM or SIGHUP asks to hurry: children are killed at once and the final evaluation is skipped. SIGPIPE never
// counts as the second: every later write to the closed pipe raises it again.
#pragma once

namespace dloco {

/// Installs the handlers for its lifetime (RAII; the previous dispositions come back on destruction). One at a time.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The first stop signal received (SIGINT, SIGTERM, SIGHUP or SIGPIPE), 0 while none.
  static int first();
  /// Whether a second stop signal came after the first (SIGPIPE excluded): hurry.
  static bool hurry();
};

}  // namespace dloco
