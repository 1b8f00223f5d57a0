// Entry points of the learner and evaluator processes (docs/protocol.md "Learner loop").
#pragma once

#include <filesystem>
#include <string>

#include "core/check.h"
#include "core/config.h"
#include "core/state_machine.h"
#include "learner/group_ranks.h"
#include "transport/transport.h"

namespace dloco {

/// A learner's phases (declared; the moves are checked):
///   bootstrapping --holds Θ, a stream and the global step--> training
///   bootstrapping --a signal (asked to leave before it trained)--> stopped
///   training --its budget is spent, or the shared one--> finished (it keeps answering the final flush)
///   finished --it takes over a stream whose learner left (fixed shares, docs/protocol.md §7)--> training
///   training | finished --the syncer stops the run, or a signal (a graceful leave)--> stopped
enum class LearnerPhase { kBootstrapping, kTraining, kFinished, kStopped };
const char* to_string(LearnerPhase phase);
inline constexpr std::array<std::pair<LearnerPhase, LearnerPhase>, 6> kLearnerMoves = {{
    {LearnerPhase::kBootstrapping, LearnerPhase::kTraining},
    {LearnerPhase::kBootstrapping, LearnerPhase::kStopped},
    {LearnerPhase::kTraining, LearnerPhase::kFinished},
    {LearnerPhase::kTraining, LearnerPhase::kStopped},
    {LearnerPhase::kFinished, LearnerPhase::kStopped},
    {LearnerPhase::kFinished, LearnerPhase::kTraining},  // it took over a stream whose learner left (fixed shares)
}};
using LearnerPhaseMachine = StateMachine<LearnerPhase, 6>;

struct LearnerOptions {
  std::string syncer;                  // "host:port"
  int id = 0;                          // learner slot, 0 ≤ id < M
  std::filesystem::path run_dir;       // where its events go (run_dir/events/learner_<id>.jsonl)
  double bootstrap_timeout_s = 120;    // how long to try to reach the syncer before giving up
  GroupOptions group;                  // a learner of R > 1 ranks ([parallel]): how its group meets
};

/// Runs one learner over `transport`: bootstrap from the syncer (blocking, with a deadline), then train without ever waiting on
/// the network until the syncer says stop. Returns the exit code; a refused handshake throws InputError with
/// the syncer's reason.
int run_learner(const Config& config, const LearnerOptions& options, wire::Transport& transport);

/// Runs the evaluator: evaluates consistent snapshots of the global model every train.eval_interval global
/// steps at low priority and reports them to the syncer, until the run is finished. Returns 0 then, or after the
/// syncer did not answer for options.bootstrap_timeout_s when its report is in options.run_dir (it finished and
/// exited between two polls); 1 when it did not answer for that long and left no report.
int run_evaluator(const Config& config, const LearnerOptions& options, wire::Transport& transport);

}  // namespace dloco
