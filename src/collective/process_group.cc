// c10d adapter; see process_group.h. The only translation unit that includes c10d.
#include "collective/process_group.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

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
}  // namespace

Collective::Collective(const CollectiveOptions& options)
    : rank_(options.rank), world_(options.world), timeout_(to_ms(options.timeout_s)) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    throw InputError("collective rank " + std::to_string(options.rank) + " is outside [0, world = " +
                     std::to_string(options.world) + ")");
  }
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(options.store_file.string(), options.world);
    store->setTimeout(timeout_);
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
    opts->threads = 1;
    group_ = erase(c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank, options.world, opts));
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(options.rank) + " of " + std::to_string(options.world) +
                          " could not join the Gloo group through '" + options.store_file.string() + "' within " +
                          std::to_string(options.timeout_s) + " s: " + e.what());
  }
}

Collective::~Collective() = default;

void Collective::Pending::wait() {
  if (!work_) return;
  auto& work = *static_cast<c10d::Work*>(work_.get());
  try {
    if (!work.wait(timeout_)) throw CollectiveError("collective did not complete");
  } catch (const CollectiveError&) {
    throw;
  } catch (const std::exception& e) {
    throw CollectiveError(std::string("collective failed or passed its deadline (a peer died or hangs): ") + e.what());
  }
  work_.reset();
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
  bytes_sent_ += 2 * (world_ - 1) * tensors[0].nbytes() / world_;
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
  if (rank_ == root) bytes_sent_ += tensors[0].nbytes();
  pending.wait();
}

namespace {
void check_peer(int peer, int rank, int world, int tag, const char* what) {
  if (peer < 0 || peer >= world || peer == rank) {
    throw InputError(std::string(what) + " peer " + std::to_string(peer) + " is not another rank of this group of " +
                     std::to_string(world) + " (this is rank " + std::to_string(rank) + ")");
  }
  if (tag < 0) throw InputError(std::string(what) + " tag must be ≥ 0, got " + std::to_string(tag));
}
}  // namespace

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
  bytes_sent_ += tensors[0].nbytes();
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
