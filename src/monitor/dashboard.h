// The live dashboard page a syncer serves at / (issue 15, "Metrics and dashboard"): one self-contained HTML page
// (no external scripts or fonts) that polls /status.json every second and draws the run's counters (goodput with its
// definition on the page), the learners' table (step, loss, tokens/s, heartbeat age, state; an absent learner
// highlighted) and four charts from the status's history: each learner's training loss with the global model's
// validation loss against the global step, each learner's tokens/s, the syncer's traffic up and down (MB/s), and
// merges, refusals and drops over time. The page's contract with /status.json: docs/monitoring.md.
#pragma once

#include <string>

namespace dloco {

/// The page's HTML (a constant).
const std::string& dashboard_page();

}  // namespace dloco
