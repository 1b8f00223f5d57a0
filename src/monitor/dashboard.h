// The live dashboard page a syncer serves at / (issue 15, "Metrics and dashboard"): one self-contained HTML page
// (no external scripts or fonts) that polls /status.json every second and draws the learners' table (step, loss,
// tokens/s, heartbeat age, state; an absent learner highlighted), the quorum and merges, the global model's
// validation-loss curve, goodput and bytes. The page's contract with /status.json is documented in docs/monitoring.md.
#pragma once

#include <string>

namespace dloco {

/// The page's HTML (a constant).
const std::string& dashboard_page();

}  // namespace dloco
