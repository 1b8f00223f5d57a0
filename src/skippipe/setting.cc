// Parsing and validation of the SkipPipe setting (setting.h). Every field of a file from outside is checked here,
// once, so the simulators can rely on DLOCO_CHECK for what a valid setting guarantees.
#include "skippipe/setting.h"

#include <limits>
#include <map>

#include "core/check.h"
#include "process/json_file.h"
#include "skippipe/json_fields.h"

namespace dloco::skippipe {

namespace {

constexpr double kHuge = std::numeric_limits<double>::max();
// The longest time a setting may give one hop or one forward: a million seconds (11.6 days). Larger figures are
// typos or hostile, and would overflow the simulators' clocks and the nodes' emulated waits.
constexpr double kMaxSeconds = 1e6;
constexpr int64_t kMaxNodes = 100000;

Link parse_link(JsonObject& o) {
  Link link;
  link.latency_s = o.number("latency_s", 0.0, kMaxSeconds);
  link.bandwidth_bytes_per_s = o.number("bandwidth_bytes_per_s", std::numeric_limits<double>::min(), kHuge);
  return link;
}

std::vector<std::string> parse_regions(JsonObject& top, std::map<std::string, int>& index) {
  const nlohmann::json& arr = top.array("regions");
  if (arr.empty()) throw InputError(top.path("regions") + ": at least one region is needed");
  std::vector<std::string> regions;
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string p = top.path("regions") + "[" + std::to_string(i) + "]";
    if (!arr[i].is_string() || arr[i].get<std::string>().empty()) throw InputError(p + ": expected a region name");
    const std::string name = arr[i].get<std::string>();
    if (!index.emplace(name, static_cast<int>(i)).second) throw InputError(p + ": region \"" + name + "\" twice");
    regions.push_back(name);
  }
  return regions;
}

int region_of(const nlohmann::json& v, const std::string& p, const std::map<std::string, int>& index) {
  if (!v.is_string()) throw InputError(p + ": expected a region name");
  const auto it = index.find(v.get<std::string>());
  if (it == index.end()) throw InputError(p + ": \"" + v.get<std::string>() + "\" is not in \"regions\"");
  return it->second;
}

std::vector<Node> parse_nodes(JsonObject& top, const std::map<std::string, int>& index) {
  const nlohmann::json& arr = top.array("nodes");
  if (arr.empty() || static_cast<int64_t>(arr.size()) > kMaxNodes) {
    throw InputError(top.path("nodes") + ": expected 1 to " + std::to_string(kMaxNodes) + " nodes");
  }
  std::vector<Node> nodes;
  for (size_t i = 0; i < arr.size(); ++i) {
    JsonObject o(arr[i], top.path("nodes") + "[" + std::to_string(i) + "]");
    Node n;
    n.region = region_of(o.required("region"), o.path("region"), index);
    n.forward_s = o.number("forward_s", std::numeric_limits<double>::min(), kMaxSeconds);
    o.reject_unknown();
    nodes.push_back(n);
  }
  return nodes;
}

void parse_links(JsonObject& top, const std::map<std::string, int>& index, Setting& s) {
  const size_t r = s.regions.size();
  s.links.assign(r, std::vector<Link>(r, s.default_link));
  std::vector<std::vector<bool>> given(r, std::vector<bool>(r, false));
  const nlohmann::json& arr = top.array("links");
  for (size_t i = 0; i < arr.size(); ++i) {
    JsonObject o(arr[i], top.path("links") + "[" + std::to_string(i) + "]");
    const nlohmann::json& pair = o.required("regions");
    if (!pair.is_array() || pair.size() != 2) throw InputError(o.path("regions") + ": expected [region, region]");
    const int a = region_of(pair[0], o.path("regions") + "[0]", index);
    const int b = region_of(pair[1], o.path("regions") + "[1]", index);
    if (given[a][b]) {
      throw InputError(o.path("regions") + ": the pair " + s.regions[a] + "-" + s.regions[b] + " is given twice");
    }
    const Link link = parse_link(o);
    o.reject_unknown();
    s.links[a][b] = s.links[b][a] = link;
    given[a][b] = given[b][a] = true;
  }
}

}  // namespace

double Setting::hop_s(int from, int to) const {
  DLOCO_CHECK(from >= 0 && from < node_count());
  DLOCO_CHECK(to >= 0 && to < node_count());
  if (from == to) return 0.0;
  const Link& l = links[nodes[from].region][nodes[to].region];
  // Summed in this order, as the reference's delay_map does (latency, then bytes / bandwidth), so the hop costs
  // equal its delays matrix bit for bit.
  return l.latency_s + bytes_per_hop / l.bandwidth_bytes_per_s + hop_overhead_s;
}

Setting parse_setting(const nlohmann::json& j, const std::string& origin) {
  JsonObject top(j, origin);
  check_format(top, "dloco-skippipe-setting");
  Setting s;
  s.source = top.string("source");
  read_notes(top);
  std::map<std::string, int> index;
  s.regions = parse_regions(top, index);
  s.nodes = parse_nodes(top, index);
  JsonObject def(top.required("default_link"), top.path("default_link"));
  s.default_link = parse_link(def);
  def.reject_unknown();
  parse_links(top, index, s);
  s.hop_overhead_s = top.number("hop_overhead_s", 0.0, kMaxSeconds);
  s.bytes_per_hop = top.number("bytes_per_hop", 0.0, kHuge);
  s.memory_capacity = top.integer("memory_capacity", 1, kMaxMemoryCapacity);
  s.backward_factor = top.number("backward_factor", 0.0, 1000.0);
  s.head_factor = top.number("head_factor", 0.0, 1000.0);
  top.reject_unknown();
  for (size_t a = 0; a < s.regions.size(); ++a) {
    for (size_t b = 0; b < s.regions.size(); ++b) {
      const Link& l = s.links[a][b];
      const double hop = l.latency_s + s.bytes_per_hop / l.bandwidth_bytes_per_s + s.hop_overhead_s;
      if (!(hop <= kMaxSeconds)) {
        throw InputError(origin + ": a hop from " + s.regions[a] + " to " + s.regions[b] + " takes " +
                         std::to_string(hop) + " s (latency + bytes_per_hop / bandwidth + hop_overhead_s): at most " +
                         std::to_string(kMaxSeconds) + " s");
      }
    }
  }
  return s;
}

Setting load_setting(const std::string& path) { return parse_setting(read_json_file(path), path); }

}  // namespace dloco::skippipe
