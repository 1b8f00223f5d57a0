// Child processes of a launcher or a learner group: spawned with posix_spawn (no fork handlers run, so it is safe with gRPC or Gloo
// objects in the process), each in its own process group with its share of the cores set in its environment
// before exec (OMP/OpenBLAS threads; README "Threads"), reaped without blocking, stopped with SIGTERM then SIGKILL.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>


namespace dloco {

struct Child {
  std::string role;  // "syncer", "evaluator", "learner 2", "worker 1"
  int learner = -1;  // learner slot or worker rank; -1 for other roles
  pid_t pid = -1;
  bool exited = false;
  int status = 0;    // waitpid status once exited
  std::chrono::steady_clock::time_point died_at{};
  int restarts = 0;
  // Crash loops (a role that fails the same way on every start): its log and events file, the events file's size
  // when it was last started, and how many of its starts in a row failed before its first training step.
  std::filesystem::path log, events;
  std::uintmax_t events_offset = 0;
  int failures_before_progress = 0;
};

/// Exit status a role started by a launcher returns when its launcher was already gone before it could arrange to
/// die with it (see die_with_launcher).
inline constexpr int kLauncherGoneExit = 3;

/// In a process started by spawn() (DLOCO_PARENT_PID in its environment): asks the kernel for SIGTERM when the
/// launcher dies (PR_SET_PDEATHSIG; a role stops cleanly on SIGTERM), so a launcher killed with SIGKILL leaves no
/// process behind. Returns false when the launcher is already gone (the caller exits with kLauncherGoneExit);
/// true otherwise, also when the variable is absent (a role started by hand).
bool die_with_launcher();

/// "exit status 2" / "killed by signal 9" for a waitpid status.
std::string exit_text(int status);

/// Whether a waitpid status is a failure of the process itself: a non-zero exit or a crash signal (SEGV, ABRT, BUS,
/// FPE, ILL). SIGKILL and SIGTERM are not (a fault plan, the OOM killer or the launcher sent them).
bool failed_by_itself(int status);

/// The last non-empty line of a child's log that reads as an error ("error", "Error", "what()", "terminate"), else
/// its last non-empty line, at most 600 bytes of it; "" if the log is empty or missing. Reads at most its last 64 KiB.
std::string last_error_line(const std::filesystem::path& log);

/// Whether `events` (a role's JSON-lines event log) has a training step ({"event":"step"}) after byte `offset`.
bool stepped_since(const std::filesystem::path& events, std::uintmax_t offset);

/// Size of a file in bytes, 0 if it does not exist.
std::uintmax_t file_size_or_zero(const std::filesystem::path& path);

/// Path of the running executable (/proc/self/exe).
std::filesystem::path self_exe();

/// Spawns `<this executable> ARGS...` with stdout and stderr appended to `log`, OMP_NUM_THREADS=1 and
/// OPENBLAS/MKL_NUM_THREADS=`threads` in its environment, in process group `pgroup` (0: a new group led by the
/// child, so the launcher's faults can signal a learner together with the ranks it spawns into it). Returns its
/// pid; throws InputError if it cannot start.
pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, int threads, pid_t pgroup = 0);

/// Marks children that have exited (waitpid with WNOHANG), recording their status and time of death.
void reap(std::vector<Child>& children);

/// Sends SIGTERM to every live child, waits up to `grace` (or until `hurry` returns true), then SIGKILLs and reaps
/// whatever is left.
void stop_children(std::vector<Child>& children, std::chrono::seconds grace,
                   const std::function<bool()>& hurry = {});

}  // namespace dloco
