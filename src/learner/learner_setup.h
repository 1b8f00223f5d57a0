// The learner process's set-up steps (run_learner.cc reads as their sequence): where its data stream resumes, its
// outer sync's settings, its inner job (one process, or rank 0 of a group), its saved AdamW moments, its peer
// server, the bootstrapped event and its /metrics endpoint. Internal to src/learner.
#pragma once

#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include <torch/torch.h>

#include "core/config.h"
#include "core/fragments.h"
#include "data/stream.h"
#include "data/stream_log.h"
#include "learner/bootstrap.h"
#include "learner/inner_job.h"
#include "learner/link.h"
#include "learner/outer_sync.h"
#include "learner/peer.h"
#include "model/gpt.h"
#include "monitor/monitor_server.h"
#include "monitor/prometheus_text.h"
#include "process/events.h"
#include "transport/protocol.h"
#include "transport/transport.h"

namespace dloco {

class GroupRanks;

/// Where the stream resumes (exact data): the stream's own log is at least as new as the syncer's copy of the
/// cursor (which lags by up to a second, or more after a syncer restart). One step's batches after the last record
/// are skipped: they were trained, or lost when the previous incarnation died, but never retrained. `from_log` says
/// which cursor won. Throws InputError when the leased stream is outside [0, S).
DataStream resume_stream(const Config& config, const wire::JoinReply& joined, const StreamLog& log, bool* from_log);

/// The outer sync's settings for learner `id` (H, τ, α, the stale policy, the uplink codec).
OuterSyncConfig outer_sync_config(const Config& config, int id, const FragmentLayout& layout);

/// The inner job: a group of ranks (rank 0 here; `ranks` started the others; nullptr for one process) or the
/// one-process GPT job. Throws InputError, CollectiveError as the group's engine does.
std::unique_ptr<InnerJob> make_inner_job(const Config& config, int id, const std::filesystem::path& run_dir,
                                         GroupRanks* ranks, GPT model, const FragmentLayout& layout,
                                         torch::Device device, DataStream stream, EventLog& events);

/// A restart: resume the AdamW moments of the last incarnation, or say why they are unusable (an event and a line).
/// Returns the step they were saved at, or −1 when none were restored.
int64_t restore_inner_state(InnerJob& job, const std::filesystem::path& run_dir, int id, int64_t global_step,
                            EventLog& events);

/// Restores the saved AdamW moments (train.learner_state_interval > 0); with fresh moments in a warm run (global
/// step > 0) re-warms the lr over train.warmup_steps of its own steps (core/lr_schedule.h, docs/protocol.md §10),
/// and records where in learners/learner_<id>/rewarm.json. Moments saved while that re-warm was still under way
/// (a joiner stopped a few steps after joining) are young: the re-warm continues where it stopped, from global
/// step − (their own steps), instead of the full lr at once.
void restore_or_rewarm(const Config& config, InnerJob& job, const std::filesystem::path& run_dir, int id,
                       int64_t global_step, EventLog& events);

/// diloco.bootstrap = "peers" (else nullptr): serves this learner's copy to joiners, listening where the syncer is reached from (or
/// where run.peer_host says) and advertising an address other machines can dial (never a wildcard, never loopback
/// unless the syncer is on loopback too); the address goes with every join of `link`.
std::unique_ptr<PeerServer> start_peer_server(const Config& config, const std::string& syncer,
                                              wire::Transport& transport, const wire::Handshake& handshake,
                                              FragmentBoard& board, LearnerLink& link, EventLog& events);

/// The "bootstrapped" event and the console line after the bootstrap.
void announce_bootstrapped(int id, const std::string& syncer, const Bootstrapped& boot, bool from_log,
                           const OuterSync& sync, InnerJob& job, const PeerServer* peer_server, EventLog& events);

// What the learner's /metrics endpoint shows (docs/monitoring.md): written by the training thread after each step,
// read by the endpoint's threads.
struct LearnerGauges {
  std::mutex mu;
  int id = 0;
  int64_t step = 0, tokens = 0, merges_applied = 0, lost_steps = 0, reconnects = 0;
  double loss = NAN, tokens_per_s = 0, step_s = 0, boundary_s = 0;

  std::string text() {
    std::lock_guard lock(mu);
    PrometheusText m;
    const PrometheusLabels who = {{"learner", std::to_string(id)}};
    m.gauge("dloco_learner_step", "Inner steps this learner has trained (its step counter).", double(step), who);
    m.counter("dloco_learner_tokens_trained_total", "Tokens this learner served from its stream.", double(tokens), who);
    m.gauge("dloco_learner_loss", "Training loss (EMA), nats/token.", loss, who);
    m.gauge("dloco_learner_tokens_per_second", "Training speed (EMA of the step time), tokens/s.", tokens_per_s, who);
    m.gauge("dloco_learner_step_seconds", "Compute time of the last inner step, s.", step_s, who);
    m.gauge("dloco_learner_boundary_seconds", "Time outside compute after the last step (sync, metadata), s.",
            boundary_s, who);
    m.counter("dloco_learner_merges_applied_total", "Merged fragments applied to this learner's copy.",
              double(merges_applied), who);
    m.counter("dloco_learner_lost_steps_total", "Steps whose work a merge without this learner dropped.",
              double(lost_steps), who);
    m.counter("dloco_learner_reconnects_total", "Sessions re-opened to the syncer.", double(reconnects), who);
    return m.str();
  }
};

/// The learner's /metrics endpoint at run.learner_monitor (docs/monitoring.md), serving `gauges`; nullptr when
/// run.learner_monitor is empty.
std::unique_ptr<MonitorServer> start_learner_monitor(const Config& config, int id, LearnerGauges& gauges,
                                                     EventLog& events);

}  // namespace dloco
