// Child processes of a launcher: spawned with posix_spawn (no fork handlers run, so it is safe with gRPC or Gloo
// objects in the process), each in its own process group with its share of the cores set in its environment
// before exec (OMP/OpenBLAS threads, NOTES.md), reaped without blocking, stopped with SIGTERM then SIGKILL.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/config.h"

namespace dloco {

/// What both launchers (decoupled and baselines) set up before starting children.
struct RunFolder {
  int learners = 1;        // M
  int cores = 1;           // cores of this run (run.threads, 0 = all)
  int child_threads = 1;   // BLAS threads per learner or worker: cores / M, at least 1
  std::string config_path; // run_dir/config.toml, the resolved config every child reads
};

/// Fails fast on a missing corpus or a broken tokenizer (here rather than in M children or after training),
/// creates run_dir/logs and run_dir/events and writes the resolved config. Throws InputError naming the problem.
RunFolder prepare_run_folder(const Config& config);

/// The report's common part, after the children have stopped: the newest checkpoint evaluated on the whole
/// validation split and a short sample from it, on all of the run's cores. Returns {"checkpoint", "val_loss",
/// "val_perplexity", "sample"}. Throws InputError if there is no valid checkpoint.
nlohmann::json evaluate_final_checkpoint(const Config& config, int cores);

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
/// OPENBLAS/MKL_NUM_THREADS=`threads` in its environment, in process group `pgroup` (0: a new group led by the
/// child, so the launcher's faults can signal a learner together with the ranks it spawns into it). Returns its
/// pid; throws InputError if it cannot start.
pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, int threads, pid_t pgroup = 0);

/// Marks children that have exited (waitpid with WNOHANG), recording their status and time of death.
void reap(std::vector<Child>& children);

/// Sends SIGTERM to every live child, waits up to `grace`, then SIGKILLs and reaps whatever is left.
void stop_children(std::vector<Child>& children, std::chrono::seconds grace);

}  // namespace dloco
