// A learner that is a group of R ranks (docs/parallel.md "A learner of many ranks"): rank 0, the leader, is the
// learner the syncer sees (it holds the data stream, the link and the outer sync, learner/run_learner.cc); ranks
// 1 … R − 1 only train. The leader drives every rank through commands broadcast over the group's Collective,
// and every command is one collective step of all ranks. First, the leader broadcasts what every rank must agree
// on (the command set's version, the fragment layout's hash, the window shape); a rank whose build or config
// differs stops with the reason. Then:
//   step k        the leader reads train.grad_accum windows from its stream and broadcasts them with the lr of
//                 global step k; every rank runs its RankEngine step (parallel/rank_engine.h)
//   read p        the tensors of fragment p are gathered to the leader's mirror (a full GPT), which the outer
//                 sync reads through the fragment layout as for a one-process learner
//   write p       the mirror takes fragment p (tensors the fragment covers only in part are gathered first), and
//                 each touched tensor is broadcast whole; every rank keeps its part
//   save / restore   every rank writes / reads its own optimizer state (dir/group_<step>_<n>/rank_<r>.pt, a folder
//                 never written before), the leader then writes dir/state.json naming it, so a kill mid-save
//                 leaves the previous one
//   check         every rank compares its tensors with its replicas' (RankEngine::replica_mismatch); a mismatch
//                 stops the group with the first differing tensor and both hashes. Before every save, and at the
//                 next step after request_replica_check() (SIGUSR1 to the leader)
//   keep-alive    while the leader does not train (finished, waiting for the final flush)
//   stop          the ranks exit
// Why a leader rather than each rank syncing its own fragments: the syncer, its protocol, quorum and token
// weights stay exactly as for one-process learners; a fragment's outer gradient is a function of full tensors,
// which no single TP or ZeRO-3 rank holds; and the fragment traffic (Ψ per H steps) is small next to the
// group's own (6Ψ per step, docs/parallel.md).
// Deliberately not here: starting the ranks (learner/run_learner.cc spawns them), the network to the syncer.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>

#include "collective/process_group.h"
#include "core/fragments.h"
#include "core/lr_schedule.h"
#include "learner/inner_job.h"
#include "model/gpt.h"
#include "parallel/rank_engine.h"
#include "parallel/step_deadline.h"

namespace dloco {

/// The leader's inner job (rank 0 of the group). Every method is a collective step of the whole group and throws
/// CollectiveError when a rank died or missed the group's deadline (the learner then stops; it is restarted as
/// a whole group).
class GroupInnerJob final : public InnerJob {
 public:
  /// `mirror`: a full GPT of the model config (its values are overwritten from the ranks before they are read);
  /// `engine` and `group`: rank 0's, already formed; `stream`: the leased stream at its resume cursor;
  /// `timeout_s`: the group's deadline (parallel.timeout_s), which the ranks' wait for a command also has.
  GroupInnerJob(GPT mirror, const FragmentLayout& layout, const TrainConfig& train, LrSchedule schedule,
                DataStream stream, std::unique_ptr<RankEngine> engine, std::unique_ptr<Collective> group,
                double timeout_s);
  /// Tells the ranks to stop (best effort: a group that already failed is left to the ranks' deadlines).
  ~GroupInnerJob() override;

  InnerStep step(int64_t step) override;
  StreamCursor cursor() const override { return stream_.cursor(); }
  void replace_stream(DataStream stream) override { stream_ = std::move(stream); }
  void read_fragment(int p, std::span<float> out) override;
  void write_fragment(int p, std::span<const float> values) override;
  /// dir/group_<step>_<n>/rank_<r>.pt for every rank (n: the first unused), then dir/state.json {"format", "step",
  /// "ranks", "group", "layout", "folder"} atomically, then older group_* folders are removed.
  void save_state(const std::filesystem::path& dir, int64_t step) override;
  /// −1 with `why` when state.json names another group (ranks or kind) or a rank cannot load its file (then every
  /// rank starts with fresh moments, so data-parallel replicas stay identical).
  int64_t restore_state(const std::filesystem::path& dir, std::string* why) override;
  void rewarm(int64_t from_step) override { schedule_.rewarm_from = from_step; }
  /// A keep-alive to the ranks at most every parallel.timeout_s / 4.
  void idle() override;
  /// The replica check (the `check` command): throws CollectiveError naming the first differing tensor, its rank
  /// and both hashes when a replica differs (the job is failed then, as after any failed command). save_state()
  /// runs it first; step() runs it when request_replica_check() was called since the last step.
  void check_replicas();

  const Collective& group() const { return *group_; }

 private:
  void command(int op, double a = 0, double b = 0, const std::string& text = "");
  template <class F>
  auto guarded(F&& f) -> decltype(f());  // marks the group failed when f throws CollectiveError
  FragmentLayout layout_;
  GPT mirror_;
  std::vector<torch::Tensor> mirror_params_;  // in layout order
  TrainConfig train_;
  LrSchedule schedule_;
  DataStream stream_;
  std::unique_ptr<RankEngine> engine_;
  std::unique_ptr<Collective> group_;
  std::chrono::steady_clock::time_point last_command_;
  double keep_alive_s_;
  StepDeadline deadline_;  // of the collectives inside a step; the cap (timeout_s) elsewhere
  bool failed_ = false;
};

/// Asks the group job of this process for a replica check at its next step. Async-signal-safe (a lock-free flag):
/// the leader's SIGUSR1 handler calls it.
void request_replica_check();

/// A rank 1 … R − 1 of a group: answers the leader's commands with `engine` until the leader says stop.
/// Returns the steps it trained. Throws CollectiveError when the leader died or missed the deadline or a replica
/// check found a difference, InputError on a command it does not know (the leader runs another build).
int64_t serve_group_rank(RankEngine& engine, Collective& group, const FragmentLayout& layout,
                         const TrainConfig& train, const ModelConfig& model);

}  // namespace dloco
