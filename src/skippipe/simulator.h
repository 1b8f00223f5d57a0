// The SkipPipe iteration-time simulator (docs/skippipe.md, "Scheduling" and "Reference numbers"): how
// long one training iteration of a schedule takes on a setting — from the first injection to the time the last
// micro-batch's backward finishes at its data node — and how busy each node is. Two models:
//   exact      an event-driven model: each node runs one operation at a time, first come first served among the
//              operations it may start; a forward starts only while the node holds fewer than C micro-batches'
//              activations (held from the start of its forward to the end of its backward there), else it waits
//              for a backward there to free a slot. Per micro-batch, in order: forward w at the data node and at
//              every path node, the head + loss (head_factor·w) at the data node, then backward
//              (backward_factor·w) at every path node in reverse and at the data node; each hop between two
//              nodes costs Setting::hop_s. Ties in arrival time go to the earlier micro-batch in the schedule.
//   reference  the reference simulator's model (gensyn-ai/skippipe, schedulers/com_sym.py), quirks included, so the
//              four stored times are reproduced to ~1e-15 (ReferenceQuirks lists them).
// Deliberately not here: link contention (hops never wait for each other), the scheduler (scheduler.h), wall clocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "skippipe/schedule.h"
#include "skippipe/setting.h"

namespace dloco::skippipe {

/// The kind of one operation of a micro-batch at a node (exact model, SimResult::node_ops).
enum class SimOpKind {
  kForward,   // the data node's embedding + stage-0 blocks, or a path node's blocks
  kHead,      // the final norm, the head and the loss at the data node (its backward included)
  kBackward,  // a path node's blocks, or the data node's stage-0 blocks + embedding, backward
};

/// One operation a node ran in the exact model, in the order the node started them.
struct SimOp {
  int micro_batch = 0;                 // index into Schedule::micro_batches (schedule order, not the id)
  SimOpKind kind = SimOpKind::kForward;
  double start_s = 0.0;                // simulated start (s)
};

/// What one simulated iteration measured. Per-node vectors have the setting's node count.
struct SimResult {
  double iteration_time_s = 0.0;   // makespan: when the last backward finished at its data node (s)
  std::vector<double> busy_s;      // per node: seconds of compute (forward, head, backward)
  std::vector<int64_t> forwards;   // per node: forward passes run (a data node counts its own forwards)
  std::vector<int64_t> backwards;  // per node: backward passes run
  std::vector<double> finish_s;    // per micro-batch (schedule order): its last backward's end; NaN if never done
  int64_t completed = 0;           // micro-batches whose backward finished at their data node
  int64_t stranded = 0;            // micro-batches never finished (reference mode only; the exact model throws)
  std::vector<std::vector<SimOp>> node_ops;  // exact mode only (empty in reference mode): per node, the
                                             // operations in the order it started them — a deadlock-free
                                             // execution order for real nodes that block on their inputs
                                             // (skippipe/node.h)
};

/// The reference's quirks (com_sym.py), each a constant there; defaults reproduce the stored times.
struct ReferenceQuirks {
  double memory_retry_s = 0.1;        // a forward without free memory is retried this much later
  double first_window_s = 0.09;       // after processing an injected micro-batch, the node stays busy this long
  double window_s = 0.13;             // ... after any other; arrivals inside the window are postponed to its end
  int64_t passes_per_bucket = 15;     // sweeps over all nodes per integer time bucket
  int64_t buckets = 10000;            // time buckets swept ([0, 10000) s); later work is never done
  double injected_receive_s = 10000;  // the FIFO's second key of an injected micro-batch (received at "10000 s")
  double fresh_threshold_s = 1000;    // a second key above this marks an injected micro-batch (first_window_s)
  int64_t id_modulus = 100;           // a data node holds back a micro-batch while one with id == this id % 100
                                      // that it sent forward has not come back
};

/// The exact event-driven model (file header; spec "Scheduling": collision awareness, memory C). Times in seconds.
/// Also fills SimResult::node_ops (per node, the operations in start order).
/// Throws InputError when the schedule deadlocks (every remaining forward waits for memory that only another
/// waiting micro-batch could free), listing the stuck micro-batches.
SimResult simulate_exact(const Setting& setting, const Schedule& schedule);

/// The reference-compatible model (spec "Reference numbers", the simulator's quirks): com_sym.py's ComNode.send
/// and run_simulation ported step by step, every micro-batch injected at its data node at inject_s (second FIFO key
/// injected_receive_s). Micro-batches the reference would never finish are counted in `stranded` (the reference
/// drops them silently). Throws InputError when a path is empty (the reference cannot run one).
SimResult simulate_reference(const Setting& setting, const Schedule& schedule, const ReferenceQuirks& quirks = {});

/// Simulator mode on the command line.
enum class SimMode { kExact, kReference };
/// "exact" | "reference"; InputError listing both otherwise.
SimMode parse_sim_mode(const std::string& name);
const char* to_string(SimMode mode);
/// simulate_exact or simulate_reference (default quirks).
SimResult simulate(SimMode mode, const Setting& setting, const Schedule& schedule);

}  // namespace dloco::skippipe
