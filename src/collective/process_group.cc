// c10d adapter; see process_group.h. The only translation unit that includes c10d.
#include "collective/process_group.h"

#include <chrono>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <functional>

#include "core/check.h"

namespace dloco {

namespace {
std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}
c10d::ProcessGroupGloo& gloo(const std::shared_ptr<void>& group) {
  return *static_cast<c10d::ProcessGroupGloo*>(group.get());
}
// Holds the intrusive_ptr so the type-erased handle keeps the object alive.
template <typename T>
std::shared_ptr<void> erase(c10::intrusive_ptr<T> p) {
  auto holder = std::make_shared<c10::intrusive_ptr<T>>(std::move(p));
  return std::shared_ptr<void>(holder, holder->get());
}
void check_tensor(const torch::Tensor& t) {
  if (!t.defined() || !t.is_contiguous() || t.device().type() != torch::kCPU) {
    throw InputError("collectives need a defined, contiguous CPU tensor");
  }
}
// The ring model's (M−1)/M·n.
int64_t ring_share(int64_t bytes, int world) { return (world - 1) * bytes / world; }
// Counts one completed operation; called only after it completed, so a failed one leaves the counters alone.
void count(OpTraffic& op, int64_t bytes) {
  op.calls += 1;
  op.bytes += bytes;
}
}  // namespace

Collective::Collective(const CollectiveOptions& options)
    : rank_(options.rank), world_(options.world), timeout_(to_ms(options.timeout_s)), hostname_(options.hostname) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    throw InputError("collective rank " + std::to_string(options.rank) + " is outside [0, world = " +
                     std::to_string(options.world) + ")");
  }
  const auto rendezvous = options.rendezvous_timeout_s > 0 ? to_ms(options.rendezvous_timeout_s) : timeout_;
  c10::intrusive_ptr<c10d::FileStore> file_store;
  try {
    file_store = c10::make_intrusive<c10d::FileStore>(options.store_file.string(), options.world);
    file_store->setTimeout(rendezvous);
    // Every rank arrives before Gloo's own rendezvous starts: Gloo waits for its peers' addresses with the
    // collectives' deadline, not the store's, so a longer rendezvous deadline is waited for here.
    file_store->set("dloco/arrived/" + std::to_string(options.rank), std::vector<uint8_t>{1});
    std::vector<std::string> arrived;
    for (int r = 0; r < options.world; ++r) arrived.push_back("dloco/arrived/" + std::to_string(r));
    file_store->wait(arrived, rendezvous);
    store_ = erase(c10::intrusive_ptr<c10d::Store>(file_store));
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(options.rank) + " of " + std::to_string(options.world) +
                          " could not open the store '" + options.store_file.string() +
                          "' or its peers did not arrive within " + std::to_string(rendezvous.count() / 1000.0) +
                          " s: " + e.what());
  }
  join("through '" + options.store_file.string() + "'", rendezvous);
  file_store->setTimeout(timeout_);  // sub-groups rendezvous with the collectives' deadline
}

Collective::Collective(Joined, std::shared_ptr<void> store, int rank, int world, std::chrono::milliseconds timeout,
                       std::string hostname)
    : rank_(rank), world_(world), timeout_(timeout), hostname_(std::move(hostname)), store_(std::move(store)) {
  join("of a sub-group", timeout_);
}

void Collective::join(const std::string& where, std::chrono::milliseconds rendezvous) {
  try {
    auto store = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(static_cast<c10d::Store*>(store_.get()));
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname_));
    opts->threads = 1;
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank_, world_, opts);
    // The constructor returns before every peer has connected: without this barrier a rank that does no collective
    // and drops the group closes the sockets its peers are still connecting ("Connection closed by peer";
    // pytorch/pytorch#61396). Not counted in traffic().
    c10d::BarrierOptions barrier;
    barrier.timeout = rendezvous;
    if (!group->barrier(barrier)->wait(rendezvous)) throw CollectiveError("the joining barrier did not complete");
    group_ = erase(std::move(group));
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                          " could not join the Gloo group " + where + " within " +
                          std::to_string(rendezvous.count() / 1000.0) + " s: " + e.what());
  }
}

Collective::~Collective() = default;

void Collective::Pending::wait() {
  if (!work_) return;
  auto& work = *static_cast<c10d::Work*>(work_.get());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (!work.wait(timeout_)) throw CollectiveError("collective did not complete");
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(std::string("collective failed or passed its deadline (a peer died or hangs): ") + e.what());
  }
  work_.reset();
  if (counter_) {
    count(*counter_, bytes_);
    counter_->wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  counter_ = nullptr;
}

Collective::Pending Collective::allreduce_sum_async(torch::Tensor tensor) {
  check_tensor(tensor);
  std::vector<at::Tensor> tensors{std::move(tensor)};
  Pending pending;
  c10d::AllreduceOptions opts;
  opts.timeout = timeout_;
  try {
    pending.work_ = erase(gloo(group_).allreduce(tensors, opts));
  } catch (const std::exception& e) {
    throw CollectiveError(std::string("all-reduce could not start: ") + e.what());
  }
  pending.timeout_ = timeout_;
  pending.counter_ = &traffic_.all_reduce;  // counted at wait(), once it completed
  pending.bytes_ = 2 * (world_ - 1) * static_cast<int64_t>(tensors[0].nbytes()) / world_;
  return pending;
}

void Collective::broadcast(torch::Tensor tensor, int root) {
  check_tensor(tensor);
  std::vector<at::Tensor> tensors{std::move(tensor)};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_;
  Pending pending;
  try {
    pending.work_ = erase(gloo(group_).broadcast(tensors, opts));
  } catch (const std::exception& e) {
    throw CollectiveError(std::string("broadcast could not start: ") + e.what());
  }
  pending.timeout_ = timeout_;
  pending.wait();
  count(traffic_.broadcast, rank_ == root ? static_cast<int64_t>(tensors[0].nbytes()) : 0);
}

namespace {
void check_peer(int peer, int rank, int world, int tag, const char* what) {
  if (peer < 0 || peer >= world || peer == rank) {
    throw InputError(std::string(what) + " peer " + std::to_string(peer) + " is not another rank of this group of " +
                     std::to_string(world) + " (this is rank " + std::to_string(rank) + ")");
  }
  if (tag < 0) throw InputError(std::string(what) + " tag must be ≥ 0, got " + std::to_string(tag));
}
// Starts one c10d operation and waits for it with the group's deadline; any failure becomes CollectiveError.
void run_op(const char* what, std::chrono::milliseconds timeout,
            const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = start();
  } catch (const std::exception& e) {
    throw CollectiveError(std::string(what) + " could not start: " + e.what());
  }
  try {
    if (!work->wait(timeout)) throw CollectiveError(std::string(what) + " did not complete");
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(std::string(what) + " failed or passed its deadline (a peer died or hangs): " + e.what());
  }
}
}  // namespace

std::unique_ptr<Collective> Collective::subgroup(const std::vector<int>& ranks, const std::string& name) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  const bool unique = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (ranks.empty() || !unique || sorted.front() < 0 || sorted.back() >= world_ || me == ranks.end() ||
      name.empty()) {
    throw InputError("sub-group '" + name + "': its ranks must be distinct ranks of the parent group (world " +
                     std::to_string(world_) + ") including the caller (rank " + std::to_string(rank_) +
                     "), and it needs a name");
  }
  std::string prefix = name + "/";
  for (size_t i = 0; i < ranks.size(); ++i) prefix += (i ? "," : "") + std::to_string(ranks[i]);
  auto parent = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(
      static_cast<c10d::Store*>(store_.get()));
  auto store = erase(c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::PrefixStore>(prefix, parent)));
  return std::unique_ptr<Collective>(new Collective(Joined{}, std::move(store), static_cast<int>(me - ranks.begin()),
                                                    static_cast<int>(ranks.size()), timeout_, hostname_));
}

std::vector<torch::Tensor> Collective::all_gather(const torch::Tensor& input) {
  check_tensor(input);
  std::vector<torch::Tensor> outputs;
  for (int r = 0; r < world_; ++r) outputs.push_back(torch::empty_like(input));
  const int64_t bytes = ring_share(world_ * static_cast<int64_t>(input.nbytes()), world_);
  if (input.numel() == 0) {  // nothing to move (same shape on every rank, so all ranks skip)
    count(traffic_.all_gather, bytes);
    return outputs;
  }
  std::vector<std::vector<at::Tensor>> out{outputs};
  std::vector<at::Tensor> in{input};
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  run_op("all-gather", timeout_, [&] { return gloo(group_).allgather(out, in, opts); });
  count(traffic_.all_gather, bytes);
  return out[0];
}

void Collective::all_gather_flat(torch::Tensor output, const torch::Tensor& shard) {
  check_tensor(output);
  check_tensor(shard);
  const int64_t n = shard.numel();
  if (output.numel() != world_ * n || output.dtype() != shard.dtype()) {
    throw InputError("all_gather_flat: output has " + std::to_string(output.numel()) + " elements, wants M·n = " +
                     std::to_string(world_ * n) + " of the shard's dtype");
  }
  const int64_t bytes = ring_share(static_cast<int64_t>(output.nbytes()), world_);
  if (n == 0) return count(traffic_.all_gather, bytes);
  // Gloo's list form copies into each output after its own flat buffer: the views land in `output` directly.
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < world_; ++r) out[0].push_back(output.narrow(0, r * n, n));
  std::vector<at::Tensor> in{shard.reshape({-1})};
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  run_op("all-gather", timeout_, [&] { return gloo(group_).allgather(out, in, opts); });
  count(traffic_.all_gather, bytes);
}

void Collective::all_to_all(torch::Tensor output, const torch::Tensor& input) {
  check_tensor(output);
  check_tensor(input);
  if (output.numel() != input.numel() || input.numel() % world_ != 0 || output.dtype() != input.dtype()) {
    throw InputError("all_to_all needs input and output of the same dtype and size M·n; got " +
                     std::to_string(input.numel()) + " and " + std::to_string(output.numel()) + " for M = " +
                     std::to_string(world_));
  }
  const int64_t bytes = ring_share(static_cast<int64_t>(input.nbytes()), world_);
  if (input.numel() == 0) return count(traffic_.all_to_all, bytes);
  at::Tensor out = output.view({-1}), in = input.view({-1});
  std::vector<int64_t> equal_splits;  // empty: M equal chunks
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  run_op("all-to-all", timeout_, [&] { return gloo(group_).alltoall_base(out, in, equal_splits, equal_splits, opts); });
  count(traffic_.all_to_all, bytes);
}

void Collective::reduce_sum(torch::Tensor tensor, int root) {
  check_tensor(tensor);
  if (root < 0 || root >= world_) throw InputError("reduce_sum: root " + std::to_string(root) + " outside the group");
  const int64_t bytes = rank_ != root ? static_cast<int64_t>(tensor.nbytes()) : 0;
  if (tensor.numel() == 0) return count(traffic_.reduce, bytes);
  std::vector<at::Tensor> tensors{tensor};
  c10d::ReduceOptions opts;
  opts.rootRank = root;
  opts.timeout = timeout_;
  run_op("reduce", timeout_, [&] { return gloo(group_).reduce(tensors, opts); });
  count(traffic_.reduce, bytes);
}

void Collective::reduce_scatter_sum(torch::Tensor output, const torch::Tensor& input, ReduceScatterAlgo algo) {
  check_tensor(output);
  check_tensor(input);
  const int64_t n = output.numel();
  if (input.numel() != world_ * n || output.dtype() != input.dtype()) {
    throw InputError("reduce_scatter_sum: input has " + std::to_string(input.numel()) +
                     " elements, wants M·n = " + std::to_string(world_ * n) + " of the output's dtype");
  }
  const Traffic before = traffic_;
  try {
    if (algo == ReduceScatterAlgo::kAllToAll) {
      // Rank r receives chunk r of every rank, then sums the M chunks locally.
      auto received = torch::empty_like(input);  // (M·n)
      all_to_all(received, input);
      output.copy_(received.view({world_, n}).sum(0));
    } else {
      // One reduce per owner (DeepSpeed's reduce_scatter_coalesced fallback); the buffer is scratch for Gloo.
      for (int owner = 0; owner < world_; ++owner) {
        auto chunk = input.view({-1}).narrow(0, owner * n, n).clone();  // (n)
        reduce_sum(chunk, owner);
        if (owner == rank_) output.view({-1}).copy_(chunk);
      }
    }
  } catch (...) {
    traffic_ = before;  // the reduces that completed before one failed are not a reduce-scatter either
    throw;
  }
  traffic_ = before;  // counted once, as a reduce-scatter, whichever way it was built
  count(traffic_.reduce_scatter, ring_share(static_cast<int64_t>(input.nbytes()), world_));
}

void Collective::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  run_op("barrier", timeout_, [&] { return gloo(group_).barrier(opts); });
  count(traffic_.barrier, 0);
}

Collective::Pending Collective::isend(torch::Tensor tensor, int dst, int tag) {
  check_tensor(tensor);
  check_peer(dst, rank_, world_, tag, "send");
  Pending pending;
  pending.timeout_ = timeout_;
  if (tensor.numel() == 0) return pending;  // nothing to move; the receiver skips too
  std::vector<at::Tensor> tensors{std::move(tensor)};
  try {
    pending.work_ = erase(gloo(group_).send(tensors, dst, tag));
  } catch (const std::exception& e) {
    throw CollectiveError("send to rank " + std::to_string(dst) + " could not start: " + e.what());
  }
  pending.counter_ = &traffic_.send;  // counted at wait(), once the data has left
  pending.bytes_ = static_cast<int64_t>(tensors[0].nbytes());
  return pending;
}

void Collective::recv(torch::Tensor tensor, int src, int tag) {
  check_tensor(tensor);
  check_peer(src, rank_, world_, tag, "recv");
  if (tensor.numel() == 0) return;
  std::vector<at::Tensor> tensors{std::move(tensor)};
  Pending pending;
  try {
    pending.work_ = erase(gloo(group_).recv(tensors, src, tag));
  } catch (const std::exception& e) {
    throw CollectiveError("recv from rank " + std::to_string(src) + " could not start: " + e.what());
  }
  pending.timeout_ = timeout_;
  try {
    pending.wait();
  } catch (const CollectiveError& e) {
    throw CollectiveError("recv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) +
                          "): " + e.what());
  }
}

}  // namespace dloco
