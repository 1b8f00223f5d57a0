// `dloco skippipe train`: a SkipPipe pipeline as one process per node on this machine (docs/skippipe.md, "Pipeline
// nodes as processes"). Checks every input before any process starts, spawns `<dloco> skippipe node` per node
// (posix_spawn, 1 OMP/BLAS thread each, set in the environment before exec), watches them, and on a node's death
// routes around it (launcher and nodes agree through files in the run folder: docs/skippipe.md "Re-routing around a
// dead node") or, with reroute off or when that is impossible, stops the rest within the deadline and names it;
// at the end prints per iteration the loss, the slowest node's wall time and the exact simulator's iteration time
// scaled by the link scale. Torch-free.
// Deliberately not here: the node itself (skippipe/node_run.h), the re-routed and re-planned schedules
// (skippipe/reroute.h), other machines (the FileStore and the emulated links need one machine).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace dloco {

struct SkipTrainOptions {
  std::string config, setting, schedule;  // files: model/data/train settings; nodes and links; placement and paths
  int64_t iterations = 2;                 // K
  double link_scale = 0;                  // emulated links' time scale (0 = off); also scales the simulator's time
  double compute_scale = 0;               // emulated compute: each operation lasts at least scale · its setting time
  std::filesystem::path out_dir = "skippipe_run";  // node_<i>.json, node_<i>.log, the FileStore
  double timeout_s = 60;                  // deadline of every blocking wait in the nodes, s
  bool reroute = true;                    // a node that dies is routed around (docs/skippipe.md); false: stop
  // Tests only (DLOCO_SKIPPIPE_KILL = node:iteration[:op] / DLOCO_SKIPPIPE_HANG = node:iteration): that node
  // SIGKILLs itself at the start of that iteration (or after its operation op of it), or blocks for ever there.
  int fault_node = -1;
  int64_t fault_iteration = -1;
  int64_t fault_op = -1;                  // DLOCO_SKIPPIPE_KILL's optional third field: after that operation
  bool fault_hangs = false;
};

/// Runs the pipeline to the end and prints the table. Throws InputError on bad input (before any process starts)
/// and std::runtime_error naming the node(s) that failed when the run did not complete (the others stopped).
void run_skippipe_train(const SkipTrainOptions& options);

}  // namespace dloco
