// SkipPipe training on real pipeline nodes (docs/skippipe.md, "Structure", "Scheduling" and "Training with skips";
// issue 13 part 3): one rank per node of a Schedule's placement, all N nodes in one Collective. A node holds its
// stage's blocks (a stage-0 node also the embedding, the final norm and the head, tied as in the GPT), copied from
// a full GPT. One iteration:
//   1. every data node takes its micro-batches' windows from a DataStream (micro-batch i in schedule order =
//      window i; the windows of other data nodes are skipped), runs embedding + stage-0 blocks and sends the
//      activations (b, T, C) to its path's first node; each path node runs its blocks and sends on; the last one
//      returns them to the data node, which runs the final norm, the head and the loss and its backward; the
//      activation gradients (b, T, C) then run the exact reverse path back to the data node;
//   2. each node runs its operations in the order the exact simulator (skippipe/simulator.h, SimResult::node_ops)
//      started them on the schedule's setting: that order is a timeline in which every input was produced before
//      it is consumed, so nodes that block on their inputs in that order cannot deadlock, and a node holds the
//      autograd graphs of at most C (Setting::memory_capacity) micro-batches at once, as in the simulation;
//   3. each stage's gradient = (Σ over its replicas of each replica's sum over the micro-batches it served) / (the
//      stage's visits): one all-reduce over a sub-Collective of the stage's replicas; the global norm over the whole
//      model (each stage counted once) from one all-gather of two doubles over all nodes; the clip
//      (train.grad_clip), the non-finite guard and AdamW (make_inner_adamw, lr from the LrSchedule) on every node.
//      Replicas of a stage then hold bitwise identical parameters.
// Messages between nodes go by (peer, tag), tag = 2·i + direction (i the micro-batch's schedule index, direction 0
// for activations, 1 for their gradients); an operation on the node itself goes through a local mailbox.
// Emulated links (optional, set_link_time_scale): a message is held at its receiver until the simulator's hop time
// (latency + bytes/bandwidth + overhead, scaled) after it was sent; the sender goes on computing at once.
// Emulated compute (optional, set_compute_time_scale): each operation is padded by a sleep to at least its setting
// time, scaled, from when its input arrived.
// Deliberately not here: link contention and rate limits (hops are independent, as in the simulator), real network
// emulation (tc netem), re-routing around a dead node (a CollectiveError ends the iteration; the group is unusable
// afterwards), stage orders other than the schedule's paths, activation checkpointing, bf16, the scheduler.
// Dimension letters: b micro-batch size (train.batch_size), T sequence length, C d_model, V vocabulary.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collective/process_group.h"
#include "core/config.h"
#include "core/lr_schedule.h"
#include "data/stream.h"
#include "model/gpt.h"
#include "skippipe/schedule.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"

namespace dloco {

/// What one SkipPipe iteration did on one node. loss, grad_norm, lr and skipped are the same on every node.
struct SkipIterationStats {
  double loss = 0;              // mean cross-entropy over all micro-batches of the iteration, nats/token
  double grad_norm = 0;         // global gradient norm before clipping (each stage counted once)
  double lr = 0;                // AdamW learning rate of the step
  bool skipped = false;         // non-finite loss or gradient: parameters and moments untouched
  int micro_batches = 0;        // micro-batches this node took part in (forward at least once)
  int peak_held = 0;            // most micro-batches whose autograd graphs this node held at once (≤ C)
  int64_t bytes_sent = 0;       // point-to-point bytes (activations and gradients) this node sent
  int64_t allreduce_bytes = 0;  // bytes this node put on the wire in the stage all-reduce (ring count)
  double link_wait_s = 0;       // seconds this node's receives were held for emulated links (0 without)
  int delayed_messages = 0;     // messages this node received over an emulated link
  double compute_pad_s = 0;     // seconds this node slept to emulate compute (0 without)
};

/// One node of a SkipPipe pipeline (see the file header). Thread-compatible; one per rank.
class SkipPipeNode {
 public:
  /// Copies this node's stage from `full` (every node must start from the same GPT) and derives its operation
  /// order from simulate_exact(setting, schedule). `group` is the all-nodes Collective: world = the setting's node
  /// count, rank = this node's id; it, `setting` and `schedule` must outlive the node. Forms the stage's replica
  /// sub-Collective (name "skippipe_stage_<s>") when the stage has more than one node, so all nodes construct
  /// concurrently.
  /// Stages S = schedule.placement.size() must divide model.n_layer; stage s holds blocks [s·L/S, (s+1)·L/S).
  /// Throws InputError when the group does not match the setting, a node is unplaced, S does not divide L, or the
  /// schedule deadlocks in the exact model; CollectiveError when the replicas do not join.
  SkipPipeNode(GPT& full, const skippipe::Setting& setting, const skippipe::Schedule& schedule, Collective& group,
               const TrainConfig& train, LrSchedule lr_schedule);
  /// The same for a group that holds only some of the setting's nodes (after a node died, docs/skippipe.md
  /// "Re-routing around a dead node"): this is node `node`, and rank_of_node[n] is node n's rank in `group` (−1 for
  /// a node not in it, which the schedule must not place). `subgroup_suffix` makes the replica sub-Collective's
  /// name unique when several nodes are built on one group. Throws InputError when the map does not fit.
  SkipPipeNode(GPT& full, const skippipe::Setting& setting, const skippipe::Schedule& schedule, Collective& group,
               const TrainConfig& train, LrSchedule lr_schedule, int node, std::vector<int> rank_of_node,
               const std::string& subgroup_suffix);
  ~SkipPipeNode();
  SkipPipeNode(const SkipPipeNode&) = delete;
  SkipPipeNode& operator=(const SkipPipeNode&) = delete;

  /// One training iteration at global step `step` (see the file header). `stream` is read by data nodes only
  /// (nullptr elsewhere): every data node passes a stream opened the same way, positioned at the iteration's
  /// first window; it advances by one window per micro-batch of the schedule. Throws InputError when a data node
  /// gets no stream, CollectiveError when a peer fails or a deadline passes (the group is unusable afterwards).
  SkipIterationStats run_iteration(DataStream* stream, int64_t step);
  /// The same iteration at learning rate `lr` on given windows (a learner's step, parallel/rank_engine.h): row i of
  /// `windows` (W, b·(T + 1)) int64 is micro-batch i's window (b rows of T + 1: data/stream.h), W = the
  /// schedule's micro-batch count. Data nodes read the rows of their micro-batches; other nodes may pass an
  /// undefined tensor. Throws InputError when a data node's windows have another shape, CollectiveError.
  SkipIterationStats run_iteration(const torch::Tensor& windows, double lr);

  /// Emulated links (file header): each message from node x to node y reaches y no earlier than
  /// scale · Setting::hop_s(x, y) seconds after x sent it (the sender stamps it with the steady clock, the receiver
  /// holds it until then; hops are independent, as in the simulator). 0 (the default) = off. Every node of the
  /// pipeline must be given the same scale before an iteration (the stamps are extra messages). One machine only
  /// (one steady clock). Throws InputError for a negative or non-finite scale.
  void set_link_time_scale(double scale);
  /// Emulated compute (off by default, 0): each forward takes at least scale · w, the head (+ loss and its
  /// backward) at least scale · head_factor · w and each backward at least scale · backward_factor · w, w = this
  /// node's Setting forward_s, counted from when its input arrived; the node sleeps out the rest after the real
  /// compute (a lower bound: compute slower than that is not shortened). Changes no number. Throws InputError for a
  /// negative or non-finite scale.
  void set_compute_time_scale(double scale);

  /// The AdamW over named_parameters() (in name order), for saving and loading its state.
  torch::optim::AdamW& optimizer() { return *optimizer_; }
  /// Fresh AdamW state (zero moments, step 0), the learning rate and the rest from train.
  void reset_optimizer();
  /// Whether this node starts micro-batches (a stage-0 node some micro-batch names as its data node).
  bool data_node() const;
  /// Called after each of this node's operations in run_iteration with its index in operations() (tests: a fault
  /// injected mid-iteration). Null: none.
  void set_after_op(std::function<void(int)> hook) { after_op_ = std::move(hook); }
  int node() const { return node_; }
  /// The schedule this node runs (its placement and paths).
  const skippipe::Schedule& schedule() const { return schedule_; }
  int stage() const { return stage_; }
  /// The parameters this node holds, by full-model name ("h.<i>.…", and on stage 0 "wte.weight", "ln_f.weight",
  /// "lm_head.weight" when untied). The tensors AdamW steps (change them in place only).
  std::map<std::string, torch::Tensor> named_parameters() const;
  /// This node's operations per iteration, in execution order (from the exact simulator).
  const std::vector<skippipe::SimOp>& operations() const { return ops_; }

 private:
  struct InFlight;  // one micro-batch's state on this node between its forward and its backward
  class Links;      // sends (non-blocking), receives (blocking) and the local mailbox of one iteration

  torch::Tensor run_blocks(torch::Tensor x);  // (b, T, C) -> (b, T, C) through this stage's blocks
  void forward(Links& links, int mb, const torch::Tensor& window);
  double head(Links& links, int mb, const torch::Tensor& window);
  void backward(Links& links, int mb);
  std::pair<double, double> reduce_gradients(double loss_sum);  // -> (grad norm, mean loss)
  void pad_compute(std::chrono::steady_clock::time_point began, double factor);

  ModelConfig cfg_;
  TrainConfig train_;
  LrSchedule lr_schedule_;
  const skippipe::Setting& setting_;
  const skippipe::Schedule& schedule_;
  Collective& group_;
  std::unique_ptr<Collective> replicas_;  // the stage's replicas (null when the stage has one node)
  int node_ = 0, stage_ = 0;
  int64_t stage_visits_ = 0;              // micro-batches that visit this stage per iteration (stage 0: all)
  bool stage_leader_ = false;             // first node of its stage: counts the stage in the global norm
  std::vector<skippipe::SimOp> ops_;
  double link_time_scale_ = 0;
  double compute_time_scale_ = 0, compute_pad_s_ = 0;
  std::vector<std::pair<int, Block>> blocks_;  // (global block index, block)
  torch::Tensor wte_;                          // (V, C) stage 0
  RMSNorm ln_f_{nullptr};                      // gain (C) stage 0
  torch::Tensor head_;                         // (V, C) lm_head, or wte_ itself when tied; stage 0
  torch::Tensor cos_, sin_, causal_;           // (T, hs/2) rotary tables, (T, T) additive causal mask
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::map<int, std::unique_ptr<InFlight>> held_;  // micro-batch index -> its graph on this node
  std::vector<int> rank_of_node_;                  // node id -> rank in group_ (−1: not in it)
  std::function<void(int)> after_op_;
};

}  // namespace dloco
