// What one diloco or streaming worker saves so that a stopped run resumes exactly (docs/guide-resume.md): its own
// parameters θ_m, its inner optimizer (through the job's save_state), its data cursor and its outer loop's state
// (baselines/outer_loops.h OuterState: Θ, momentum, versions, counters, the merges in flight already summed).
// Rank 0's checkpoint holds Θ for evaluation; every worker's state sits beside the checkpoints:
//   <run>/worker_state/step_<08d>/slot_<S>/{state.safetensors, inner/}
// written into slot_<S>.tmp and renamed into place, so a worker killed mid-write leaves no slot folder for that step
// and the launcher resumes from an older step whose every slot is complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "baselines/outer_loops.h"
#include "core/config.h"
#include "data/stream.h"
#include "learner/inner_job.h"
#include "train/checkpoint.h"

namespace dloco {

/// The worker's part of a resumable stop, in memory.
struct WorkerState {
  int64_t step = 0;
  StreamCursor cursor;
  std::vector<std::vector<float>> theta_m;  // θ_m by fragment of the layout (fragment p: its numel values)
  OuterState outer;
};

/// The worker's state at `step` (after that step's merges): θ_m read from `replica` fragment by fragment, the cursor
/// given, and outer.state() (which waits for the merges in flight to be summed; CollectiveError if one failed).
WorkerState capture_worker_state(int64_t step, const StreamCursor& cursor, const FragmentLayout& layout,
                                 FragmentReplica& replica, OuterSync& outer);

/// Writes the saved θ_m into `replica`. Throws InputError when it does not fit `layout` (another model or P).
void write_theta_m(const WorkerState& state, const FragmentLayout& layout, FragmentReplica& replica);

/// run_dir/worker_state/step_<08d>/slot_<slot>.
std::filesystem::path worker_state_dir(const std::filesystem::path& run_dir, int64_t step, int slot);

/// Writes `state` and the job's inner optimizer (job.save_state) atomically (see above), then deletes this slot's
/// folders (and any .tmp) of steps before the newest step whose every slot 0 … M − 1 is complete: the one the
/// launcher would resume from stays. Throws InputError when the folder cannot be written.
void save_worker_state(const std::filesystem::path& run_dir, int slot, const WorkerState& state, InnerJob& job,
                       int M);

/// A resume from `step`: deletes the worker states and checkpoints after it (a stop that was not complete), so that
/// what the resumed run writes, evaluates and reports is its own.
void discard_states_after(const std::filesystem::path& run_dir, int64_t step);

/// Reads the state a worker of `slot` saved at `step`. Throws InputError naming the folder when it is missing,
/// written for another step or slot, or damaged.
WorkerState load_worker_state(const std::filesystem::path& run_dir, int64_t step, int slot);

/// Restores the job's inner optimizer from the same folder (job.restore_state). Throws InputError when it has none
/// or one saved at another step.
void restore_inner_state(const std::filesystem::path& run_dir, int64_t step, int slot, InnerJob& job);

/// Whether every slot 0 … M − 1 has a complete state at `step` (what the launcher checks before resuming from it).
bool worker_states_complete(const std::filesystem::path& run_dir, int64_t step, int M);

/// The checkpoint a resumed run of `config` continues from: dp, the newest (rank 0 writes the whole group's state
/// into it); diloco and streaming, the newest whose every worker saved its own state at that step (a worker killed
/// mid-write, or a second Ctrl-C, leaves a step incomplete). Nullopt when there is none.
std::optional<CheckpointInfo> resumable_checkpoint(const Config& config);

}  // namespace dloco
