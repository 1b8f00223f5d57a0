// A learner's inner job (docs/protocol.md "Learner loop", steps 1–2): whatever trains the replica between two
// outer syncs: one process holding the whole GPT (learner/gpt_inner_job.h), or a group of ranks with sharded
// state (learner/group_inner_job.h), a SkipPipe pipeline among them (skippipe/engine.cc). The
// outer sync (learner/outer_sync.h) sees only this interface.
// Deliberately not here: the network, the syncer's protocol, LibTorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "data/stream.h"

namespace dloco {

/// What one inner step did.
struct InnerStep {
  double loss = 0;       // mean training loss of the step, nats/token (NaN allowed: a skipped step)
  int64_t tokens = 0;    // tokens consumed (B·T·accum), also when skipped
  bool skipped = false;  // non-finite loss or gradients: parameters and moments untouched
  double grad_norm = 0;  // global gradient norm before clipping (the whole model's, the same on every rank)
};

class InnerJob {
 public:
  virtual ~InnerJob() = default;
  /// Steps 1–2: one inner optimizer step at global step `step` (the lr schedule is global) on the next batch of its
  /// data stream.
  virtual InnerStep step(int64_t step) = 0;
  /// Where its data stream stands: the batch the next step reads.
  virtual StreamCursor cursor() const = 0;
  /// From the next step on, reads `stream` instead (a take-over of a stream whose learner left, docs/protocol.md
  /// §7): parameters and moments are kept.
  virtual void replace_stream(DataStream stream) = 0;
  /// Fragment p of its parameters as fp32, layout.fragments[p].numel values in layout order.
  virtual void read_fragment(int p, std::span<float> out) = 0;
  /// Overwrites fragment p of its parameters in place (the inner optimizer keeps its moments).
  virtual void write_fragment(int p, std::span<const float> values) = 0;
  /// Saves the inner optimizer state under `dir` (atomically: a kill mid-save leaves the previous one).
  virtual void save_state(const std::filesystem::path& dir, int64_t step) = 0;
  /// Restores what save_state wrote; returns the step it was saved at, or −1 when there is none or it is unusable
  /// (`why` says which; empty when there is none).
  virtual int64_t restore_state(const std::filesystem::path& dir, std::string* why) = 0;
  /// Its AdamW moments start fresh at global step `from_step` > 0 while the run's are warm: the lr repeats the run's
  /// warmup over its own first train.warmup_steps steps (LrSchedule::rewarm_from, core/lr_schedule.h). Default (a job
  /// without an lr schedule): nothing.
  virtual void rewarm(int64_t /*from_step*/) {}
  /// Called often (every few ms) while the learner does not train (finished, or waiting in blocking mode): a job
  /// of many ranks keeps them alive within their deadline (learner/group_inner_job.h). Default: nothing.
  virtual void idle() {}
};

}  // namespace dloco
