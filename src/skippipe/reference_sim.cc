// The reference-compatible SkipPipe simulator: gensyn-ai/skippipe's schedulers/com_sym.py (ComNode.send and
// run_simulation) ported step by step, so that the reference's four stored iteration times are reproduced on
// its setting. Its quirks are kept on purpose and named in ReferenceQuirks (simulator.h); comments below quote
// the reference's branch each step mirrors. Two equivalences make it faster without changing any result: a
// node drops micro-batches it has processed (they only ever get their time bumped), and the sweep jumps over
// time buckets holding no unprocessed micro-batch (nothing can happen in them).
// Deliberately not here: any fix of the quirks — that is the exact model (exact_sim.cc).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "skippipe/simulator.h"

namespace dloco::skippipe {

namespace {

// com_sym.py's MB: one copy of a micro-batch travelling between nodes.
struct RefMb {
  int64_t id = 0;          // uniqid
  int index = 0;           // position in the schedule (for finish_s)
  double tm = 0.0;         // when it may be processed
  double tm_receive = -1;  // FIFO tie key: when it was first received (< 0: not yet received)
  bool processed = false;
  bool back = false;       // on its backward way
  bool one_time = false;   // forward done at the last path node; the head at the data node is next
  int first_node = 0;      // the data node (after the last forward: the last path node, then the data node again)
};

struct RefNode {
  double comp = 0.0;  // w
  std::vector<RefMb> received;
  int64_t memory = 0;
  std::vector<int64_t> freed;  // ids sent forward from here (the data node's hold-back list)
  double last_tm = 0.0;        // end of the busy window
  double largest = 0.0;        // latest backward end of a micro-batch returned here (received_sent)
};

class ReferenceSim {
 public:
  ReferenceSim(const Setting& setting, const Schedule& schedule, const ReferenceQuirks& q)
      : setting_(setting), schedule_(schedule), q_(q), nodes_(setting.nodes.size()) {
    result_.busy_s.assign(nodes_.size(), 0.0);
    result_.forwards.assign(nodes_.size(), 0);
    result_.backwards.assign(nodes_.size(), 0);
    result_.finish_s.assign(schedule.micro_batches.size(), std::numeric_limits<double>::quiet_NaN());
    for (size_t n = 0; n < nodes_.size(); ++n) {
      nodes_[n].comp = setting.nodes[n].forward_s;
      nodes_[n].memory = setting.memory_capacity;
    }
    for (size_t i = 0; i < schedule.micro_batches.size(); ++i) {
      const MicroBatch& m = schedule.micro_batches[i];
      if (m.path.empty()) {
        throw InputError("micro-batch " + std::to_string(m.id) + ": an empty path cannot run in reference mode");
      }
      RefMb mb;
      mb.id = m.id;
      mb.index = static_cast<int>(i);
      mb.tm = m.inject_s;
      mb.tm_receive = q_.injected_receive_s;
      mb.first_node = m.data_node;
      nodes_[m.data_node].received.push_back(mb);
    }
  }

  SimResult run() {
    // run_simulation: for tm in range(buckets): 15 passes over the nodes in id order.
    for (int64_t bucket = next_bucket(0); bucket < q_.buckets; bucket = next_bucket(bucket + 1)) {
      for (int64_t pass = 0; pass < q_.passes_per_bucket; ++pass) {
        for (size_t n = 0; n < nodes_.size(); ++n) send(static_cast<int>(n), bucket);
      }
    }
    // The iteration time: the latest backward end over the stage-0 nodes' received_sent.
    for (int n : schedule_.placement[0]) {
      result_.iteration_time_s = std::max(result_.iteration_time_s, nodes_[n].largest);
    }
    for (const RefNode& node : nodes_) {
      for (const RefMb& mb : node.received) result_.stranded += mb.processed ? 0 : 1;
    }
    return result_;
  }

 private:
  // The smallest bucket ≥ from holding an unprocessed micro-batch, or q_.buckets when there is none. An
  // unprocessed micro-batch whose time lies before `from` is stranded: the reference only looks at the current
  // bucket, and nothing later can move it.
  int64_t next_bucket(int64_t from) const {
    double best = std::numeric_limits<double>::infinity();
    for (const RefNode& node : nodes_) {
      for (const RefMb& mb : node.received) {
        if (!mb.processed && std::floor(mb.tm) >= static_cast<double>(from)) best = std::min(best, std::floor(mb.tm));
      }
    }
    return best < static_cast<double>(q_.buckets) ? static_cast<int64_t>(best) : q_.buckets;
  }

  // The node after `self` on micro-batch `mb`'s route d -> path..., or -1 (mb.path.get(self)).
  int next_of(const MicroBatch& mb, int self) const {
    if (self == mb.data_node) return mb.path.front();
    for (size_t k = 0; k + 1 < mb.path.size(); ++k) {
      if (mb.path[k] == self) return mb.path[k + 1];
    }
    return -1;
  }
  // The node before `self` on the route, or -1 (mb.invpath.get(self)).
  int prev_of(const MicroBatch& mb, int self) const {
    for (size_t k = 0; k < mb.path.size(); ++k) {
      if (mb.path[k] == self) return k == 0 ? mb.data_node : mb.path[k - 1];
    }
    return -1;
  }

  void receive(int node, RefMb mb) {
    DLOCO_CHECK(mb.tm_receive < 0);
    mb.tm_receive = mb.tm;  // receive(): tm_receive = tm when unset
    nodes_[node].received.push_back(mb);
  }

  // Sends a copy of `mb` (after `dur` of compute on `self`) to `to`, with `edit` applied to the copy.
  template <class Edit>
  void forward_copy(int self, const RefMb& mb, double dur, int to, Edit edit) {
    DLOCO_CHECK(to != self);  // the loop below walks self's list; a copy to itself would grow it under us
    RefMb copy = mb;
    copy.tm_receive = -1;
    edit(copy);
    copy.tm = copy.tm + dur + setting_.hop_s(self, to);
    receive(to, copy);
  }

  void send_one(int self, RefMb& mb, double& start, double& end);
  void send(int self, int64_t bucket);

  const Setting& setting_;
  const Schedule& schedule_;
  const ReferenceQuirks& q_;
  std::vector<RefNode> nodes_;
  SimResult result_;
};

// The body of com_sym.py's loop for one micro-batch copy that passed the bucket, busy-window, memory and
// hold-back tests: processes it, sends the next copy, and sets [start, end] of the compute.
void ReferenceSim::send_one(int self, RefMb& mb, double& start, double& end) {
  RefNode& node = nodes_[self];
  const MicroBatch& route = schedule_.micro_batches[mb.index];
  const int nxt = next_of(route, self);
  start = mb.tm;
  if (nxt >= 0 && !mb.back && !mb.one_time) {  // a forward with a next node
    node.freed.push_back(mb.id);
    end = mb.tm + node.comp;
    node.memory -= 1;
    ++result_.forwards[self];
    forward_copy(self, mb, node.comp, nxt, [](RefMb&) {});
  } else if (!mb.back && prev_of(route, self) >= 0 && !mb.one_time) {  // the last forward: to the data node
    end = mb.tm + node.comp;
    node.memory -= 1;
    ++result_.forwards[self];
    forward_copy(self, mb, node.comp, mb.first_node, [self](RefMb& c) {
      c.first_node = self;
      c.one_time = true;
    });
  } else if (mb.one_time) {  // the head + loss at the data node: back to the last path node
    const double dur = node.comp * setting_.head_factor;
    end = mb.tm + dur;
    forward_copy(self, mb, dur, mb.first_node, [self](RefMb& c) {
      c.first_node = self;
      c.back = true;
      c.one_time = false;
    });
  } else if (prev_of(route, self) >= 0) {  // a backward on the path
    const double dur = node.comp * setting_.backward_factor;
    end = mb.tm + dur;
    node.memory += 1;
    ++result_.backwards[self];
    forward_copy(self, mb, dur, prev_of(route, self), [](RefMb& c) { c.back = true; });
  } else {  // the backward at the data node: the micro-batch is done
    const int64_t key = mb.id % q_.id_modulus;
    const auto it = std::find(node.freed.begin(), node.freed.end(), key);
    if (it != node.freed.end()) node.freed.erase(it);
    end = mb.tm + node.comp * setting_.backward_factor;
    node.largest = std::max(node.largest, end);
    node.memory += 1;
    ++result_.backwards[self];
    ++result_.completed;
    result_.finish_s[mb.index] = end;
  }
  result_.busy_s[self] += end - start;
}

// ComNode.send(dl, nds, tmunit) for node `self` in time bucket `bucket`.
void ReferenceSim::send(int self, int64_t bucket) {
  RefNode& node = nodes_[self];
  std::erase_if(node.received, [](const RefMb& mb) { return mb.processed; });
  // self.received.sort(key=lambda mb: (mb.tm, mb.tm_receive)): Python's sort is stable.
  std::stable_sort(node.received.begin(), node.received.end(), [](const RefMb& a, const RefMb& b) {
    return a.tm != b.tm ? a.tm < b.tm : a.tm_receive < b.tm_receive;
  });
  const double unit = static_cast<double>(bucket);
  for (size_t i = 0; i < node.received.size(); ++i) {
    RefMb& mb = node.received[i];
    if (std::floor(mb.tm) != unit) continue;
    if (mb.tm < node.last_tm) {  // inside the busy window: postponed to its end
      mb.tm = node.last_tm;
      continue;
    }
    if (mb.processed) continue;
    if (!mb.back && node.memory <= 0 && !mb.one_time) {  // no free memory: retry later
      mb.tm += q_.memory_retry_s;
      continue;
    }
    if (mb.first_node == self && !mb.one_time && !mb.back &&
        std::find(node.freed.begin(), node.freed.end(), mb.id % q_.id_modulus) != node.freed.end()) {
      continue;  // held back until the micro-batch with id % 100 returns
    }
    double start = 0.0, end = 0.0;
    send_one(self, mb, start, end);
    node.last_tm = end + (mb.tm_receive > q_.fresh_threshold_s ? q_.first_window_s : q_.window_s);
    for (size_t j = 0; j < node.received.size(); ++j) {  // arrivals inside [start, last_tm) wait for its end
      RefMb& other = node.received[j];
      if (j == i || other.id == mb.id) continue;
      if (start <= other.tm && node.last_tm > other.tm) other.tm = node.last_tm;
    }
    mb.processed = true;
  }
}

}  // namespace

SimResult simulate_reference(const Setting& setting, const Schedule& schedule, const ReferenceQuirks& quirks) {
  DLOCO_CHECK_EQ(schedule.stage_of_node.size(), setting.nodes.size());
  return ReferenceSim(setting, schedule, quirks).run();
}

SimMode parse_sim_mode(const std::string& name) {
  if (name == "exact") return SimMode::kExact;
  if (name == "reference") return SimMode::kReference;
  throw InputError("unknown simulator mode \"" + name + "\" (expected exact or reference)");
}

const char* to_string(SimMode mode) { return mode == SimMode::kExact ? "exact" : "reference"; }

SimResult simulate(SimMode mode, const Setting& setting, const Schedule& schedule) {
  return mode == SimMode::kExact ? simulate_exact(setting, schedule) : simulate_reference(setting, schedule);
}

}  // namespace dloco::skippipe
