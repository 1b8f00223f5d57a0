// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, "Mixed Precision Training" §3.2; the rule of
// PyTorch's GradScaler and Megatron's DynamicGradScaler) as pure logic: the loss is multiplied by a scale S
// before backward so small fp16 gradients do not flush to zero; the gradients are divided by S before the
// optimizer step. After each backward, update(found_non_finite) decides: a gradient with inf/NaN means S was too
// large — skip the step and multiply S by the backoff factor; after `growth_interval` clean steps in a row,
// multiply S by the growth factor. S stays within [min_scale, max_scale].
// Deliberately not here: tensors (the non-finite check and the unscale of a gradient list are in
// parallel/grad_unscale.h, because ATen's _amp_foreach_non_finite_check_and_unscale_ has no CPU kernel in 1.13).
#pragma once

#include <string>

namespace dloco {

/// Settings of the scaler (PyTorch GradScaler's defaults, plus bounds).
struct LossScalerOptions {
  double initial_scale = 65536.0;  // S at the start (2¹⁶)
  double growth_factor = 2.0;      // S ← S · growth after growth_interval clean steps (> 1)
  double backoff_factor = 0.5;     // S ← S · backoff on a non-finite gradient (in (0, 1))
  int growth_interval = 2000;      // clean steps in a row before S grows (≥ 1)
  double min_scale = 1.0;          // S never drops below this (> 0)
  double max_scale = 16777216.0;   // S never grows above this (2²⁴; fp16's largest finite value is 65504)
};

/// What update() decided, and why.
struct LossScaleDecision {
  bool step = true;        // true: apply the optimizer step; false: skip it (gradients had inf/NaN)
  double scale = 0;        // S for the next backward
  std::string reason;      // "clean", "grew after N clean steps", "non-finite gradient: backed off", …
};

/// The dynamic loss-scale state machine. States: (S, clean steps in a row c). Transitions:
///   non-finite gradient: skip, S ← max(S·backoff, min_scale), c ← 0;
///   clean gradient:      step, c ← c + 1; if c = growth_interval then S ← min(S·growth, max_scale), c ← 0.
class LossScaler {
 public:
  /// Throws InputError on options outside the ranges documented in LossScalerOptions, or an initial scale
  /// outside [min_scale, max_scale].
  explicit LossScaler(const LossScalerOptions& options = {});

  /// The scale S to multiply the loss by.
  double scale() const { return scale_; }
  /// Clean steps since the last change of S (or since the last skip).
  int clean_steps() const { return clean_steps_; }

  /// Records the outcome of one backward and returns the decision with the next S. In a group of ranks pass the
  /// group's flag (non_finite_check_and_unscale with the Collective, parallel/grad_unscale.h), never a rank's own:
  /// every rank must take the same decision, or one skips a step its peers apply and their S differ from then on.
  LossScaleDecision update(bool found_non_finite);

 private:
  LossScalerOptions options_;
  double scale_;
  int clean_steps_ = 0;
};

}  // namespace dloco
