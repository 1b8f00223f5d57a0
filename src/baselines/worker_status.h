// status.json: the progress record rank 0 of the baselines' workers rewrites (atomically) in the run folder and the
// collective launcher reads for its progress rows and the report. One JSON object:
//   {"format": "dloco-worker-status", "format_version": 1, "mode", "global_step", "tokens_trained", "world",
//    "generation", "tokens_budget", "val_loss" (null before the first eval), "last_eval_step", "loss", "syncs",
//    "tokens_per_s", "wait_s", "eval_s", "bytes_sent", "finished"}
// The launcher and the workers are the same binary, so a status of another version means workers from another
// build: the reader refuses it instead of reading fields whose meaning may have changed. Bump the version when a
// field changes meaning or is removed.
#pragma once

#include <filesystem>

#include <nlohmann/json.hpp>

namespace dloco {

/// Exit status of a baseline's worker, or of a learner group's rank, whose collective failed because a peer died or
/// passed its deadline (the launcher tells these casualties apart from the worker that failed first: only that one
/// is held out of the group).
inline constexpr int kPeerFailedExit = 3;
/// Exit status of a worker whose own learner group failed: one of its ranks was killed or exited other than with
/// kPeerFailedExit (the launcher counts this worker as the failure, as for a worker that died).
inline constexpr int kOwnGroupFailedExit = 4;

inline constexpr const char* kWorkerStatusFormat = "dloco-worker-status";
inline constexpr int kWorkerStatusVersion = 1;

/// `fields` (a JSON object) with "format" and "format_version" of this build added.
nlohmann::json stamp_worker_status(nlohmann::json fields);

/// Reads a status.json: the object, or null when the file does not exist yet or is not JSON (written atomically,
/// so only a missing or foreign file is not). Throws InputError, naming the file and both versions, when it is a
/// JSON object of another format or format version (or none).
nlohmann::json read_worker_status(const std::filesystem::path& file);

/// What each of the M workers' events/worker_<rank>.jsonl says at its last "stopped" record: an array of
/// {"rank", "steps", "syncs", "wait_s", "bytes_sent"} (only "rank" for a worker that never stopped cleanly), bytes
/// including what its learner group's other ranks sent to the other workers (dp over groups). Lines that are not
/// JSON are skipped.
nlohmann::json worker_summaries(const std::filesystem::path& run_dir, int M);

}  // namespace dloco
