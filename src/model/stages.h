// SkipPipe's stages of a GPT (docs/skippipe.md "Structure" and "Stages"): the L
// blocks cut into S stages of L/S consecutive blocks; stage 0 holds blocks [0, L/S) and also the embedding, the
// final norm and the head, and is never skipped. A stage subset (stage 0 and some others, in increasing order)
// becomes the model's active-block mask (GPTImpl::set_active_blocks): what inference with stages down runs.
// Also the balanced random paths of a training step (every non-zero stage visited equally).
// Deliberately not here: paths that reorder stages, network-aware scheduling (src/skippipe), the pipeline's processes.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dloco {

/// The active-block mask (n_layer entries) of the stage subset `stages` of S stages. Throws InputError unless
/// S ≥ 1 divides n_layer and `stages` is sorted, without repeats, within [0, S) and contains stage 0.
std::vector<bool> stage_blocks(int64_t n_layer, int64_t S, const std::vector<int64_t>& stages);

/// Stage 0 plus a uniformly random sorted subset of stages 1 … S − 1: round(S·(1 − skip)) stages in all, at least
/// stage 0 (the reference's evaluation: 4 of 6 at skip 1/3, 3 of 6 at skip 1/2). Throws InputError for skip
/// outside [0, 1) or S < 1.
std::vector<int64_t> random_stage_subset(int64_t S, double skip, std::mt19937_64& rng);

/// The paths of one step's G micro-batches (docs/skippipe.md "Training with skips"): each is stage 0 plus
/// round(S·(1 − skip)) − 1 other stages in increasing order, and every stage 1 … S − 1 is visited by exactly
/// G·(round(S·(1 − skip)) − 1) / (S − 1) of them — constraint 1 of "Scheduling", enforced: each micro-batch takes
/// the least-visited stages so far, ties broken at random. Throws InputError when that count is not an integer,
/// or for skip outside [0, 1), S < 2 or G < 1.
std::vector<std::vector<int64_t>> balanced_stage_paths(int64_t S, double skip, int64_t G, std::mt19937_64& rng);

/// The stage of block `block` of n_layer blocks in S stages: block / (n_layer / S). S must divide n_layer.
int64_t stage_of_block(int64_t block, int64_t n_layer, int64_t S);

/// "0,2,4" -> {0, 2, 4}. Throws InputError on anything but comma-separated non-negative integers.
std::vector<int64_t> parse_stage_list(const std::string& text);

}  // namespace dloco
