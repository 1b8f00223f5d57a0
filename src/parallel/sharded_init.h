// Sharded initialisation (issue 30 item 3; docs/parallel.md "ZeRO-3 × tensor parallelism"): a ZeRO-3 × TP rank
// builds its slices of the initial model without ever holding the model, and they are bitwise the slices of the
// GPT(cfg) one process builds from the same seed. GPT's constructor draws from torch's default generator twice
// over (model/gpt.cc): first each module's own initialiser in construction order (nn::Embedding's normal,
// nn::Linear's kaiming-uniform), then GPTImpl::init_parameter's normal for every matrix in named_parameters()
// order. The replay: (1) TensorParallelGPT's part-by-part constructor builds each full part exactly as GPT does —
// the same draws — keeps this rank's TP shard and turns it into a placeholder at once; (2) ZeroAdamW, unit by
// unit in that same order, asks for each parameter's values: drawn into one full tensor, cut to the TP shard,
// flattened with its unit and cut to this rank's DP slice. Peak memory: the slices plus one full part (the largest
// of wte, a block, lm_head), its TP shard and the TP part's flat unit buffer.
// Deliberately not here: meta tensors (LibTorch 1.13's nn modules cannot be built on the meta device), a generator
// other than the default one (the nn modules' initialisers take none).
#pragma once

#include <memory>
#include <mutex>

#include "collective/process_group.h"
#include "core/config.h"
#include "parallel/tp_gpt.h"
#include "parallel/zero.h"

namespace dloco {

/// The lock every "seed torch's default generator, then draw a model" path in a process holds (the generator is
/// process-global: threads of one process — the ranks of a test — must not interleave their draws). No collective
/// may run under it (the ranks of a test would wait on each other while one holds it).
std::mutex& torch_generator_lock();

/// torch::manual_seed(seed); GPT(cfg) under torch_generator_lock(): the GPT one process builds from `seed`.
/// Throws InputError for an inconsistent model config.
GPT seeded_gpt(const ModelConfig& cfg, uint64_t seed);

/// This rank's ZeRO-3 × TP optimizer over the GPT(cfg) that torch::manual_seed(seed) would give, built from the
/// seed without materialising more than one full part at a time. `tensor`: the rank's TP group, `data`: the DP
/// group of its TP index; options.stage must be 3. Holds torch_generator_lock() while it draws and leaves the
/// generator where GPT(cfg) would. Local: no collective. Throws InputError for a config that does not fit (tied embeddings, t not dividing
/// heads, SwiGLU width or vocabulary).
std::unique_ptr<ZeroAdamW> make_sharded_zero3(const ModelConfig& cfg, uint64_t seed, TensorParallelGroup& tensor,
                                              Collective& data, const ZeroOptions& options);

}  // namespace dloco
