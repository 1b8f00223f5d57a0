// Dynamic loss scaling logic; see loss_scaler.h.
#include "parallel/loss_scaler.h"

#include <algorithm>

#include "core/check.h"

namespace dloco {

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.initial_scale) {
  const auto& o = options;
  if (!(o.growth_factor > 1.0)) throw InputError("loss scaler growth_factor must be > 1");
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0)) {
    throw InputError("loss scaler backoff_factor must be in (0, 1)");
  }
  if (o.growth_interval < 1) throw InputError("loss scaler growth_interval must be ≥ 1 step");
  if (!(o.min_scale > 0.0 && o.min_scale <= o.max_scale)) {
    throw InputError("loss scaler bounds need 0 < min_scale ≤ max_scale");
  }
  if (!(o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale)) {
    throw InputError("loss scaler initial_scale must lie in [min_scale, max_scale]");
  }
}

LossScaleDecision LossScaler::update(bool found_non_finite) {
  LossScaleDecision d;
  if (found_non_finite) {
    const double before = scale_;
    scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    clean_steps_ = 0;
    d.step = false;
    d.reason = scale_ < before ? "non-finite gradient: step skipped, scale backed off"
                               : "non-finite gradient: step skipped, scale already at min_scale";
  } else {
    d.step = true;
    d.reason = "clean";
    if (++clean_steps_ >= options_.growth_interval) {
      const double before = scale_;
      scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
      clean_steps_ = 0;
      d.reason = scale_ > before ? "clean: scale grew after " + std::to_string(options_.growth_interval) +
                                       " clean steps"
                                 : "clean: scale already at max_scale";
    }
  }
  d.scale = scale_;
  return d;
}

}  // namespace dloco
