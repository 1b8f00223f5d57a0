// Merge math of the syncer (docs/protocol.md §4 steps 4–7, §6). Norms and sums in double.
#include "core/merge.h"

#include <cmath>
#include <string>

#include "core/check.h"

namespace dloco {
namespace {

// Below this norm the mean direction carries no direction (docs/protocol.md §6).
constexpr double kMinDirectionNorm = 1e-12;

void check_weights(std::span<const double> w) {
  if (w.empty()) throw InputError("merge needs at least one weight, got none");
  for (size_t m = 0; m < w.size(); ++m) {
    if (!std::isfinite(w[m]) || w[m] < 0.0) {
      throw InputError("merge weight " + std::to_string(m) + " is " + std::to_string(w[m]) +
                       ": weights must be finite and >= 0");
    }
  }
  if (!merge_has_weight(w)) {
    throw InputError("all " + std::to_string(w.size()) +
                     " merge weights are 0: no participant trained on this fragment; skip the round");
  }
}

// M inputs, M weights, every input and the output of the same size.
void check_merge_shapes(std::span<const std::span<const float>> v, std::span<const double> w, std::span<float> out) {
  if (v.empty()) throw InputError("merge needs at least one outer gradient, got none");
  if (v.size() != w.size()) {
    throw InputError("merge got " + std::to_string(v.size()) + " outer gradients but " + std::to_string(w.size()) +
                     " weights");
  }
  for (size_t m = 0; m < v.size(); ++m) {
    if (v[m].size() != out.size()) {
      throw InputError("outer gradient " + std::to_string(m) + " has " + std::to_string(v[m].size()) +
                       " elements, the output has " + std::to_string(out.size()));
    }
  }
  check_weights(w);
}

double weight_sum(std::span<const double> w) {
  double s = 0.0;
  for (double x : w) s += x;
  return s;
}

// out = Σ w_m·v_m / Σ w_m, shapes already checked.
void weighted_mean_unchecked(std::span<const std::span<const float>> v, std::span<const double> w,
                             std::span<float> out) {
  const double inv_sum = 1.0 / weight_sum(w);
  for (size_t i = 0; i < out.size(); ++i) {
    double acc = 0.0;
    for (size_t m = 0; m < v.size(); ++m) acc += w[m] * static_cast<double>(v[m][i]);
    out[i] = static_cast<float>(acc * inv_sum);
  }
}

}  // namespace

double l2_norm(std::span<const float> x) {
  double s = 0.0;
  for (float e : x) s += static_cast<double>(e) * static_cast<double>(e);
  return std::sqrt(s);
}

double token_weight(int64_t tokens, int64_t steps) {
  if (tokens < 0 || steps < 0) {
    throw InputError("token_weight needs tokens >= 0 and steps >= 0, got tokens = " + std::to_string(tokens) +
                     ", steps = " + std::to_string(steps));
  }
  if (steps == 0) return 0.0;
  const double t = static_cast<double>(tokens);
  return t * t / static_cast<double>(steps);
}

bool merge_has_weight(std::span<const double> weights) {
  for (double x : weights) {
    if (x > 0.0) return true;
  }
  return false;
}

std::vector<double> normalise_weights(std::span<const double> weights) {
  check_weights(weights);
  const double sum = weight_sum(weights);
  std::vector<double> out(weights.begin(), weights.end());
  for (double& x : out) x /= sum;
  return out;
}

void weighted_mean(std::span<const std::span<const float>> v, std::span<const double> w, std::span<float> out) {
  check_merge_shapes(v, w, out);
  weighted_mean_unchecked(v, w, out);
}

void radial_directional_average(std::span<const std::span<const float>> v, std::span<const double> w,
                                std::span<float> out) {
  check_merge_shapes(v, w, out);
  const size_t M = v.size(), n = out.size();
  const double inv_sum = 1.0 / weight_sum(w);

  // 1. Radius: the weighted mean of the norms, R̄ = Σ w_m‖v_m‖ / Σ w_m.
  std::vector<double> norm(M);
  double radius = 0.0;
  for (size_t m = 0; m < M; ++m) {
    norm[m] = l2_norm(v[m]);
    radius += w[m] * norm[m];
  }
  radius *= inv_sum;

  // 2. Direction: d = Σ w_m φ(v_m) / Σ w_m with φ(x) = x/‖x‖, φ(0) = 0 (a zero input adds nothing).
  std::vector<double> scale(M);
  for (size_t m = 0; m < M; ++m) scale[m] = norm[m] > 0.0 ? w[m] * inv_sum / norm[m] : 0.0;
  std::vector<double> direction(n, 0.0);
  double direction_sq = 0.0;
  for (size_t i = 0; i < n; ++i) {
    double acc = 0.0;
    for (size_t m = 0; m < M; ++m) acc += scale[m] * static_cast<double>(v[m][i]);
    direction[i] = acc;
    direction_sq += acc * acc;
  }
  const double direction_norm = std::sqrt(direction_sq);

  // 3. Directions cancel (or all inputs are 0): no direction to take, fall back to the weighted mean.
  if (direction_norm < kMinDirectionNorm) {
    weighted_mean_unchecked(v, w, out);
    return;
  }
  // 4. RDA = R̄ · φ(d).
  const double factor = radius / direction_norm;
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(factor * direction[i]);
}

void merge_fragment(const FragmentLayout& layout, int p, const std::vector<std::span<const float>>& outer_grads,
                    std::span<const double> weights, MergeRule rule,
                    const std::function<bool(const std::string& tensor_name)>& is_embedding, std::span<float> out) {
  if (p < 0 || p >= layout.num_fragments()) {
    throw InputError("merge_fragment: fragment " + std::to_string(p) + " out of range, the layout has " +
                     std::to_string(layout.num_fragments()));
  }
  const Fragment& fragment = layout.fragments[p];
  if (static_cast<int64_t>(out.size()) != fragment.numel) {
    throw InputError("merge_fragment: output has " + std::to_string(out.size()) + " elements, fragment " +
                     std::to_string(p) + " has " + std::to_string(fragment.numel));
  }
  for (size_t m = 0; m < outer_grads.size(); ++m) {
    if (static_cast<int64_t>(outer_grads[m].size()) != fragment.numel) {
      throw InputError("merge_fragment: outer gradient of participant " + std::to_string(m) + " has " +
                       std::to_string(outer_grads[m].size()) + " elements, fragment " + std::to_string(p) + " has " +
                       std::to_string(fragment.numel));
    }
  }
  check_merge_shapes(outer_grads, weights, out);  // counts and weights (sizes checked above)

  // One block at a time: RDA norms are per block (docs/protocol.md §6, §8), the embedding takes the plain mean.
  std::vector<std::span<const float>> block_inputs(outer_grads.size());
  int64_t pos = 0;
  for (const FragmentBlock& b : fragment.blocks) {
    for (size_t m = 0; m < outer_grads.size(); ++m) block_inputs[m] = outer_grads[m].subspan(pos, b.numel);
    std::span<float> block_out = out.subspan(pos, b.numel);
    const bool embedding = is_embedding && is_embedding(layout.tensors[b.tensor_index].name);
    if (rule == MergeRule::kMean || embedding) {
      weighted_mean_unchecked(block_inputs, weights, block_out);
    } else {
      radial_directional_average(block_inputs, weights, block_out);
    }
    pos += b.numel;
  }
  DLOCO_CHECK_EQ(pos, fragment.numel);
}

void outer_gradient(std::span<const float> global, std::span<const float> local, std::span<float> delta) {
  if (global.size() != local.size() || delta.size() != global.size()) {
    throw InputError("outer_gradient: sizes differ (global " + std::to_string(global.size()) + ", local " +
                     std::to_string(local.size()) + ", delta " + std::to_string(delta.size()) + ")");
  }
  // Δ = Θ − θ: positive where the learner moved below the global value.
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = global[i] - local[i];
}

void nesterov_outer_step(std::span<float> theta, std::span<float> v, std::span<const float> delta, float lr,
                         float mu) {
  if (theta.size() != v.size() || delta.size() != theta.size()) {
    throw InputError("nesterov_outer_step: sizes differ (theta " + std::to_string(theta.size()) + ", v " +
                     std::to_string(v.size()) + ", delta " + std::to_string(delta.size()) + ")");
  }
  if (!std::isfinite(lr) || !std::isfinite(mu)) {
    throw InputError("nesterov_outer_step: outer lr and momentum must be finite, got lr = " + std::to_string(lr) +
                     ", mu = " + std::to_string(mu));
  }
  for (size_t i = 0; i < theta.size(); ++i) {
    const double d = delta[i];
    const double velocity = static_cast<double>(mu) * v[i] + d;                       // v ← μ·v + Δ
    v[i] = static_cast<float>(velocity);
    theta[i] = static_cast<float>(theta[i] - static_cast<double>(lr) * (d + mu * velocity));  // Θ ← Θ − η·(Δ + μ·v)
  }
}

void weighted_sum_contribution(std::span<const float> delta, double weight, std::span<float> buffer) {
  if (buffer.size() != delta.size() + 1) {
    throw InputError("weighted_sum_contribution: buffer has " + std::to_string(buffer.size()) + " elements, needs " +
                     std::to_string(delta.size() + 1));
  }
  if (!(weight >= 0) || !std::isfinite(weight)) {
    throw InputError("weighted_sum_contribution: weight must be finite and ≥ 0 (got " + std::to_string(weight) + ")");
  }
  for (size_t i = 0; i < delta.size(); ++i) buffer[i] = static_cast<float>(weight * delta[i]);
  buffer[delta.size()] = static_cast<float>(weight);
}

bool mean_from_weighted_sums(std::span<const float> buffer, std::span<float> out) {
  if (buffer.empty() || out.size() != buffer.size() - 1) {
    throw InputError("mean_from_weighted_sums: out has " + std::to_string(out.size()) + " elements, buffer " +
                     std::to_string(buffer.size()));
  }
  const double total = buffer[out.size()];
  if (!(total > 0)) return false;
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(buffer[i] / total);
  return true;
}

}  // namespace dloco
