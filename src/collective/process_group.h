// The one adapter around c10d (measured: ProcessGroupGloo derives from ProcessGroup in LibTorch 1.13 and from
// Backend in 2.x, so nothing else in dloco includes c10d). Used by the synchronous baselines (dp, diloco,
// streaming; docs/protocol.md §11): sums of tensors across M worker processes over Gloo, every call with a
// deadline. Used inside a learner (src/parallel, issue 12) for its sub-groups (TP/DP/PP) and the collectives of
// ZeRO: all-gather, reduce-scatter, all-to-all, reduce, barrier.
// Deliberately not here: Gloo or c10d types (a NCCL build swaps native ops in behind the same declarations), and
// any recovery: a group that failed is dropped and re-formed by the caller.
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

/// How reduce_scatter_sum is built: Gloo 1.13 has no reduce-scatter (docs/parallel.md). Both agree with
/// all-reduce-then-slice to fp32 rounding (≤ 2.4e-7 relative), not bitwise: the summation order differs.
enum class ReduceScatterAlgo {
  kAllToAll,        // one all_to_all (the ring volume, (M−1)/M·n sent) + a local sum of the M received chunks
  kReducePerOwner,  // one reduce to each chunk's owner (DeepSpeed's way on backends without reduce-scatter)
};

/// all_gather, all_gather_flat, all_to_all, reduce_sum and reduce_scatter_sum move nothing for an empty tensor (all
/// ranks hold the same shape, so all skip the Gloo call, and a missing peer goes unnoticed by it); it still counts.
/// Every operation is counted once it completed, never when it failed or passed its deadline (a CollectiveError
/// leaves traffic() as it was), so the counters say what the group did move.

/// Calls and bytes of one kind of collective on this rank.
struct OpTraffic {
  int64_t calls = 0;
  int64_t bytes = 0;    // sent by this rank, by the model in Traffic's comment
  double wait_s = 0;    // seconds blocked in Pending::wait() of the completed asynchronous ones (all-reduce, send)
};

/// What this rank put on the wire, per operation, counted by the ring model (Gloo reports no counters of its own).
/// n is the tensor's size in bytes, M the group's world:
///   all-reduce 2(M−1)/M·n; reduce-scatter (M−1)/M·n of the full input (either algorithm); all-gather (M−1)/M·n of
///   the full output; all-to-all (M−1)/M·n of the input; broadcast n on the root, 0 elsewhere; reduce n on every
///   non-root (its whole contribution leaves it once), 0 on the root; barrier 0; send n, recv 0.
struct Traffic {
  OpTraffic all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, reduce, barrier;
  OpTraffic send;  // point-to-point (pipeline stages): n per send, 0 per recv
  /// Bytes over all operations.
  int64_t bytes() const {
    return all_reduce.bytes + reduce_scatter.bytes + all_gather.bytes + all_to_all.bytes + broadcast.bytes +
           reduce.bytes + send.bytes;
  }
};

/// Whether `store` names a TCP rendezvous ("tcp://HOST:PORT") rather than a FileStore path.
bool is_tcp_rendezvous(const std::string& store);

/// How the M workers find each other (docs/protocol.md §11 "Across hosts").
struct CollectiveOptions {
  std::string store;                 // where the ranks meet: a c10d FileStore path, the same for every rank (one
                                     // machine or a shared filesystem; a fresh path per group), or "tcp://HOST:PORT":
                                     // a c10d TCPStore that rank 0 serves on PORT (every interface) and the others
                                     // dial at HOST (a new group may reuse the port: the store lives in rank 0)
  int rank = 0;                      // 0 … world − 1
  int world = 1;                     // M
  std::string hostname = "";         // address Gloo binds and advertises to its peers; "" = 127.0.0.1 for a file
                                     // store, this machine's address on the route to HOST for tcp://
  double timeout_s = 120;            // deadline of every collective (and of the rendezvous unless set below), s
  double rendezvous_timeout_s = 0;   // deadline of joining, s; 0 = timeout_s (a learner group's ranks wait
                                     // longer: their leader joins only after its bootstrap from the syncer)
  std::string secret = "";           // the run secret (run.secret / DLOCO_SECRET): each rank proves it holds it
                                     // (HMAC-SHA256 over a nonce rank 0 draws) before Gloo joins, and a group with
                                     // a rank that cannot is refused. "" = no proof (then every rank must have "").
                                     // It keeps out a rank of another run or secret, not an attacker on the
                                     // network (docs/protocol.md §11)
  bool trusted_network = false;      // run.trusted_network: Gloo's own traffic is neither authenticated nor
                                     // encrypted (Gloo 1.13 has no TLS) and a TCP store listens on every interface,
                                     // so a group with a tcp:// store or a Gloo address off loopback is refused
                                     // unless this is set
};

struct Config;

/// Fills o.secret (the run secret: env DLOCO_SECRET, else run.secret) and o.trusted_network (run.trusted_network)
/// from `config`. Throws InputError when DLOCO_SECRET is malformed.
void apply_run_security(CollectiveOptions& o, const Config& config);

/// The rendezvous of the group that rank `rank` of every learner group forms beside `store` (dp over learner groups):
/// "<store>.rank_<r>" for a file, "<store>/rank_<r>" for tcp:// (a group inside that store, whose rank 0 serves it).
std::string replica_rendezvous(const std::string& store, int rank);

/// A Gloo process group of M ranks. Thread-compatible: call from one thread. Tensors must be dense, contiguous,
/// on the CPU, with the same shape and dtype on every rank.
class Collective {
 public:
  /// Joins the group (blocks until all M ranks have joined, up to rendezvous_timeout_s, or timeout_s when 0).
  /// Throws CollectiveError on timeout, a transport failure, a port rank 0 cannot listen on, a rank claimed by two
  /// processes, or a rank whose proof of the secret does not match (the message names it); InputError on an invalid
  /// rank/world, a malformed tcp:// address, no route to its host (or one through loopback only), or a TCP store or
  /// Gloo address off loopback without trusted_network.
  explicit Collective(const CollectiveOptions& options);
  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  /// The deadline of each operation started from now on, s (a learner group tightens it around its steps:
  /// parallel/step_deadline.h). Throws InputError unless > 0.
  void set_timeout(double seconds);
  double timeout_s() const { return static_cast<double>(timeout_.count()) / 1000.0; }

  /// An all-reduce or send in flight; wait() blocks until it is done (deadline: timeout_s from the start of the
  /// wait). The operation enters traffic() when wait() returns, not when it starts: a failed one is not counted.
  /// Call wait() once, while the Collective that started it is alive (it adds to that group's counters).
  class Pending {
   public:
    Pending() = default;
    /// Throws CollectiveError when the collective failed or timed out (nothing counted then).
    void wait();
    bool valid() const { return work_ != nullptr; }

   private:
    friend class Collective;
    std::shared_ptr<void> work_;  // c10d::Work, type-erased so this header stays free of c10d
    std::chrono::milliseconds timeout_{0};
    OpTraffic* counter_ = nullptr;  // the owning group's counter this operation adds to once it completed
    int64_t bytes_ = 0;             // what it adds to counter_->bytes
  };

  /// Sums `tensor` across all ranks in place, asynchronously. Counts 2·(M−1)/M·bytes as sent (a ring all-reduce)
  /// once wait() returned.
  Pending allreduce_sum_async(torch::Tensor tensor);

  /// Blocking all-reduce (sum) in place. Throws CollectiveError on failure or timeout.
  void allreduce_sum(torch::Tensor tensor) { allreduce_sum_async(std::move(tensor)).wait(); }

  /// Copies rank `root`'s tensor into every rank's `tensor`, blocking. Throws CollectiveError.
  void broadcast(torch::Tensor tensor, int root = 0);

  /// A new group of the ranks `ranks` (ranks of this group, each once, this rank among them), e.g. the TP, DP or
  /// PP group of a learner's rank (parallel/layout.h). Every listed rank calls it with the same list and name, in
  /// the same order relative to its other collectives; the others do not call it. The new group's rank is the
  /// index of this rank in `ranks`; it rendezvouses through a prefix ("<name>/<ranks>") of this group's store and
  /// has this group's deadline. Groups of different names may be formed at once (e.g. {0,1},{2,3} and {0,2},{1,3}).
  /// A name is used once per store: re-form a failed group under a new name. Throws InputError on a bad list,
  /// CollectiveError when the others do not join within the deadline.
  std::unique_ptr<Collective> subgroup(const std::vector<int>& ranks, const std::string& name);

  /// Gathers every rank's `input` (any shape, the same on all ranks): returns M new tensors, element r from rank r.
  /// Throws CollectiveError.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& input);

  /// Flat all-gather: shard (n) from every rank into output (M·n), rank r's shard at [r·n, (r+1)·n). Throws
  /// InputError when output.numel() ≠ M·n, CollectiveError on failure.
  void all_gather_flat(torch::Tensor output, const torch::Tensor& shard);

  /// Reduce-scatter (sum): input (M·n) on every rank; output (n) on rank r gets Σ over ranks of input[r·n, (r+1)·n).
  /// `algo` picks the emulation (Gloo has none). Throws InputError when input.numel() ≠ M·output.numel(),
  /// CollectiveError on failure.
  void reduce_scatter_sum(torch::Tensor output, const torch::Tensor& input,
                          ReduceScatterAlgo algo = ReduceScatterAlgo::kAllToAll);

  /// All-to-all with equal chunks: input (M·n), chunk j goes to rank j; output (M·n) gets rank j's chunk r at
  /// [j·n, (j+1)·n). Throws InputError when the sizes differ or are not divisible by M, CollectiveError.
  void all_to_all(torch::Tensor output, const torch::Tensor& input);

  /// Sums `tensor` over all ranks into rank `root`'s `tensor` in place; other ranks' tensors are left undefined in
  /// content (Gloo may use them as scratch). Throws CollectiveError.
  void reduce_sum(torch::Tensor tensor, int root);

  /// Blocks until every rank has called it, or throws CollectiveError at the deadline.
  void barrier();

  /// Per-operation counters of this rank since construction (see Traffic): completed operations only.
  const Traffic& traffic() const { return traffic_; }

  /// Bytes this rank put on the wire so far over all operations by the ring-algorithm count (an all-reduce of n
  /// bytes: 2·(M−1)/M·n; a broadcast: n on the root; the rest as in Traffic). Gloo does not report its own counters.
  int64_t bytes_sent() const { return traffic_.bytes(); }

  // Point-to-point (pipeline stages). Both ends agree on shape and dtype beforehand (the schedule says what moves);
  // a message is matched by (peer, tag), in order per (peer, tag). Tags are ≥ 0. A 0-element tensor moves nothing
  // and returns at once on both ends. The group is unusable after a CollectiveError (as for the collectives).

  /// Starts sending `tensor` to rank `dst` under `tag` and returns at once; Pending::wait() blocks until the data
  /// has left this rank's buffer (deadline: timeout_s). The tensor must not change until then. Counts its bytes as
  /// sent once wait() returned. Throws InputError on a bad peer or tag, CollectiveError when it cannot start.
  Pending isend(torch::Tensor tensor, int dst, int tag = 0);
  /// Blocking send: isend(...).wait(). Throws CollectiveError on failure or when the deadline passes.
  void send(torch::Tensor tensor, int dst, int tag = 0) { isend(std::move(tensor), dst, tag).wait(); }
  /// Receives into `tensor` (already shaped) from rank `src` under `tag`, blocking up to timeout_s. Throws
  /// CollectiveError when the peer does not send in time or the transport fails, InputError on a bad peer or tag.
  void recv(torch::Tensor tensor, int src, int tag = 0);

 private:
  struct Joined {};  // tag of the constructor that joins over an existing store
  Collective(Joined, std::shared_ptr<void> store, int rank, int world, std::chrono::milliseconds timeout,
             std::string hostname);
  void join(const std::string& where, std::chrono::milliseconds rendezvous);

  int rank_ = 0, world_ = 1;
  std::chrono::milliseconds timeout_{0};
  std::string hostname_;
  std::shared_ptr<void> store_;  // c10d::Store the group rendezvoused through; sub-groups prefix it
  std::shared_ptr<void> group_;  // c10d::ProcessGroupGloo
  Traffic traffic_;
};

}  // namespace dloco
