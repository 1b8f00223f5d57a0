// Shared by the SkipPipe tests: a hand-made setting of nodes in one region, every hop the same cost, built through
// the real parser (skippipe/setting.h) so it is validated like a file.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "skippipe/setting.h"

namespace dloco::testing_support {

/// Node i computes a forward in forward_s[i] seconds (head w/4, backward 1.5·w); every hop costs 0.1 s latency +
/// bytes_per_hop / bandwidth + 0.05 s overhead; memory C = `memory` micro-batches per node. As a setting file's JSON.
inline nlohmann::json one_region_setting_json(const std::vector<double>& forward_s, double bandwidth_bytes_per_s,
                                              int64_t bytes_per_hop, int64_t memory) {
  nlohmann::json nodes = nlohmann::json::array();
  for (double w : forward_s) nodes.push_back({{"region", "A"}, {"forward_s", w}});
  nlohmann::json j = {{"format", "dloco-skippipe-setting"},
                      {"version", 1},
                      {"source", "hand case"},
                      {"regions", {"A"}},
                      {"nodes", nodes},
                      {"links", nlohmann::json::array()},
                      {"default_link", {{"latency_s", 0.1}, {"bandwidth_bytes_per_s", bandwidth_bytes_per_s}}},
                      {"hop_overhead_s", 0.05},
                      {"bytes_per_hop", bytes_per_hop},
                      {"memory_capacity", memory},
                      {"backward_factor", 1.5},
                      {"head_factor", 0.25}};
  return j;
}

/// one_region_setting_json, parsed (validated like a file).
inline skippipe::Setting one_region_setting(const std::vector<double>& forward_s, double bandwidth_bytes_per_s,
                                            int64_t bytes_per_hop, int64_t memory) {
  return skippipe::parse_setting(one_region_setting_json(forward_s, bandwidth_bytes_per_s, bytes_per_hop, memory),
                                 "hand");
}

}  // namespace dloco::testing_support
