// One rank's share of a learner that is a group of R ranks (docs/parallel.md "A learner of many ranks"): the
// model state this rank holds and the inner step it takes part in, for one of the group kinds a [parallel]
// section describes (core/config.h ParallelConfig):
//   tensor = t    Megatron tensor parallelism (parallel/tp_gpt.h), AdamW on each rank's shards
//   data = d      data parallelism inside the learner: each rank B/d sequences of every micro-batch, gradients
//                 averaged over d; zero = 0 replicated AdamW (one all-reduce of the flat gradient), 1/2/3 ZeRO
//                 (parallel/zero.h)
//   pipeline = p  pipeline stages (parallel/pipeline_stage.h) with the configured schedule and micro-batches,
//                 AdamW on each stage's parameters
//   skippipe_schedule  a SkipPipe pipeline (skippipe/engine.cc): one rank per node of the setting,
//                 micro-batches on the schedule's paths, each stage averaged over its visits and replicas
// Every kind reproduces train/trainer.cc's step: the lr given, global-norm clipping at train.grad_clip over the
// whole model, the non-finite guard (the same skip decision on every rank), weight decay on matrices only.
// Parameters are addressed by their full-model names ("wte.weight", "h.0.attn.qkv.weight", …), so the fragment
// layout of a one-process learner applies unchanged.
// Deliberately not here: which step to run and when (learner/group_inner_job.h drives the ranks), the data
// stream, the network to the syncer.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>

#include "collective/process_group.h"
#include "core/config.h"
#include "model/gpt.h"

namespace dloco {

class DistributedAdamW;  // parallel/distributed_optimizer.h
class ZeroAdamW;         // parallel/zero.h

/// What one inner step did, the same on every rank of the group.
struct EngineStep {
  double loss = 0;       // mean training loss over the windows, nats/token
  double grad_norm = 0;  // global gradient norm before clipping
  bool skipped = false;  // non-finite loss or gradient: parameters and moments untouched
};

/// One rank's part of a learner group. Every method marked collective must be called by all R ranks in the same
/// order; a CollectiveError leaves the group unusable (the learner stops and is restarted as a whole).
class RankEngine {
 public:
  virtual ~RankEngine() = default;
  /// One AdamW step at learning rate `lr` on `windows` (W, B·(T + 1)) int64, the same on every rank: W =
  /// train.grad_accum windows of B rows of T + 1 tokens (data/stream.h) read as train/trainer.h window_batch reads
  /// them (row r's inputs its tokens [0, T), targets [1, T + 1)). Collective; throws CollectiveError.
  virtual EngineStep step(const torch::Tensor& windows, double lr) = 0;
  /// The full parameter `name` (its full-model shape) on rank 0 of the group, undefined on the others.
  /// Collective; throws InputError for an unknown name, CollectiveError.
  virtual torch::Tensor gather_parameter(const std::string& name) = 0;
  /// Overwrites this rank's part of parameter `name` with `full` (full shape, the same on every rank), in place:
  /// the optimizer keeps its moments. Local; throws InputError for an unknown name or another shape.
  virtual void set_parameter(const std::string& name, const torch::Tensor& full) = 0;
  /// This rank's optimizer state to `file` (torch::save, not atomic: the caller renames), and back. load_state
  /// throws InputError when the file does not fit this rank (another group layout or model).
  virtual void save_state(const std::filesystem::path& file) = 0;
  virtual void load_state(const std::filesystem::path& file) = 0;
  /// Fresh optimizer state (zero moments, step count 0) on this rank: after a restore that failed on some rank,
  /// every rank resets so that replicas stay identical. Local.
  virtual void reset_state() = 0;
  /// The dp baseline over learner groups (docs/parallel.md "Baselines over learner groups"): `replicas` joins this
  /// rank with the same rank of every other learner (world = the learners, every learner the same group kind). From
  /// the next step on, the loss and this rank's gradients (after the group's own reduction) are averaged over it
  /// before clipping and the guard, so every learner takes the same step: one process's dp hook (baselines/dp.h)
  /// for a rank. Null: none. The collective must outlive the engine's steps; its failure throws CollectiveError.
  virtual void set_replicas(Collective* replicas) { replicas_ = replicas; }
  /// Whether set_replicas gave it one: its steps then wait for the other learners (no adaptive step deadline).
  bool has_replicas() const { return replicas_ != nullptr; }
  /// "tensor-parallel t = 2", "ZeRO-2 over d = 2", … for logs and events.
  virtual std::string describe() const = 0;
  /// Compares the tensors this rank holds with its replicas' (issue 30 item 6): FNV-1a 64 of each tensor's bytes,
  /// all-gathered over the engine's replica groups — the data-parallel replicas (every tensor they hold: the
  /// parameters, the bf16 copy or the fp32 masters; ZeRO-1/2 after their all-gather), and the TP ranks for the
  /// tensors each holds whole (norm gains). Returns "" when every replica holds the same bits, else the first
  /// differing tensor with replica 0's hash and the other's. Kinds with nothing replicated (ZeRO-3 slices) and
  /// kinds not checked yet (SkipPipe) return "" at once. Collective over those groups; throws CollectiveError.
  virtual std::string replica_mismatch() { return ""; }
  /// The deadline of the collectives of the engine's own sub-groups (TP, PP, DP) from now on, s; the caller sets
  /// the group's (parallel/step_deadline.h: tightened around steps). Local.
  virtual void set_step_timeout(double seconds) { (void)seconds; }
  /// The distributed optimizer of a TP/PP group with zero = 1 or bf16 (its memory() for the benchmarks); null for
  /// the other kinds.
  virtual const DistributedAdamW* distributed_optimizer() const { return nullptr; }
  /// The ZeRO optimizer of a data-parallel ZeRO group or a ZeRO-3 × TP group (its memory() for the benchmarks);
  /// null for the other kinds.
  virtual const ZeroAdamW* zero_optimizer() const { return nullptr; }

 protected:
  Collective* replicas_ = nullptr;  // set_replicas
};

/// Builds this rank's engine from a full GPT (the same parameters on every rank: the same seed) for the group
/// `parallel` over `group` (world R = parallel.ranks(), this rank group.rank()). `full` is not kept (its tensors
/// may be taken over: do not use it afterwards). `offload_dir`: where this rank's offloaded AdamW state lives
/// (parallel.offload; a local disk, not tmpfs, for the memory to leave the machine's RAM). Throws InputError when
/// the config does not fit (see ParallelConfig's checks), CollectiveError.
std::unique_ptr<RankEngine> make_rank_engine(GPT full, const ParallelConfig& parallel, const TrainConfig& train,
                                             Collective& group, const std::filesystem::path& offload_dir = {});
/// The same from the model config and the seed of its initial GPT (torch::manual_seed(seed); GPT(model)): a ZeRO-3
/// × TP group (zero = 3, tensor > 1) initialises its slices without ever building the model (sharded
/// initialisation, parallel/sharded_init.h: bitwise the same Θ₀); every other kind builds the GPT and calls the
/// overload above. Throws as that one.
std::unique_ptr<RankEngine> make_rank_engine(const ModelConfig& model, uint64_t seed, const ParallelConfig& parallel,
                                             const TrainConfig& train, Collective& group,
                                             const std::filesystem::path& offload_dir = {});

}  // namespace dloco
