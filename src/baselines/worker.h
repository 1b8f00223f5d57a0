// Entry point of a baseline's worker process (dp, diloco, streaming over c10d/Gloo); a worker is one process or
// the leader of a learner group of R ranks ([parallel], docs/parallel.md "Baselines over learner groups").
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "baselines/worker_status.h"  // kPeerFailedExit, kOwnGroupFailedExit
#include "core/check.h"
#include "core/config.h"

namespace dloco {

struct WorkerOptions {
  std::filesystem::path run_dir;     // events/worker_<slot>.jsonl; rank 0 also status.json and checkpoints
  int rank = 0;                      // 0 ≤ rank < world
  std::string store;                 // the group's rendezvous, the same for every rank: a c10d FileStore file, or
                                     // tcp://HOST:PORT served by rank 0 (collective/process_group.h)
  std::string hostname = "";         // address Gloo binds; "" = loopback for a file, the route to HOST for tcp://
  // dp with run.recovery = restart | elastic: the group of one generation (the launcher re-forms it after a failure).
  std::vector<int> slots;            // learner slot (data stream) of each rank; world = slots.size(); empty = 0…M−1
  int64_t generation = 0;            // how many times the group was formed before this one
  bool by_hand = false;              // no launcher (e.g. under srun): every worker meets once more after its
                                     // "stopped" event, then rank 0 writes run_dir/report.json (write_worker_report)
  std::filesystem::path resume_from; // checkpoint to start from (dp: model, AdamW, every slot's cursor; diloco and
                                     // streaming: Θ, with each worker's own state beside it); empty = Θ0
};

/// Runs one worker of a baseline (diloco.mode = "dp", "diloco" or "streaming"; docs/protocol.md §11): joins the Gloo group
/// (deadline run.collective_timeout_s), trains its share of the token budget in lock-step with the others and
/// returns 0. Throws InputError on bad set-up; returns kPeerFailedExit when a peer dies or a collective passes its
/// deadline (synchronous training cannot go on without every worker), kOwnGroupFailedExit when one of this
/// worker's own group ranks was killed or failed by itself (at any point: start-up, a step, a checkpoint).
/// dp trains until the whole group's tokens reach train.total_tokens (W = world workers add W·B·T·accum tokens
/// per step), starting from `resume_from` if given; rank 0 checkpoints the model, the AdamW state and every
/// slot's data cursor every train.checkpoint_interval steps. SIGTERM on any rank stops every rank after the same
/// step (the stop is voted in that step's all-reduce) and rank 0 checkpoints it: the elastic launcher's way to
/// re-form the group without losing work. diloco/streaming: a signal is voted in the next merge, every worker stops
/// after the same one and saves its own state (baselines/worker_state.h) beside rank 0's checkpoint of Θ;
/// `resume_from` then names that checkpoint and each worker reads its own state of that step.
int run_worker(const Config& config, const WorkerOptions& options);

}  // namespace dloco
