// One SkipPipe node as a process (`dloco skippipe node`, started by `dloco skippipe train`; docs/skippipe.md, "Pipeline
// nodes as processes" and "Re-routing around a dead node"): loads the config, setting and schedule, joins the all-nodes
// Collective through a FileStore (<out>/store; after the g-th re-routing the survivors' <out>/store_<g>), builds the
// GPT (torch::manual_seed(run.seed) then GPT(config.model): identical on every node), opens the data nodes' DataStream,
// runs K iterations of SkipPipeNode and writes <out>/node_<i>.json. Torch-free header, so src/apps stays out of
// LibTorch's compile time. Deliberately not here: spawning, checking the other nodes, the table
// (src/skippipe/launcher.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace dloco {

struct SkipNodeOptions {
  std::string config, setting, schedule;  // files (the same for every node)
  int node = 0;                           // this node's id in the setting = its rank
  int64_t iterations = 1;                 // K
  double link_scale = 0;                  // SkipPipeNode::set_link_time_scale (0 = links not emulated)
  double compute_scale = 0;               // SkipPipeNode::set_compute_time_scale (0 = compute not emulated)
  std::filesystem::path out_dir;          // node_<i>.json goes here; the FileStore is <out_dir>/store
  std::string store;                      // "" = that FileStore; or tcp://HOST:PORT, which node 0 serves (nodes on
                                          // several machines; not with reroute: a re-formed group meets in files)
  std::string host;                       // address this node's Gloo binds ("" = collective/process_group.h's default)
  double timeout_s = 60;                  // deadline of the rendezvous and of every receive, send and collective
  bool reroute = false;                   // re-route around a dead node (the parent's notices), else exit 75
  int64_t die_at_iteration = -1;          // tests only: SIGKILL this process at the start of that iteration,
  int64_t die_at_op = -1;                 // or after its operation die_at_op of it (≥ 0)
  int64_t hang_at_iteration = -1;         // tests only: block for ever (until a signal) at the start of it
};

/// Exit status of a node whose peer failed or whose deadline passed (a CollectiveError): the parent tells a node
/// that died of its own fault from one that only saw another die.
inline constexpr int kSkipNodePeerFailedExit = 75;

/// Runs the node to the end and writes <out_dir>/node_<node>.json: {"node", "stage", "iterations": [{"iteration",
/// "wall_s", "loss", "grad_norm", "lr", "skipped", "micro_batches", "peak_held", "bytes_sent", "allreduce_bytes",
/// "link_wait_s", "delayed_messages", "compute_pad_s", "generation", "redone"}], "param_hash" (FNV-1a 64 of its
/// parameters' names and fp32 bytes, in name order, hex), "param_count", "reroutes": [{"generation", "dead",
/// "completed", "redo_iteration"}]}. With options.reroute a peer's death announced by the parent is routed around
/// (docs/skippipe.md "Re-routing around a dead node"). Returns 0, or kSkipNodePeerFailedExit after printing the
/// CollectiveError when a peer failed or a deadline passed and no re-routing followed (no JSON then). Throws
/// InputError on bad input.
int run_skippipe_node(const SkipNodeOptions& options);

}  // namespace dloco
