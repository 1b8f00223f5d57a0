// Checkpoints: Θ as safetensors (loadable by Python's safetensors/PyTorch) plus a JSON manifest (resolved
// config, global step, fragment versions, tokenizer, data cursors), and optionally the inner optimizer.
// Layout: <run>/checkpoints/step_<08d>/{model.safetensors, optimizer.pt, manifest.json} (step_<08d>_r<03d> for a
// later checkpoint at a step already written: none is replaced). A checkpoint is written
// into <folder>.tmp and renamed into place when complete (each file fsynced, then the folder), so a crash
// mid-write leaves either the previous checkpoint or the new one, never a torn one; loaders skip a folder
// without a valid manifest or whose model file does not match the manifest's size and hash.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <span>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "model/gpt.h"

namespace dloco {

inline constexpr int kCheckpointVersion = 1;

struct CheckpointInfo {
  std::filesystem::path dir;  // .../checkpoints/step_00000500
  int64_t step = 0;
  nlohmann::json manifest;
};

/// Writes a checkpoint of `model` (and `optimizer` when not null) at `step` under run_dir/checkpoints, with
/// `manifest` extended by format, version, step and the model file's size and hash, into step_N (zero-padded to 8
/// digits) or, when that folder exists, the revision after the highest of that step (step_N_r001 … step_N_r999): a
/// checkpoint is never replaced, and the one just written is never pruned.
/// Keeps the newest `keep` checkpoints (in name order) and deletes older ones. Throws InputError if the folder
/// cannot be written (nothing older is deleted then). `extra(tmp_dir, manifest)`, when set, adds files (a learner
/// group's optimizer state) and fields before the manifest is written; every file it adds is recorded with its
/// size and hash under the manifest's "files" and checked like the model file. Returns the checkpoint folder.
std::filesystem::path save_checkpoint(
    const std::filesystem::path& run_dir, int64_t step, GPT& model, torch::optim::Optimizer* optimizer,
    nlohmann::json manifest, int keep = 2,
    const std::function<void(const std::filesystem::path&, nlohmann::json&)>& extra = {});

/// The same without a model object (the syncer holds Θ as flat fragments): writes `tensors` as
/// model.safetensors; `extra(tmp_dir, manifest)`, when set, may add files to the folder and fields to the
/// manifest before it is written. Same guarantees and errors as save_checkpoint.
std::filesystem::path save_checkpoint_files(
    const std::filesystem::path& run_dir, int64_t step, std::span<const SafetensorsEntry> tensors,
    nlohmann::json manifest, const std::function<void(const std::filesystem::path&, nlohmann::json&)>& extra = {},
    int keep = 2);

/// The newest valid checkpoint of a run, or nullopt if none. Invalid or partial folders are skipped.
std::optional<CheckpointInfo> latest_checkpoint(const std::filesystem::path& run_dir);

/// Accepts a run folder (newest checkpoint) or a checkpoint folder. Throws InputError naming the path if
/// there is no valid checkpoint there.
CheckpointInfo resolve_checkpoint(const std::filesystem::path& path);

/// The resolved config saved in the checkpoint's manifest, validated again. Throws InputError if it is missing or
/// no longer valid.
Config checkpoint_config(const CheckpointInfo& checkpoint);

/// Copies the checkpoint's tensors into `model`'s parameters in place. Throws InputError naming the tensor if
/// a parameter is missing or has another shape.
void load_model_weights(const CheckpointInfo& checkpoint, GPT& model);

/// Restores the optimizer state saved with the checkpoint; returns false if there is none.
bool load_optimizer_state(const CheckpointInfo& checkpoint, torch::optim::Optimizer& optimizer);

}  // namespace dloco
