// Child processes of a launcher: spawned with posix_spawn (no fork handlers run, so it is safe with gRPC or Gloo
// objects in the process), each in its own process group with its share of the cores set in its environment
// before exec (OMP/OpenBLAS threads, NOTES.md), reaped without blocking, stopped with SIGTERM then SIGKILL.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
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
};

/// Path of the running executable (/proc/self/exe).
std::filesystem::path self_exe();

/// Spawns `<this executable> ARGS...` with stdout and stderr appended to `log`, OMP_NUM_THREADS=1 and
/// OPENBLAS/MKL_NUM_THREADS=`threads` in its environment. Returns its pid; throws InputError if it cannot start.
pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, int threads);

/// Marks children that have exited (waitpid with WNOHANG), recording their status and time of death.
void reap(std::vector<Child>& children);

/// Sends SIGTERM to every live child, waits up to `grace`, then SIGKILLs and reaps whatever is left.
void stop_children(std::vector<Child>& children, std::chrono::seconds grace);

}  // namespace dloco
