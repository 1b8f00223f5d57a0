// Child processes of a launcher: spawned with posix_spawn (no fork handlers run, so it is safe with gRPC or Gloo
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

/// The report's final evaluation (evaluate_final_checkpoint), or {"checkpoint", "val_loss", "val_perplexity",
/// "sample"} all null with "skipped" saying why: `skip_reason` when not empty (a second signal asked to hurry, the
/// run failed), or no valid checkpoint yet.
nlohmann::json final_evaluation(const Config& config, int cores, const std::string& skip_reason);

/// Why a launcher's report skips its final evaluation: a second signal asked to hurry, or the run failed; "" if not.
std::string final_eval_skip_reason(bool hurry, const std::string& failure);

/// A run's status for its report: "failed" (`failure` not empty: a crash loop, a role that failed), "stopped"
/// (interrupted by a signal or a role that vanished), "incomplete" (it ended below Config::complete_tokens()) or
/// "finished".
std::string run_status(const Config& config, bool interrupted, const std::string& failure, int64_t tokens_trained);

/// Draws run_dir/loss.png with gnuplot (sim::plot, the tool `dloco compare` uses): each learner's (or worker's)
/// training loss per step, and the global model's validation loss at its evaluations ending at the report's final
/// loss. Reads the run's event logs (decoupled: events/learner_<id>.jsonl and evaluator.jsonl; baselines:
/// events/worker_<r>.jsonl; local: events.jsonl). Returns the plot's path, or "" with the reason printed when there is
/// nothing to draw or gnuplot is missing.
std::filesystem::path write_loss_plot(const Config& config, const nlohmann::json& report);

/// The exit status of `dloco train` for a report: 0 finished, 1 failed or stopped without a signal, 3 incomplete,
/// 128 + the signal when one stopped it.
int report_exit_code(const nlohmann::json& report);

}  // namespace dloco
