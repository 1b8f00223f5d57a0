// Answers to operators' questions, computed with the goodput and bandwidth models:
//   - given chips, chip MTBF and a target goodput: which number of learners M reaches it, and which quorum K
//     keeps the global model advancing (uptime) above a target;
//   - given a link: which fragment count P and precision keep compute utilisation above a target.
// Pure functions of their inputs; printing lives in report.h.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/bandwidth.h"
#include "sim/goodput_config.h"

namespace dloco::sim {

/// One candidate M: its simulated goodput and uptime with K = 1, and the largest K whose uptime meets the target.
struct LearnerOption {
  int64_t learners = 1;       // M
  double goodput = 0.0;       // fraction, K = 1
  double uptime = 0.0;        // fraction, K = 1
  int64_t max_quorum = 0;     // largest K ≤ M with uptime ≥ target_uptime (0: none)
  double uptime_at_max_quorum = 0.0;
};

/// The answer: every candidate, and the smallest M meeting the goodput target (0 if none does).
struct LearnerAdvice {
  std::vector<LearnerOption> options;
  int64_t chosen_learners = 0;
  int64_t chosen_quorum = 0;
};

/// Simulates Decoupled DiLoCo for M in `candidates` (each M ≤ slices) on `base` (chips, MTBF and every other
/// knob taken from it). K is searched from M down to 1 by uptime. Cost: one simulation per (M, K) tried.
LearnerAdvice advise_learners(const GoodputConfig& base, const std::vector<int64_t>& candidates,
                              double target_goodput, double target_uptime);

/// One (precision, P) pair and the CU it reaches on the link.
struct LinkOption {
  Precision precision = Precision::kBf16;
  int64_t fragments = 1;
  double cu = 0.0;
  double required_gbps = 0.0;  // bandwidth this pair needs for the target CU
};

/// For each precision in `precisions` (highest fidelity first), the smallest P in `fragment_candidates`
/// (sorted ascending) whose Streaming/Decoupled CU on a `link_gbps` link is ≥ target_cu; precisions that cannot
/// reach it with any candidate are returned with fragments = 0 and the best CU found.
std::vector<LinkOption> advise_link(const BandwidthModel& model, double link_gbps, double target_cu,
                                    const std::vector<Precision>& precisions,
                                    const std::vector<int64_t>& fragment_candidates);

}  // namespace dloco::sim
