// The syncer's screening counters (docs/protocol.md §10) as JSON, for status.json, the metrics and report.json.
#pragma once

#include <nlohmann/json.hpp>

#include "transport/protocol.h"

namespace dloco::wire {

/// {"answers_refused_by_kind": {kind: n}, "reports_refused": n, "answers_clipped": n, "merges_dropped": n}.
inline nlohmann::json screening_json(const StatusReply& s) {
  return {{"answers_refused_by_kind", s.answers_refused_by_kind},
          {"reports_refused", s.reports_refused},
          {"answers_clipped", s.answers_clipped},
          {"merges_dropped", s.merges_dropped}};
}

}  // namespace dloco::wire
