// Pipeline parallelism for the GPT (model/gpt.h; GPipe, Huang et al. 2019; 1F1B and interleaved, Narayanan et al.
// 2021): p ranks, each holding v model chunks; the L blocks are split contiguously over the K = p·v virtual
// stages (virtual stage k = c·p + s is chunk c of stage s). Virtual stage 0 also holds the token embedding wte,
// virtual stage K − 1 the final norm ln_f and the output head. An executor runs one iteration of a schedule
// (parallel/pipeline_schedule.h) with real send/recv of the activations (b, T, C) and their gradients between
// virtual stages, each micro-batch's loss scaled by 1/m, so the gradients equal one process's on the whole batch.
// Tied embeddings (ModelConfig::tie_embeddings) with p > 1: the last stage keeps its own copy of wte as the head;
// after backward the first and last stage exchange their two gradients and both add them (a + b is exact and
// commutative in IEEE arithmetic, so both hold the same sum bitwise; Megatron's embedding-group all-reduce, with
// send/recv so the other stages are not involved), and identical optimizer steps keep the copies identical.
// With a tensor-parallel group in the options (Megatron's TP inside each stage, Narayanan et al. 2021 §2.3), the
// stage's blocks are parallel/tp_gpt.h's TensorParallelBlocks, the embedding is vocabulary-parallel and the head
// computes this rank's (b, T, V/t) logits for the vocab-parallel cross-entropy; activations between stages stay
// whole (b, T, C) (every TP rank of a stage holds them) and go between ranks of the same TP index.
// Deliberately not here: the optimizer (the caller steps its own AdamW over parameters()), data parallelism
// across pipelines, and recovery (a CollectiveError ends the iteration and the group; the caller re-forms it).
// Dimension letters: B batch, m micro-batches, b = B/m micro-batch size, T sequence length, C d_model, V vocab.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "collective/process_group.h"
#include "model/gpt.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/tp_gpt.h"

namespace dloco {

/// Where a rank sits in the pipeline.
struct PipelineStageOptions {
  int stage = 0;                        // s: this rank's stage, 0 … p − 1 (its rank in the pipeline's Collective)
  int stages = 1;                       // p
  int chunks = 1;                       // v model chunks per stage (> 1 only for the interleaved schedule)
  bool checkpoint_activations = false;  // run each block through parallel/activation_checkpoint.h
  TensorParallelGroup* tensor = nullptr;  // t > 1: this stage's TP group (not owned; outlives the stage)
};

/// The first and last block index (half-open [first, last)) of virtual stage k of K over L blocks: the blocks
/// are dealt contiguously, the first L mod K virtual stages getting one more. Throws InputError when K > L.
std::pair<int, int> virtual_stage_blocks(int k, int K, int L);

/// One rank's share of the GPT: for each of its chunks the blocks of that virtual stage, plus wte / ln_f / head
/// where the virtual stage is the first / last. Parameters are copies (built from a full GPT), named as in the
/// full model ("h.<global i>.…", "wte.weight", "ln_f.weight", "lm_head.weight").
class PipelineStage {
 public:
  /// Copies this stage's parameters (and the rotary tables and causal mask) from `full`. Throws InputError on a
  /// bad stage / chunk count or when p·v > L.
  PipelineStage(GPT& full, const PipelineStageOptions& options);

  const PipelineStageOptions& options() const { return options_; }
  const ModelConfig& config() const { return cfg_; }
  /// Every tensor the stage's optimizer steps (includes the last stage's tied copy of wte).
  std::vector<torch::Tensor> parameters() const;
  /// The parameters this stage owns in the full model, by full-model name (the tied copy is not among them).
  std::map<std::string, torch::Tensor> named_parameters() const;
  /// Copies the owned parameters into `full` in place (optimizer state keyed by full's tensors stays valid).
  /// Without a TP group only (a TP stage holds shards: gather them first).
  void write_back(GPT& full) const;
  /// How parameter `name` (an owned one) is split over the TP group: replicated without one.
  ShardSpec shard_spec(const std::string& name) const;
  /// Zeroes the gradients of parameters().
  void zero_grad();
  /// Makes the stage a bf16 compute copy (Megatron's mixed precision, parallel/mixed_precision.h): every tensor of
  /// parameters() and the rotary tables and mask are cast in place (module references stay valid); activations
  /// and their gradients then move between stages in bf16 and the loss stays fp32. Build the optimizer that keeps
  /// the fp32 masters from the fp32 parameters first (parallel/distributed_optimizer.h casts them itself).
  void to_bf16();
  /// The dtype of the activations: fp32, or bf16 after to_bf16().
  torch::ScalarType dtype() const { return cos_.scalar_type(); }

  /// Virtual stage k = c·p + s, forward of its blocks. In: idx (b, T) int64 when k = 0, else x (b, T, C).
  /// Out: (b, T, C), or the micro-batch's mean cross-entropy (scalar, nats) against targets (b, T) when k = K − 1.
  torch::Tensor forward_chunk(int chunk, const torch::Tensor& input, const torch::Tensor& targets);

  /// The tied head's copy of wte on the last stage when p > 1 (undefined otherwise); for the gradient exchange.
  torch::Tensor tied_head() const { return tied_head_; }
  /// wte on stage 0 (undefined elsewhere).
  torch::Tensor embedding() const { return wte_; }
  bool first_stage() const { return options_.stage == 0; }
  bool last_stage() const { return options_.stage == options_.stages - 1; }

 private:
  torch::Tensor run_blocks(int chunk, torch::Tensor x);

  ModelConfig cfg_;
  PipelineStageOptions options_;
  std::vector<std::vector<std::pair<int, Block>>> chunks_;  // (v) lists of (global block index, block)
  std::vector<std::vector<std::pair<int, TensorParallelBlock>>> tp_chunks_;  // the same with a TP group
  VocabParallelEmbedding tp_wte_{nullptr};  // stage 0 with a TP group; wte_ is its weight (V/t, C)
  std::map<std::string, ShardSpec> specs_;  // the sharded parameters with a TP group (the rest are replicated)
  torch::Tensor wte_;         // (V, C) on stage 0 ((V/t, C) with a TP group)
  RMSNorm ln_f_{nullptr};     // gain (C) on the last stage
  torch::Tensor head_;        // (V, C): lm_head, or wte's tied copy (tied_head_), or wte_ itself when p = 1;
                              // (V/t, C) with a TP group
  torch::Tensor tied_head_;   // (V, C) last stage's copy of wte when tied and p > 1 ((V/t, C) with a TP group)
  torch::Tensor cos_, sin_;   // (T, hs/2) rotary tables
  torch::Tensor causal_;      // (T, T) additive causal mask
};

/// What one iteration did on this rank.
struct PipelineIterationStats {
  double loss = 0;                  // mean cross-entropy of the whole batch, nats (broadcast from the last stage)
  int peak_stored_activations = 0;  // most (micro-batch, chunk) activations held at once on this rank
  int64_t bytes_sent = 0;           // bytes this rank sent during the iteration (activations, gradients, tied)
};

/// Runs this rank's actions of `schedule` for one batch: forwards and backwards of the m micro-batches with
/// activations and gradients sent (non-blocking) and received (blocking, with the group's deadline) between
/// neighbouring virtual stages, then the tied-embedding gradient exchange and the loss broadcast. Gradients are
/// accumulated into the stage's parameters' .grad (the caller zeroes them and steps its optimizer).
/// idx, targets: (B, T) int64, the same batch on every rank (only the first / last virtual stage reads them);
/// B % m == 0. Throws InputError on a schedule or batch that does not fit the stage, CollectiveError when a peer
/// fails or a deadline passes.
PipelineIterationStats run_pipeline_iteration(PipelineStage& stage, Collective& group,
                                              const PipelineSchedule& schedule, const torch::Tensor& idx,
                                              const torch::Tensor& targets);

}  // namespace dloco
