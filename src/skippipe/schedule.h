// A SkipPipe schedule (docs/skippipe.md, "Structure"): the placement (stage -> nodes) and one path per
// micro-batch (its data node in stage 0, then the nodes of the non-zero stages it visits, in visiting order; the
// loss runs back at the data node and the backward retraces the path). The reference's four stored schedules are
// configs/skippipe/{full_pipeline,dtfm_skip,skippipe_no_collision,skippipe}.json.
//
// File format (JSON; every field required unless marked, unknown fields are errors):
//   format "dloco-skippipe-schedule", version 1, source, method, description (optional), notes (optional)
//   reference_iteration_time_s   (optional) the time the source reports for this schedule (s)
//   placement        [[node, ...], ...]: stage s's nodes; stage 0 holds the data nodes; a node in one stage at most
//   micro_batches    [{id, data_node, path, inject_s}], in injection order:
//     id             a unique integer ≥ 0 (the reference's uniqid; its reference-compatible mode keys on id % 100)
//     data_node      a stage-0 node: it embeds, runs the head + loss and the last backward
//     path           nodes of distinct non-zero stages, in visiting order (any order of stages: swaps allowed)
//     inject_s       when the micro-batch is ready at its data node (s ≥ 0)
// Deliberately not here: how a schedule is found (scheduler.h), the equal-visits rule (a scheduler's constraint; the
// counts are exposed by visits_per_stage / visits_per_node for tests and reports).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "skippipe/setting.h"

namespace dloco::skippipe {

/// One micro-batch's route.
struct MicroBatch {
  int64_t id = 0;          // unique in its schedule
  int data_node = 0;       // stage-0 node where it starts and ends
  std::vector<int> path;   // nodes of the non-zero stages, in forward order
  double inject_s = 0.0;   // ready at the data node (s)
};

/// Placement plus paths (see the file header).
struct Schedule {
  std::string source;
  std::string method;
  std::string description;
  std::optional<double> reference_iteration_time_s;
  std::vector<std::vector<int>> placement;  // stage -> nodes
  std::vector<int> stage_of_node;           // node -> stage, -1 when unplaced (size = the setting's node count)
  std::vector<MicroBatch> micro_batches;
};

/// The schedule in `j`, checked against `setting` (node ids in range, data nodes in stage 0, path nodes placed in
/// distinct non-zero stages). Throws InputError naming the field (e.g. "FILE: micro_batches[4].path[1]").
Schedule parse_schedule(const nlohmann::json& j, const std::string& origin, const Setting& setting);
/// parse_schedule of the JSON file at `path`; InputError also when it cannot be read or parsed.
Schedule load_schedule(const std::string& path, const Setting& setting);

/// Micro-batch visits per stage (stage 0: one per micro-batch, at its data node).
std::vector<int64_t> visits_per_stage(const Schedule& schedule);
/// Micro-batch visits per node (a data node counts the micro-batches it starts).
std::vector<int64_t> visits_per_node(const Schedule& schedule);

}  // namespace dloco::skippipe
