// Operator questions: searches over M, K (goodput simulator) and over precision, P (bandwidth model).
#include "sim/advise.h"

#include "core/check.h"
#include "sim/goodput_sim.h"

namespace dloco::sim {

LearnerAdvice advise_learners(const GoodputConfig& base, const std::vector<int64_t>& candidates,
                              double target_goodput, double target_uptime) {
  if (!(target_goodput > 0 && target_goodput <= 1) || !(target_uptime > 0 && target_uptime <= 1)) {
    throw InputError("targets must be fractions in (0, 1], e.g. --target 0.9");
  }
  LearnerAdvice advice;
  for (int64_t m : candidates) {
    if (m > base.slice_count()) continue;  // cannot give every learner a slice
    GoodputConfig c = base;
    c.method = Method::kDecoupled;
    c.learners = m;
    c.quorum = 1;
    const GoodputResult r1 = simulate_goodput(c);
    LearnerOption option{m, r1.goodput, r1.uptime, 0, 0.0};
    for (int64_t k = m; k >= 1; --k) {  // uptime falls as K grows; goodput does not depend on K (docs/sim.md)
      c.quorum = k;
      const double uptime = k == 1 ? r1.uptime : simulate_goodput(c).uptime;
      if (uptime >= target_uptime) {
        option.max_quorum = k;
        option.uptime_at_max_quorum = uptime;
        break;
      }
    }
    advice.options.push_back(option);
    if (advice.chosen_learners == 0 && option.goodput >= target_goodput) {
      advice.chosen_learners = m;
      advice.chosen_quorum = option.max_quorum;
    }
  }
  return advice;
}

std::vector<LinkOption> advise_link(const BandwidthModel& model, double link_gbps, double target_cu,
                                    const std::vector<Precision>& precisions,
                                    const std::vector<int64_t>& fragment_candidates) {
  DLOCO_CHECK(!fragment_candidates.empty());
  std::vector<LinkOption> out;
  for (Precision p : precisions) {
    LinkOption best{p, 0, 0.0, 0.0};
    for (int64_t fragments : fragment_candidates) {
      BandwidthModel m = model;
      m.outer_precision = p;
      m.fragments = fragments;
      if (fragments > m.inner_steps) continue;
      const double cu = compute_utilization(SyncMethod::kStreaming, m, link_gbps);
      if (cu >= target_cu) {
        best = {p, fragments, cu, required_bandwidth(SyncMethod::kStreaming, m, target_cu)};
        break;
      }
      if (cu > best.cu) best = {p, 0, cu, required_bandwidth(SyncMethod::kStreaming, m, target_cu)};
    }
    out.push_back(best);
  }
  return out;
}

}  // namespace dloco::sim
