// The SkipPipe setting (docs/skippipe.md, "Reference numbers"): the nodes, the region each sits in, the
// link table between regions, the bytes one micro-batch hop carries, per-node forward time and the activation
// memory capacity C. It is what a schedule runs on; the reference setting is configs/skippipe/reference_setting.json
// (transcribed from gensyn-ai/skippipe by tools/skippipe_transcribe.py).
//
// File format (JSON; every field required, unknown fields are errors):
//   format "dloco-skippipe-setting", version 1, source (where the figures come from), notes (optional strings)
//   regions               region names, unique
//   nodes                 [{region, forward_s}]: node i's region and its forward time w_i of one micro-batch (s)
//   links                 [{regions: [a, b], latency_s, bandwidth_bytes_per_s}]: symmetric, one entry per pair
//   default_link          {latency_s, bandwidth_bytes_per_s}: a pair in one region, or one missing from links
//   hop_overhead_s        fixed cost added to every hop between two nodes (s)
//   bytes_per_hop         activation (forward) or gradient (backward) bytes one micro-batch hop carries
//   memory_capacity       C: micro-batches whose activations one node holds at once
//   backward_factor       backward time / forward time (the reference: 1.5)
//   head_factor           the head + loss at the data node / its forward time (the reference: 0.25)
// A hop from node x to node y (x != y) costs latency_s + bytes_per_hop / bandwidth_bytes_per_s + hop_overhead_s.
// Deliberately not here: the placement and the paths (schedule.h), link contention (hops are independent).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco::skippipe {

/// One link between two regions.
struct Link {
  double latency_s = 0.0;              // one-way latency charged per hop (the reference charges the full RTT)
  double bandwidth_bytes_per_s = 0.0;  // > 0
};

/// One compute node.
struct Node {
  int region = 0;          // index into Setting::regions
  double forward_s = 0.0;  // w: forward time of one micro-batch on this node's stage (s, > 0)
};

/// The largest memory capacity C (micro-batches' activations one node holds at once) a setting file or
/// `skippipe schedule --memory` may give.
inline constexpr int64_t kMaxMemoryCapacity = 1000000;

/// A heterogeneous network of nodes (see the file header for the format and units).
struct Setting {
  std::string source;                         // where the figures come from
  std::vector<std::string> regions;           // region names
  std::vector<Node> nodes;                    // node id = index
  std::vector<std::vector<Link>> links;       // (R, R) region × region, symmetric; default_link where not given
  Link default_link;
  double hop_overhead_s = 0.0;
  double bytes_per_hop = 0.0;
  int64_t memory_capacity = 0;                // C in [1, kMaxMemoryCapacity]
  double backward_factor = 1.5;
  double head_factor = 0.25;

  int64_t node_count() const { return static_cast<int64_t>(nodes.size()); }
  /// Seconds one micro-batch takes from node `from` to node `to`: 0 when from == to, else latency +
  /// bytes_per_hop / bandwidth + hop_overhead_s. DLOCO_CHECK on node ids out of range.
  double hop_s(int from, int to) const;
};

/// The setting in `j` (the format in the file header); `origin` (a file name) starts every error message.
/// Throws InputError naming the field for a missing, mistyped, out-of-range, duplicate or unknown field.
Setting parse_setting(const nlohmann::json& j, const std::string& origin);
/// parse_setting of the JSON file at `path`; InputError also when the file cannot be read or parsed.
Setting load_setting(const std::string& path);

}  // namespace dloco::skippipe
