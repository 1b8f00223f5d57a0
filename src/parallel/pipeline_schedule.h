// Pipeline-parallel schedules as data, and a discrete-event simulation of their timeline.
// A schedule is, for each of p stages (ranks), the ordered list of actions it runs in one iteration: forward or
// backward of micro-batch i on model chunk c. Three schedules:
//   GPipe (Huang et al. 2019): all m forwards, then all m backwards (picotron's AFAB).
//   1F1B (PipeDream-Flush, Narayanan et al. 2021; picotron / DeepSpeed semantics): min(p − rank − 1, m) warm-up
//     forwards, then alternately one forward and one backward, then the remaining backwards.
//   Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021 §2.2): each rank holds v model chunks, rank r chunk c
//     is virtual stage c·p + r; micro-batches go through the chunks in groups of p; needs m % p == 0.
// The simulation runs every stage's list in order with per-action compute times and an optional transfer time
// between stages, and reports the iteration time, the bubble fraction and the peak number of stored activations
// per stage, all counted from the schedule (nothing assumed from formulas).
// Deliberately not here: tensors, communication, the executor (pipeline_stage.h runs these lists for real).
// Symbols: p stages, m micro-batches, v chunks per rank, t_f / t_b forward / backward time of one micro-batch
// through a whole stage (all its chunks).
#pragma once

#include <string>
#include <vector>

namespace dloco {

/// Which pipeline schedule.
enum class PipelineScheduleKind { kGPipe, k1F1B, kInterleaved };

/// Parses "gpipe" | "1f1b" | "interleaved". Throws InputError on anything else.
PipelineScheduleKind parse_pipeline_schedule(const std::string& name);
/// The config name of a schedule ("gpipe", "1f1b", "interleaved").
std::string to_string(PipelineScheduleKind kind);

/// One unit of work of a stage: the forward or the backward of one micro-batch through one of its model chunks.
struct PipelineAction {
  enum class Op { kForward, kBackward };
  Op op = Op::kForward;
  int micro_batch = 0;  // 0 … m − 1
  int chunk = 0;        // 0 … v − 1 (always 0 unless interleaved)

  bool forward() const { return op == Op::kForward; }
  bool operator==(const PipelineAction& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

/// "F3" / "B3", or "F3.1" with the chunk when the schedule has more than one.
std::string to_string(const PipelineAction& action, int chunks = 1);

/// The shape of a schedule.
struct PipelineScheduleSpec {
  PipelineScheduleKind kind = PipelineScheduleKind::k1F1B;
  int stages = 1;         // p ≥ 1
  int micro_batches = 1;  // m ≥ 1 (a multiple of p when interleaved)
  int chunks = 1;         // v ≥ 1 model chunks per stage; must be 1 unless interleaved
};

/// The actions of every stage for one iteration: actions[s] is stage s's list in execution order. A virtual
/// stage (the k-th of p·v pieces of the model) is chunk c of stage s with k = c·p + s.
struct PipelineSchedule {
  PipelineScheduleSpec spec;
  std::vector<std::vector<PipelineAction>> actions;  // (p) lists of 2·m·v actions each
};

/// Builds the schedule. Throws InputError when p < 1, m < 1, v < 1, v > 1 without interleaving, or interleaved
/// with m % p ≠ 0.
PipelineSchedule make_pipeline_schedule(const PipelineScheduleSpec& spec);

/// Checks a (possibly hand-written) schedule: every stage runs the forward and the backward of every
/// (micro-batch, chunk) exactly once and each backward after its forward. Throws InputError naming the stage and
/// the action otherwise. Deadlock freedom is what simulate_pipeline checks.
void validate_pipeline_schedule(const PipelineSchedule& schedule);

/// Compute and transfer times of the simulation, seconds.
struct PipelineTimes {
  double t_forward = 0.05;   // t_f: forward of one micro-batch through a whole stage (a chunk takes t_f / v)
  double t_backward = 0.10;  // t_b: its backward (a chunk takes t_b / v)
  double t_transfer = 0.0;   // sending one activation or gradient to the next / previous virtual stage
};

/// What one simulated iteration looked like.
struct PipelineTimeline {
  double iteration_s = 0;                     // from the first action's start to the last action's end, s
  double bubble_fraction = 0;                 // idle share of p · iteration_s: 1 − Σ busy / (p · iteration_s)
  std::vector<double> busy_s;                 // (p) compute time of each stage, s
  std::vector<int> peak_stored_activations;   // (p) most (micro-batch, chunk) activations held at once
  std::vector<std::vector<double>> start_s;   // (p, 2·m·v) start time of each action in schedule order, s
};

/// Runs the schedule as a deterministic discrete-event simulation. A forward of virtual stage k starts when its
/// stage is free and the forward of virtual stage k − 1 has finished plus t_transfer; a backward of k needs its
/// own forward and the backward of k + 1 (plus t_transfer). Transfers between chunks on the same rank (p = 1)
/// cost nothing. Sends never block (an unbounded mailbox). A stored activation is counted from the end of a
/// forward to the end of its backward. Throws InputError when the schedule is invalid or deadlocks (no stage
/// can make progress), naming the stuck actions; InputError on negative times.
PipelineTimeline simulate_pipeline(const PipelineSchedule& schedule, const PipelineTimes& times);

}  // namespace dloco
