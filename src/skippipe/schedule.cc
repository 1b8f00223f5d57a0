// Parsing and validation of SkipPipe schedules (schedule.h), and the visit counts of a schedule.
#include "skippipe/schedule.h"

#include <limits>
#include <set>

#include "core/check.h"
#include "process/json_file.h"
#include "skippipe/json_fields.h"

namespace dloco::skippipe {

namespace {

std::string at(const std::string& p, size_t i) { return p + "[" + std::to_string(i) + "]"; }

void parse_placement(JsonObject& top, const Setting& setting, Schedule& s) {
  const nlohmann::json& arr = top.array("placement");
  if (arr.empty()) throw InputError(top.path("placement") + ": at least stage 0 (the data nodes) is needed");
  s.stage_of_node.assign(setting.nodes.size(), -1);
  for (size_t stage = 0; stage < arr.size(); ++stage) {
    const std::string p = at(top.path("placement"), stage);
    if (!arr[stage].is_array() || arr[stage].empty()) throw InputError(p + ": expected a non-empty array of nodes");
    std::vector<int> nodes;
    for (size_t k = 0; k < arr[stage].size(); ++k) {
      const int node = static_cast<int>(json_integer_in(arr[stage][k], at(p, k), 0, setting.node_count() - 1));
      if (s.stage_of_node[node] != -1) {
        throw InputError(at(p, k) + ": node " + std::to_string(node) + " is already in stage " +
                         std::to_string(s.stage_of_node[node]));
      }
      s.stage_of_node[node] = static_cast<int>(stage);
      nodes.push_back(node);
    }
    s.placement.push_back(nodes);
  }
}

MicroBatch parse_micro_batch(JsonObject& o, const Setting& setting, const Schedule& s) {
  MicroBatch mb;
  mb.id = o.integer("id", 0, std::numeric_limits<int64_t>::max());
  mb.data_node = static_cast<int>(o.integer("data_node", 0, setting.node_count() - 1));
  if (s.stage_of_node[mb.data_node] != 0) {
    throw InputError(o.path("data_node") + ": node " + std::to_string(mb.data_node) +
                     " is not in stage 0 (placement[0])");
  }
  const nlohmann::json& path = o.array("path");
  std::set<int> stages;
  for (size_t k = 0; k < path.size(); ++k) {
    const std::string p = at(o.path("path"), k);
    const int node = static_cast<int>(json_integer_in(path[k], p, 0, setting.node_count() - 1));
    const int stage = s.stage_of_node[node];
    if (stage < 0) throw InputError(p + ": node " + std::to_string(node) + " is in no stage of the placement");
    if (stage == 0) throw InputError(p + ": node " + std::to_string(node) + " is in stage 0 (never on a path)");
    if (!stages.insert(stage).second) {
      throw InputError(p + ": node " + std::to_string(node) + " visits stage " + std::to_string(stage) + " again");
    }
    mb.path.push_back(node);
  }
  mb.inject_s = o.number("inject_s", 0.0, 1e9);
  o.reject_unknown();
  return mb;
}

}  // namespace

Schedule parse_schedule(const nlohmann::json& j, const std::string& origin, const Setting& setting) {
  JsonObject top(j, origin);
  check_format(top, "dloco-skippipe-schedule");
  Schedule s;
  s.source = top.string("source");
  s.method = top.string("method");
  if (top.has("description")) s.description = top.string("description");
  read_notes(top);
  if (top.has("reference_iteration_time_s")) {
    s.reference_iteration_time_s = top.number("reference_iteration_time_s", 0.0, 1e12);
  }
  parse_placement(top, setting, s);
  const nlohmann::json& arr = top.array("micro_batches");
  if (arr.empty()) throw InputError(top.path("micro_batches") + ": at least one micro-batch is needed");
  std::set<int64_t> ids;
  for (size_t i = 0; i < arr.size(); ++i) {
    JsonObject o(arr[i], at(top.path("micro_batches"), i));
    s.micro_batches.push_back(parse_micro_batch(o, setting, s));
    if (!ids.insert(s.micro_batches.back().id).second) {
      throw InputError(o.path("id") + ": id " + std::to_string(s.micro_batches.back().id) + " is used twice");
    }
  }
  top.reject_unknown();
  return s;
}

Schedule load_schedule(const std::string& path, const Setting& setting) {
  return parse_schedule(read_json_file(path), path, setting);
}

std::vector<int64_t> visits_per_stage(const Schedule& schedule) {
  std::vector<int64_t> visits(schedule.placement.size(), 0);
  for (const MicroBatch& mb : schedule.micro_batches) {
    ++visits[0];
    for (int node : mb.path) ++visits[schedule.stage_of_node[node]];
  }
  return visits;
}

std::vector<int64_t> visits_per_node(const Schedule& schedule) {
  std::vector<int64_t> visits(schedule.stage_of_node.size(), 0);
  for (const MicroBatch& mb : schedule.micro_batches) {
    ++visits[mb.data_node];
    for (int node : mb.path) ++visits[node];
  }
  return visits;
}

}  // namespace dloco::skippipe
