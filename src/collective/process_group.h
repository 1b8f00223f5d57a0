// The one adapter around c10d (NOTES.md: ProcessGroupGloo derives from ProcessGroup in LibTorch 1.13 and from
// Backend in 2.x, so nothing else in dloco includes c10d). Used by the synchronous baselines (dp, diloco,
// streaming; docs/protocol.md §11): sums of tensors across M worker processes over Gloo, every call with a
// deadline.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace dloco {

/// A collective failed or passed its deadline (a peer died, hung or is unreachable). The process group cannot be
/// used again afterwards (Gloo's groups do not recover); the caller stops or re-forms a new group.
class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How the M workers find each other.
struct CollectiveOptions {
  std::filesystem::path store_file;  // c10d FileStore rendezvous file, the same path for every rank (one machine or
                                     // a shared filesystem); a fresh path per group
  int rank = 0;                      // 0 … world − 1
  int world = 1;                     // M
  std::string hostname = "127.0.0.1";  // address Gloo binds and advertises
  double timeout_s = 120;            // deadline of the rendezvous and of every collective, seconds
};

/// A Gloo process group of M ranks. Thread-compatible: call from one thread. Tensors must be dense, contiguous,
/// on the CPU, with the same shape and dtype on every rank.
class Collective {
 public:
  /// Joins the group (blocks until all M ranks have joined, up to timeout_s). Throws CollectiveError on timeout or
  /// a transport failure, InputError on an invalid rank/world.
  explicit Collective(const CollectiveOptions& options);
  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  /// An all-reduce in flight; wait() blocks until it is done (deadline: timeout_s from the start of the wait).
  class Pending {
   public:
    Pending() = default;
    /// Throws CollectiveError when the collective failed or timed out.
    void wait();
    bool valid() const { return work_ != nullptr; }

   private:
    friend class Collective;
    std::shared_ptr<void> work_;  // c10d::Work, type-erased so this header stays free of c10d
    std::chrono::milliseconds timeout_{0};
  };

  /// Sums `tensor` across all ranks in place, asynchronously. Counts 2·(M−1)/M·bytes as sent (a ring all-reduce).
  Pending allreduce_sum_async(torch::Tensor tensor);

  /// Blocking all-reduce (sum) in place. Throws CollectiveError on failure or timeout.
  void allreduce_sum(torch::Tensor tensor) { allreduce_sum_async(std::move(tensor)).wait(); }

  /// Copies rank `root`'s tensor into every rank's `tensor`, blocking. Throws CollectiveError.
  void broadcast(torch::Tensor tensor, int root = 0);

  /// Bytes this rank put on the wire so far by the ring-algorithm count (an all-reduce of n bytes: 2·(M−1)/M·n;
  /// a broadcast: n on the root). Gloo does not report its own counters.
  int64_t bytes_sent() const { return bytes_sent_; }

  // Point-to-point (pipeline stages). Both ends agree on shape and dtype beforehand (the schedule says what moves);
  // a message is matched by (peer, tag), in order per (peer, tag). Tags are ≥ 0. A 0-element tensor moves nothing
  // and returns at once on both ends. The group is unusable after a CollectiveError (as for the collectives).

  /// Starts sending `tensor` to rank `dst` under `tag` and returns at once; Pending::wait() blocks until the data
  /// has left this rank's buffer (deadline: timeout_s). The tensor must not change until then. Counts its bytes as
  /// sent. Throws InputError on a bad peer or tag, CollectiveError when it cannot start.
  Pending isend(torch::Tensor tensor, int dst, int tag = 0);
  /// Blocking send: isend(...).wait(). Throws CollectiveError on failure or when the deadline passes.
  void send(torch::Tensor tensor, int dst, int tag = 0) { isend(std::move(tensor), dst, tag).wait(); }
  /// Receives into `tensor` (already shaped) from rank `src` under `tag`, blocking up to timeout_s. Throws
  /// CollectiveError when the peer does not send in time or the transport fails, InputError on a bad peer or tag.
  void recv(torch::Tensor tensor, int src, int tag = 0);

 private:
  int rank_ = 0, world_ = 1;
  std::chrono::milliseconds timeout_{0};
  std::shared_ptr<void> group_;  // c10d::ProcessGroupGloo
  int64_t bytes_sent_ = 0;
};

}  // namespace dloco
