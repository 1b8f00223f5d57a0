// Merge math of the syncer (docs/protocol.md §4 steps 4–7, §6): outer gradients, token weights,
// radial-directional averaging (RDA), the weighted mean, and the Nesterov outer step.
//
// Buffers are flat fp32 spans of one fragment (or one block of it); all norms and accumulations are done in
// double so the result does not depend on the number of learners' rounding. Deliberately not here: I/O,
// threads, compression (the syncer decodes bf16/int4 into fp32 before calling these).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/fragments.h"

namespace dloco {

/// How the outer gradients of one fragment are combined.
enum class MergeRule {
  kRda,   // radial-directional averaging per block (docs/protocol.md §6); the embedding still uses the weighted mean
  kMean,  // plain token-weighted mean everywhere (ablation baseline)
};

/// "quantity × quality" weight of one contribution (docs/protocol.md §4 step 5): tokens² / steps, or 0 if steps == 0.
/// tokens and steps are the learner's counters since it last received the fragment. Throws InputError if either
/// is negative.
double token_weight(int64_t tokens, int64_t steps);

/// Divides weights by their sum so they sum to 1. Throws InputError if the span is empty, any weight is negative
/// or not finite, or all weights are zero. Choice (the paper is silent): all-zero weights mean no participant trained on
/// the fragment since it last received it, so there is nothing to merge; the caller skips the round instead of
/// guessing a uniform fallback (use merge_has_weight() to test first).
std::vector<double> normalise_weights(std::span<const double> weights);

/// True when at least one weight is > 0 (the round has something to merge).
bool merge_has_weight(std::span<const double> weights);

/// out = Σ w_m·v_m / Σ w_m, elementwise. v: M vectors of n elements each; w: M weights (need not be normalised,
/// ≥ 0, Σ > 0); out: n elements (may not alias v). Throws InputError if M == 0, sizes differ, or the weights are
/// invalid as in normalise_weights. n == 0 is allowed (nothing to do).
void weighted_mean(std::span<const std::span<const float>> v, std::span<const double> w, std::span<float> out);

/// Radial-directional average (docs/protocol.md §6):
///   RDA({v_m, w_m}) = (Σ w_m‖v_m‖ / Σ w_m) · φ(Σ w_m φ(v_m) / Σ w_m),  φ(x) = x/‖x‖, φ(0) = 0,
/// with ‖·‖ the L2 norm over the whole span. If the weighted mean direction has norm < 1e-12 (all inputs zero,
/// or directions cancel) the result is the weighted mean instead. If every ‖v_m‖ = R the result has norm R.
/// Same shapes and errors as weighted_mean.
void radial_directional_average(std::span<const std::span<const float>> v, std::span<const double> w,
                                std::span<float> out);

/// Merges fragment p (docs/protocol.md §4 step 6). outer_grads: one flat buffer per participant, each the fragment's numel
/// elements in block order; weights: one per participant (≥ 0, Σ > 0); out: fragment numel elements.
/// Per block: RDA with norms taken over that block, unless rule is kMean or is_embedding(tensor name) is true
/// (the token embedding and a tied output head), which use the plain weighted mean.
/// Throws InputError if p is out of range, the counts or sizes do not match, or the weights are invalid.
void merge_fragment(const FragmentLayout& layout, int p, const std::vector<std::span<const float>>& outer_grads,
                    std::span<const double> weights, MergeRule rule,
                    const std::function<bool(const std::string& tensor_name)>& is_embedding, std::span<float> out);

/// The all-reduce form of the weighted mean, used by the baselines (docs/protocol.md §11): each worker m writes
///   buffer = [w_m·Δ_m (n values), w_m]
/// and the element-wise sum of the M buffers, given to mean_from_weighted_sums(), is Σ w_m·Δ_m / Σ w_m: the same
/// outer gradient as weighted_mean() over the M inputs, but computed without any worker seeing another's Δ.
/// delta: n elements; buffer: n + 1 elements. Throws InputError on a size mismatch or a negative or non-finite
/// weight.
void weighted_sum_contribution(std::span<const float> delta, double weight, std::span<float> buffer);

/// out = buffer[0..n) / buffer[n] (see weighted_sum_contribution). Returns false and leaves out untouched when the
/// summed weight buffer[n] is 0 (no worker trained on the fragment: nothing to merge). out: n = buffer.size() − 1
/// elements (InputError otherwise).
bool mean_from_weighted_sums(std::span<const float> buffer, std::span<float> out);

/// Outer gradient of one learner (docs/protocol.md §4 step 4): delta = global − local (Θ_p − θ_{m,p}), elementwise.
/// Sign convention: the outer step subtracts η·Δ, so a learner that moved θ toward a target moves Θ toward it.
/// All three spans have the same size n (InputError otherwise); delta may alias either input.
void outer_gradient(std::span<const float> global, std::span<const float> local, std::span<float> delta);

/// Nesterov outer step (docs/protocol.md §4 step 7), elementwise, in place:
///   v ← μ·v + Δ ;  Θ ← Θ − η·(Δ + μ·v)
/// theta: Θ_p (n), v: the fragment's momentum buffer (n, starts at 0), delta: merged outer gradient Δ_p (n);
/// lr = η (DiLoCo: 0.7), mu = μ (0.9). Throws InputError on a size mismatch or a non-finite lr/mu.
void nesterov_outer_step(std::span<float> theta, std::span<float> v, std::span<const float> delta, float lr,
                         float mu);

/// L2 norm of a span, accumulated in double.
double l2_norm(std::span<const float> x);

}  // namespace dloco
