// The exact event-driven SkipPipe simulator (simulator.h, "exact"): discrete events in simulated time, no time
// buckets, no retry polling and no busy windows. Each micro-batch is a chain of operations
//   F(d) F(n_1) … F(n_k) H(d) B(n_k) … B(n_1) B(d)        (d: data node, n_i: path nodes, k = path length)
// with a hop (Setting::hop_s) between consecutive operations on different nodes. A node runs one operation at a
// time and, whenever it is idle, starts the waiting operation that arrived first among those it may start (ties:
// earlier micro-batch in the schedule); a forward may start only while the node holds fewer than C activations.
// Deliberately not here: the reference's quirks (reference_sim.cc), link contention.
#include <cmath>
#include <limits>
#include <queue>
#include <tuple>

#include "core/check.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {

namespace {

using OpKind = SimOpKind;

// Operation `step` (0 … 2k+2) of micro-batch `mb`: its node, kind and duration.
struct Op {
  int node = 0;
  OpKind kind = OpKind::kForward;
  double duration_s = 0.0;
};

Op op_of(const Setting& setting, const MicroBatch& mb, int step) {
  const int k = static_cast<int>(mb.path.size());
  Op op;
  if (step <= k) {
    op.node = step == 0 ? mb.data_node : mb.path[step - 1];
    op.kind = OpKind::kForward;
    op.duration_s = setting.nodes[op.node].forward_s;
  } else if (step == k + 1) {
    op.node = mb.data_node;
    op.kind = OpKind::kHead;
    op.duration_s = setting.nodes[op.node].forward_s * setting.head_factor;
  } else {
    const int back = step - (k + 2);  // 0 … k: n_k … n_1, then d
    op.node = back < k ? mb.path[k - 1 - back] : mb.data_node;
    op.kind = OpKind::kBackward;
    op.duration_s = setting.nodes[op.node].forward_s * setting.backward_factor;
  }
  return op;
}

// A waiting operation at a node: (arrival time, micro-batch index, step); ordered FIFO, ties by schedule order.
using Waiting = std::tuple<double, int, int>;

struct Event {
  double time = 0.0;
  bool finish = false;  // true: the node's running operation ends; false: an operation arrives at the node
  int mb = 0;
  int step = 0;
  bool operator>(const Event& o) const {
    return std::tie(time, finish, mb, step) > std::tie(o.time, o.finish, o.mb, o.step);
  }
};

class ExactSim {
 public:
  ExactSim(const Setting& setting, const Schedule& schedule)
      : setting_(setting), schedule_(schedule), n_(setting.nodes.size()) {
    waiting_.resize(n_);
    busy_.assign(n_, false);
    held_.assign(n_, 0);
    result_.busy_s.assign(n_, 0.0);
    result_.forwards.assign(n_, 0);
    result_.backwards.assign(n_, 0);
    result_.finish_s.assign(schedule.micro_batches.size(), std::numeric_limits<double>::quiet_NaN());
    result_.node_ops.resize(n_);
    for (size_t i = 0; i < schedule.micro_batches.size(); ++i) {
      events_.push({schedule.micro_batches[i].inject_s, false, static_cast<int>(i), 0});
    }
  }

  SimResult run() {
    while (!events_.empty()) {
      // 1. Apply every event at this instant (a finish may make the next operation arrive at once, on the same
      //    node), so that operations arriving together compete for an idle node in FIFO order.
      const double now = events_.top().time;
      while (!events_.empty() && events_.top().time == now) {
        const Event e = events_.top();
        events_.pop();
        e.finish ? finish(e, now) : arrive(e);
      }
      // 2. Every idle node starts what it may.
      for (size_t node = 0; node < n_; ++node) try_start(static_cast<int>(node), now);
    }
    if (result_.completed != static_cast<int64_t>(schedule_.micro_batches.size())) throw_deadlock();
    return result_;
  }

 private:
  void arrive(const Event& e) {
    const Op op = op_of(setting_, schedule_.micro_batches[e.mb], e.step);
    waiting_[op.node].push_back({e.time, e.mb, e.step});
  }

  void finish(const Event& e, double now) {
    const MicroBatch& mb = schedule_.micro_batches[e.mb];
    const Op op = op_of(setting_, mb, e.step);
    busy_[op.node] = false;
    if (op.kind == OpKind::kBackward) {
      --held_[op.node];  // its activations are freed
      ++result_.backwards[op.node];
    }
    const int last = 2 * static_cast<int>(mb.path.size()) + 2;
    if (e.step == last) {
      ++result_.completed;
      result_.finish_s[e.mb] = now;
      result_.iteration_time_s = std::max(result_.iteration_time_s, now);
      return;
    }
    const Op next = op_of(setting_, mb, e.step + 1);
    events_.push({now + setting_.hop_s(op.node, next.node), false, e.mb, e.step + 1});
  }

  void try_start(int node, double now) {
    if (busy_[node]) return;
    std::vector<Waiting>& w = waiting_[node];
    int best = -1;
    for (size_t i = 0; i < w.size(); ++i) {
      const auto [arrived, mb, step] = w[i];
      const Op op = op_of(setting_, schedule_.micro_batches[mb], step);
      if (op.kind == OpKind::kForward && held_[node] >= setting_.memory_capacity) continue;  // deferred: memory
      if (best < 0 || w[i] < w[best]) best = static_cast<int>(i);
    }
    if (best < 0) return;
    const auto [arrived, mb, step] = w[best];
    w.erase(w.begin() + best);
    const Op op = op_of(setting_, schedule_.micro_batches[mb], step);
    DLOCO_CHECK_LE(arrived, now);
    if (op.kind == OpKind::kForward) {
      ++held_[node];
      ++result_.forwards[node];
    }
    busy_[node] = true;
    result_.busy_s[node] += op.duration_s;
    result_.node_ops[node].push_back({mb, op.kind, now});
    events_.push({now + op.duration_s, true, mb, step});
  }

  [[noreturn]] void throw_deadlock() const {
    std::string stuck;
    for (size_t node = 0; node < n_; ++node) {
      for (const auto& [arrived, mb, step] : waiting_[node]) {
        if (stuck.size() > 300) break;
        stuck += " micro-batch " + std::to_string(schedule_.micro_batches[mb].id) + " at node " +
                 std::to_string(node) + ";";
      }
    }
    throw InputError("schedule \"" + schedule_.method + "\" deadlocks in the exact model: " +
                     std::to_string(schedule_.micro_batches.size() - result_.completed) +
                     " micro-batches never finish (every remaining forward waits for memory held by another; "
                     "raise memory_capacity or change the paths). Waiting:" + stuck);
  }

  const Setting& setting_;
  const Schedule& schedule_;
  size_t n_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::vector<std::vector<Waiting>> waiting_;  // per node
  std::vector<bool> busy_;                     // per node: running an operation
  std::vector<int64_t> held_;                  // per node: micro-batches whose activations it holds
  SimResult result_;
};

}  // namespace

SimResult simulate_exact(const Setting& setting, const Schedule& schedule) {
  DLOCO_CHECK_EQ(schedule.stage_of_node.size(), setting.nodes.size());
  return ExactSim(setting, schedule).run();
}

}  // namespace dloco::skippipe
