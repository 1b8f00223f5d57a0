// One SkipPipe node and its training iteration; see node.h.
// Dimension letters: b micro-batch size, T sequence length, C d_model, V vocabulary, L blocks, S stages.
#include "skippipe/node.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <thread>
#include <tuple>

#include "core/check.h"
#include "train/trainer.h"

namespace dloco {

namespace {

torch::Tensor copy_of(const torch::Tensor& t) { return t.detach().clone().requires_grad_(t.requires_grad()); }

// Message tags (file header): one per (micro-batch, direction); (peer, tag) pairs never repeat in an iteration
// because a micro-batch visits a node at most once (its data node twice, receiving from two different peers).
int activation_tag(int mb) { return 2 * mb; }
int gradient_tag(int mb) { return 2 * mb + 1; }

// Where micro-batch `mb` sits at `node`: its index in the path (−1 at the data node) and its neighbours there.
struct Hop {
  int prev = 0;  // who sends this node the activations (the data node for the first path node)
  int next = 0;  // who this node sends its activations to (the data node after the last path node)
};
Hop hop_at(const skippipe::MicroBatch& mb, int node) {
  const auto& path = mb.path;
  const int k = static_cast<int>(path.size());
  if (node == mb.data_node) return {k > 0 ? path[k - 1] : node, k > 0 ? path[0] : node};
  for (int j = 0; j < k; ++j) {
    if (path[j] == node) return {j == 0 ? mb.data_node : path[j - 1], j == k - 1 ? mb.data_node : path[j + 1]};
  }
  DLOCO_CHECK(false && "the simulator gave this node an operation of a micro-batch that does not visit it");
  return {};
}

}  // namespace

struct SkipPipeNode::InFlight {
  torch::Tensor input;   // (b, T, C) received leaf whose gradient the backward sends back; undefined at a data node
  torch::Tensor output;  // (b, T, C) this node's output, attached to its graph
};

// With link emulation (scale > 0) each message to another node is followed by a (1) int64 time stamp (steady
// clock, ns; one clock for every process of one machine) under the same tag, and the receiver holds the message
// until stamp + scale · Setting::hop_s(src, dst): the arrival time of the simulator's hop, with no link contention.
class SkipPipeNode::Links {
 public:
  Links(Collective& group, const skippipe::Setting& setting, double scale, int node, const std::vector<int>& rank_of)
      : group_(group), setting_(setting), scale_(scale), node_(node), rank_of_(rank_of) {}
  ~Links() {
    // Only after a CollectiveError (finish() ran otherwise): the group is unusable, the sends are abandoned.
    in_flight_.clear();
  }

  /// Sends t (b, T, C) to `dst` without waiting; to this node itself through the mailbox.
  void send(int dst, int tag, const torch::Tensor& t) {
    auto data = t.detach().contiguous();
    if (dst == node_) {
      DLOCO_CHECK(mailbox_.emplace(tag, data).second);
      return;
    }
    in_flight_.push_back(group_.isend(data, rank(dst), tag));
    keep_.push_back(data);
    bytes_ += static_cast<int64_t>(data.numel() * data.element_size());
    if (scale_ > 0) {
      auto stamp = torch::tensor({now_ns()}, torch::kLong);  // (1)
      in_flight_.push_back(group_.isend(stamp, rank(dst), tag));
      keep_.push_back(stamp);
    }
  }
  /// Receives a (b, T, C) tensor from `src` under `tag`, blocking up to the group's deadline.
  torch::Tensor recv(int src, int tag, at::IntArrayRef shape) {
    if (src == node_) {
      auto it = mailbox_.find(tag);
      DLOCO_CHECK(it != mailbox_.end() && "a local operation ran before the one that produces its input");
      auto t = it->second;
      mailbox_.erase(it);
      return t;
    }
    auto t = torch::empty(shape);
    group_.recv(t, rank(src), tag);
    if (scale_ > 0) {
      auto stamp = torch::empty({1}, torch::kLong);  // (1)
      group_.recv(stamp, rank(src), tag);
      const auto due = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(stamp.item<int64_t>())) +
                       std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::duration<double>(scale_ * setting_.hop_s(src, node_)));
      const auto now = std::chrono::steady_clock::now();
      if (due > now) {
        held_s_ += std::chrono::duration<double>(due - now).count();
        std::this_thread::sleep_until(due);
      }
      ++delayed_;
    }
    return t;
  }
  /// Waits for every send of the iteration.
  void finish() {
    for (auto& pending : in_flight_) pending.wait();
    in_flight_.clear();
    keep_.clear();
    DLOCO_CHECK(mailbox_.empty());
  }
  int64_t bytes() const { return bytes_; }
  double held_s() const { return held_s_; }
  int delayed() const { return delayed_; }

 private:
  int rank(int node) const {
    const int r = rank_of_[static_cast<size_t>(node)];
    DLOCO_CHECK(r >= 0 && "a path names a node that is not in the group");
    return r;
  }
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  Collective& group_;
  const skippipe::Setting& setting_;
  double scale_ = 0;  // link emulation: 0 = off
  int node_ = 0;                      // this node's id in the setting
  const std::vector<int>& rank_of_;   // node id -> rank in the group (−1: not in it)
  double held_s_ = 0;  // seconds this node waited for emulated links
  int delayed_ = 0;    // messages received over an emulated link
  std::map<int, torch::Tensor> mailbox_;
  std::vector<Collective::Pending> in_flight_;
  std::vector<torch::Tensor> keep_;  // the sent tensors, alive until finish()
  int64_t bytes_ = 0;
};

namespace {
// Rank r = node r, for a group of exactly the setting's nodes.
std::vector<int> identity_ranks(const Collective& group, const skippipe::Setting& setting) {
  const int N = static_cast<int>(setting.node_count());
  if (group.world() != N) {
    throw InputError("SkipPipe: the group has " + std::to_string(group.world()) + " ranks, the setting " +
                     std::to_string(N) + " nodes: one rank per node");
  }
  std::vector<int> out(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}
}  // namespace

SkipPipeNode::SkipPipeNode(GPT& full, const skippipe::Setting& setting, const skippipe::Schedule& schedule,
                           Collective& group, const TrainConfig& train, LrSchedule lr_schedule)
    : SkipPipeNode(full, setting, schedule, group, train, lr_schedule, group.rank(), identity_ranks(group, setting),
                   "") {}

SkipPipeNode::SkipPipeNode(GPT& full, const skippipe::Setting& setting, const skippipe::Schedule& schedule,
                           Collective& group, const TrainConfig& train, LrSchedule lr_schedule, int node,
                           std::vector<int> rank_of_node, const std::string& subgroup_suffix)
    : cfg_(full->config()),
      train_(train),
      lr_schedule_(lr_schedule),
      setting_(setting),
      schedule_(schedule),
      group_(group),
      rank_of_node_(std::move(rank_of_node)) {
  const int N = static_cast<int>(setting.node_count());
  if (static_cast<int>(schedule.stage_of_node.size()) != N || static_cast<int>(rank_of_node_.size()) != N) {
    throw InputError("SkipPipe: the schedule or the rank map does not cover the setting's " + std::to_string(N) +
                     " nodes");
  }
  if (node < 0 || node >= N || rank_of_node_[static_cast<size_t>(node)] != group.rank()) {
    throw InputError("SkipPipe: node " + std::to_string(node) + " is not rank " + std::to_string(group.rank()) +
                     " of the group in the rank map");
  }
  for (const auto& replicas : schedule.placement) {
    for (int n : replicas) {
      const int r = rank_of_node_[static_cast<size_t>(n)];
      if (r < 0 || r >= group.world()) {
        throw InputError("SkipPipe: node " + std::to_string(n) + " is placed but has no rank in the group");
      }
    }
  }
  node_ = node;
  stage_ = schedule.stage_of_node[node_];
  if (stage_ < 0) throw InputError("SkipPipe: node " + std::to_string(node_) + " is in no stage of the placement");
  const int S = static_cast<int>(schedule.placement.size());
  const int L = static_cast<int>(cfg_.n_layer);
  if (L % S != 0) {
    throw InputError("SkipPipe: " + std::to_string(S) + " stages do not divide model.n_layer = " +
                     std::to_string(L));
  }
  stage_visits_ = skippipe::visits_per_stage(schedule)[static_cast<size_t>(stage_)];
  const auto& replicas = schedule.placement[static_cast<size_t>(stage_)];
  stage_leader_ = replicas.front() == node_;
  ops_ = skippipe::simulate_exact(setting, schedule).node_ops[static_cast<size_t>(node_)];

  {
    torch::NoGradGuard no_grad;
    auto params = full->named_parameters();
    for (int i = stage_ * (L / S); i < (stage_ + 1) * (L / S); ++i) {
      Block block(cfg_);
      for (auto& q : block->named_parameters()) q.value().copy_(params["h." + std::to_string(i) + "." + q.key()]);
      blocks_.emplace_back(i, block);
    }
    if (stage_ == 0) {
      wte_ = copy_of(params["wte.weight"]);
      ln_f_ = RMSNorm(cfg_.d_model, cfg_.norm_eps);
      for (auto& q : ln_f_->parameters()) q.copy_(params["ln_f.weight"]);
      head_ = cfg_.tie_embeddings ? wte_ : copy_of(params["lm_head.weight"]);
    }
    auto buffers = full->named_buffers();
    cos_ = buffers["rope_cos"].clone();
    sin_ = buffers["rope_sin"].clone();
    causal_ = buffers["causal"].clone();
  }
  for (const auto& [name, tensor] : named_parameters()) params_.push_back(tensor);
  optimizer_ = make_inner_adamw(params_, train_);
  if (replicas.size() > 1) {
    std::vector<int> ranks;
    for (int n : replicas) ranks.push_back(rank_of_node_[static_cast<size_t>(n)]);
    replicas_ = group.subgroup(ranks, "skippipe_stage_" + std::to_string(stage_) + subgroup_suffix);
  }
}

SkipPipeNode::~SkipPipeNode() = default;

void SkipPipeNode::reset_optimizer() { optimizer_ = make_inner_adamw(params_, train_); }

void SkipPipeNode::set_link_time_scale(double scale) {
  if (!(scale >= 0) || !std::isfinite(scale)) {
    throw InputError("SkipPipe: link time scale " + std::to_string(scale) + " must be finite and >= 0");
  }
  link_time_scale_ = scale;
}

void SkipPipeNode::set_compute_time_scale(double scale) {
  if (!(scale >= 0) || !std::isfinite(scale)) {
    throw InputError("SkipPipe: compute time scale " + std::to_string(scale) + " must be finite and >= 0");
  }
  compute_time_scale_ = scale;
}

// Emulated compute: sleeps until `began` + scale · factor · w (this node's forward_s) when the real compute ended
// earlier; counts the sleep.
void SkipPipeNode::pad_compute(std::chrono::steady_clock::time_point began, double factor) {
  if (compute_time_scale_ <= 0) return;
  const double seconds = compute_time_scale_ * factor * setting_.nodes[static_cast<size_t>(node_)].forward_s;
  const auto due =
      began + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  const auto now = std::chrono::steady_clock::now();
  if (now >= due) return;
  compute_pad_s_ += std::chrono::duration<double>(due - now).count();
  std::this_thread::sleep_until(due);
}

std::map<std::string, torch::Tensor> SkipPipeNode::named_parameters() const {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [i, block] : blocks_) {
    for (const auto& q : block->named_parameters()) out["h." + std::to_string(i) + "." + q.key()] = q.value();
  }
  if (stage_ == 0) {
    out["wte.weight"] = wte_;
    out["ln_f.weight"] = ln_f_->parameters()[0];
    if (!cfg_.tie_embeddings) out["lm_head.weight"] = head_;
  }
  return out;
}

torch::Tensor SkipPipeNode::run_blocks(torch::Tensor x) {
  const int64_t T = x.size(1);
  const auto cos = cos_.narrow(0, 0, T), sin = sin_.narrow(0, 0, T);  // (T, hs/2)
  const auto causal = causal_.narrow(0, 0, T).narrow(1, 0, T);         // (T, T)
  for (auto& [i, block] : blocks_) x = block->forward(x, cos, sin, causal);
  return x;  // (b, T, C)
}

void SkipPipeNode::forward(Links& links, int mb, const torch::Tensor& window) {
  const auto& micro = schedule_.micro_batches[static_cast<size_t>(mb)];
  const int64_t b = train_.batch_size, T = cfg_.seq_len;
  const Hop hop = hop_at(micro, node_);
  auto state = std::make_unique<InFlight>();
  auto began = std::chrono::steady_clock::now();
  if (node_ == micro.data_node) {
    auto idx = window_batch(window, b, T).first;                      // (b, T) inputs
    state->output = run_blocks(torch::embedding(wte_, idx));          // (b, T, C), as nn::Embedding
  } else {
    state->input = links.recv(hop.prev, activation_tag(mb), {b, T, cfg_.d_model}).requires_grad_(true);  // (b, T, C)
    began = std::chrono::steady_clock::now();  // compute starts once the input is here
    state->output = run_blocks(state->input);  // (b, T, C)
  }
  pad_compute(began, 1.0);
  links.send(hop.next, activation_tag(mb), state->output);
  DLOCO_CHECK(held_.emplace(mb, std::move(state)).second);
}

double SkipPipeNode::head(Links& links, int mb, const torch::Tensor& window) {
  const auto& micro = schedule_.micro_batches[static_cast<size_t>(mb)];
  const int64_t b = train_.batch_size, T = cfg_.seq_len;
  const Hop hop = hop_at(micro, node_);
  auto x = links.recv(hop.prev, activation_tag(mb), {b, T, cfg_.d_model}).requires_grad_(true);  // (b, T, C)
  const auto began = std::chrono::steady_clock::now();
  auto logits = torch::matmul(ln_f_(x), head_.t());                                               // (b, T, V)
  auto targets = window_batch(window, b, T).second.view({-1});                                    // (b·T)
  auto loss = cross_entropy(logits.view({-1, cfg_.vocab_size}).to(torch::kFloat), targets);
  // Unscaled: a stage's gradient is the sum over its micro-batches here, divided by its visits after the
  // replicas' all-reduce (the one-process reference divides by grad_accum first, then rescales: same to fp32).
  loss.backward();
  pad_compute(began, setting_.head_factor);
  links.send(hop.prev, gradient_tag(mb), x.grad());  // (b, T, C)
  return loss.item<double>();
}

void SkipPipeNode::backward(Links& links, int mb) {
  const auto& micro = schedule_.micro_batches[static_cast<size_t>(mb)];
  const int64_t b = train_.batch_size, T = cfg_.seq_len;
  const Hop hop = hop_at(micro, node_);
  auto it = held_.find(mb);
  DLOCO_CHECK(it != held_.end());
  auto grad = links.recv(hop.next, gradient_tag(mb), {b, T, cfg_.d_model});  // (b, T, C)
  const auto began = std::chrono::steady_clock::now();
  it->second->output.backward(grad);
  pad_compute(began, setting_.backward_factor);
  if (node_ != micro.data_node) links.send(hop.prev, gradient_tag(mb), it->second->input.grad());  // (b, T, C)
  held_.erase(it);
}

bool SkipPipeNode::data_node() const {
  const auto& mbs = schedule_.micro_batches;
  return stage_ == 0 &&
         std::any_of(mbs.begin(), mbs.end(), [&](const skippipe::MicroBatch& m) { return m.data_node == node_; });
}

SkipIterationStats SkipPipeNode::run_iteration(DataStream* stream, int64_t step) {
  // This data node's windows: micro-batch i (schedule order) is window i of the stream; the others' skipped.
  const int64_t window_size = window_tokens(train_.batch_size, cfg_.seq_len);
  const auto& mbs = schedule_.micro_batches;
  torch::Tensor windows;
  if (data_node()) {
    if (!stream) throw InputError("SkipPipe: data node " + std::to_string(node_) + " needs a stream");
    windows = torch::zeros({static_cast<int64_t>(mbs.size()), window_size}, torch::kLong);  // (W, b·(T + 1))
    for (size_t i = 0; i < mbs.size(); ++i) {
      if (mbs[i].data_node != node_) {
        stream->skip();
        continue;
      }
      auto row = windows[static_cast<int64_t>(i)];
      stream->next(std::span<int64_t>(row.data_ptr<int64_t>(), static_cast<size_t>(window_size)));
    }
  }
  return run_iteration(windows, lr_schedule_.at(step));
}

SkipIterationStats SkipPipeNode::run_iteration(const torch::Tensor& all_windows, double lr) {
  SkipIterationStats stats;
  stats.lr = lr;
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(stats.lr);
  }
  optimizer_->zero_grad();
  compute_pad_s_ = 0;
  held_.clear();  // empty unless the last iteration ended in an error
  // 1. This data node's windows: row i of all_windows for each micro-batch i it starts.
  const int64_t window_size = window_tokens(train_.batch_size, cfg_.seq_len);
  const auto& mbs = schedule_.micro_batches;
  std::map<int, torch::Tensor> windows;  // micro-batch -> (b·(T + 1)) int64
  if (data_node()) {
    const auto W = static_cast<int64_t>(mbs.size());
    if (!all_windows.defined() || all_windows.dim() != 2 || all_windows.size(0) != W ||
        all_windows.size(1) != window_size || all_windows.scalar_type() != torch::kLong) {
      throw InputError("SkipPipe: data node " + std::to_string(node_) + " needs (" + std::to_string(W) + ", " +
                       std::to_string(window_size) + ") int64 windows, one per micro-batch of the schedule");
    }
    for (size_t i = 0; i < mbs.size(); ++i) {
      if (mbs[i].data_node == node_) windows.emplace(static_cast<int>(i), all_windows[static_cast<int64_t>(i)]);
    }
  }
  // 2. This node's operations in the simulator's order (file header: deadlock-free, at most C graphs held).
  Links links(group_, setting_, link_time_scale_, node_, rank_of_node_);
  double loss_sum = 0;
  for (const skippipe::SimOp& op : ops_) {
    const bool mine = node_ == mbs[static_cast<size_t>(op.micro_batch)].data_node;
    const torch::Tensor window = mine ? windows.at(op.micro_batch) : torch::Tensor();
    switch (op.kind) {
      case skippipe::SimOpKind::kForward:
        forward(links, op.micro_batch, window);
        ++stats.micro_batches;
        stats.peak_held = std::max(stats.peak_held, static_cast<int>(held_.size()));
        break;
      case skippipe::SimOpKind::kHead:
        loss_sum += head(links, op.micro_batch, window);
        break;
      case skippipe::SimOpKind::kBackward:
        backward(links, op.micro_batch);
        break;
    }
    if (after_op_) after_op_(static_cast<int>(&op - ops_.data()));
  }
  links.finish();
  DLOCO_CHECK(held_.empty());
  stats.bytes_sent = links.bytes();
  stats.link_wait_s = links.held_s();
  stats.compute_pad_s = compute_pad_s_;
  stats.delayed_messages = links.delayed();
  // 3. The replicas' average, the global norm, the clip, the guard, AdamW.
  const int64_t before = replicas_ ? replicas_->traffic().all_reduce.bytes : 0;
  std::tie(stats.grad_norm, stats.loss) = reduce_gradients(loss_sum);
  stats.allreduce_bytes = (replicas_ ? replicas_->traffic().all_reduce.bytes : 0) - before;
  if (!std::isfinite(stats.loss) || !std::isfinite(stats.grad_norm)) {
    stats.skipped = true;  // the guard: no update, moments untouched (the same decision on every node)
    optimizer_->zero_grad();
    return stats;
  }
  if (train_.grad_clip > 0) {
    // torch::nn::utils::clip_grad_norm_'s rule: scale by max_norm / (norm + 1e-6) when that is below 1.
    const double coef = train_.grad_clip / (stats.grad_norm + 1e-6);
    if (coef < 1) {
      for (auto& p : params_) {
        if (p.grad().defined()) p.mutable_grad().mul_(coef);
      }
    }
  }
  optimizer_->step();
  return stats;
}

std::pair<double, double> SkipPipeNode::reduce_gradients(double loss_sum) {
  double square_sum = 0;
  if (stage_visits_ == 0) {
    // No micro-batch visits this stage: no gradient, so AdamW leaves it (and its weight decay) alone, as the
    // one-process reference does.
    for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  } else {
    std::vector<torch::Tensor> flat_parts;
    for (auto& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // this replica served no micro-batch
      flat_parts.push_back(p.grad().view({-1}));
    }
    auto flat = torch::cat(flat_parts);                  // (P) this replica's sum over its micro-batches
    if (replicas_) replicas_->allreduce_sum(flat);       // (P) the sum over the stage's visits
    flat.div_(static_cast<double>(stage_visits_));       // (P) the mean over them
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      const int64_t n = p.numel();
      p.mutable_grad().view({-1}).copy_(flat.narrow(0, offset, n));
      offset += n;
      const double norm = p.grad().norm().item<double>();  // per tensor in fp32, as clip_grad_norm_
      square_sum += norm * norm;
    }
  }
  // The global norm counts each stage once (its leader), and the loss comes from the data nodes: one all-gather of
  // (2) doubles over all N nodes, summed in rank order so every node holds the same two numbers bitwise.
  auto mine = torch::tensor({stage_leader_ ? square_sum : 0.0, loss_sum}, torch::kDouble);  // (2)
  const auto all = group_.all_gather(mine);                                                  // N × (2)
  double squares = 0, losses = 0;
  for (const auto& t : all) {
    squares += t[0].item<double>();
    losses += t[1].item<double>();
  }
  return {std::sqrt(squares), losses / static_cast<double>(schedule_.micro_batches.size())};
}

}  // namespace dloco
