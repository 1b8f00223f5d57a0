// c10d adapter; see process_group.h. The only translation unit that includes c10d.
#include "collective/process_group.h"

#include <chrono>

#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <functional>

#include "core/check.h"
#include "core/config.h"
#include "transport/handshake.h"  // run_secret
#include "transport/local_address.h"

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

bool is_tcp_rendezvous(const std::string& store) { return store.rfind("tcp://", 0) == 0; }

void apply_run_security(CollectiveOptions& o, const Config& config) {
  o.secret = run_secret(config);
  o.trusted_network = config.run.trusted_network;
}

std::string replica_rendezvous(const std::string& store, int rank) {
  return store + (is_tcp_rendezvous(store) ? "/rank_" : ".rank_") + std::to_string(rank);
}

namespace {

constexpr const char* kTcp = "tcp://";

// "tcp://HOST:PORT[/PREFIX]" (HOST a name, an IPv4 address or [v6]). Throws InputError when malformed.
struct TcpRendezvous {
  std::string host;    // as written ("[::1]" keeps its brackets: host:port strings need them)
  uint16_t port = 0;
  std::string prefix;  // non-empty: a group that meets inside another group's store (that group's rank 0 serves)
};
TcpRendezvous parse_tcp(const std::string& store) {
  const std::string rest = store.substr(std::string(kTcp).size());
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  const std::string prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  const auto colon = authority.rfind(':');
  const std::string host = colon == std::string::npos ? "" : authority.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : authority.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 && std::all_of(port.begin(), port.end(), ::isdigit);
  if (host.empty() || !digits || std::stoi(port) < 1 || std::stoi(port) > 65535 ||
      (slash != std::string::npos && prefix.empty())) {
    throw InputError("rendezvous '" + store.substr(0, 256) +
                     "' is not tcp://HOST:PORT[/NAME] with a port in [1, 65535]");
  }
  return {host, static_cast<uint16_t>(std::stoi(port)), prefix};
}

// A host as c10d and Gloo take it: "[::1]" -> "::1".
std::string bare(const std::string& host) {
  return host.size() > 2 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
}

// Where Gloo binds: the given address, else loopback for a file store and this machine's address on the route to
// the TCP store's host (what its peers on other machines can dial).
std::string gloo_hostname(const CollectiveOptions& o) {
  if (!o.hostname.empty()) return o.hostname;
  if (!is_tcp_rendezvous(o.store)) return "127.0.0.1";
  const auto [host, port, prefix] = parse_tcp(o.store);
  const std::string address = bare(local_address_towards(host + ":" + std::to_string(port)));
  if (address.empty()) {
    throw InputError("no route from this machine to the rendezvous host '" + host + "' (" + o.store + ")");
  }
  // A name that resolves to this machine's loopback (Debian's /etc/hosts maps the own hostname to 127.0.1.1) would
  // have Gloo advertise an address no other machine reaches: the host is this machine, so its one address off
  // loopback is the one to bind, if it has only one.
  if (is_loopback_host(address) && !is_loopback_host(bare(host))) {
    if (const std::string sole = sole_machine_address(); !sole.empty()) return sole;
    throw InputError("the rendezvous host '" + host + "' resolves to this machine's loopback here, and this machine "
                     "has no single address off loopback, so its peers could not reach this rank's Gloo: give the "
                     "address to bind (--host / --group-host), or name the host by an address its peers dial");
  }
  return address;
}

// Gloo has no TLS: a group that others can reach needs the user's word that the network is trusted. A TCP store
// is reachable whatever its HOST: LibTorch 1.13's TCPStore listens on every interface (it takes no bind address).
void check_trusted(const CollectiveOptions& o, const std::string& hostname) {
  if (o.trusted_network || (!is_tcp_rendezvous(o.store) && is_loopback_host(hostname))) return;
  throw InputError("this group's ranks would meet where other machines reach them (rendezvous '" +
                   o.store.substr(0, 256) + "': a TCP store listens on every interface; Gloo address '" + hostname +
                   "'), and neither the store nor Gloo's traffic is authenticated or encrypted (Gloo 1.13 has no TLS; "
                   "docs/protocol.md §11): set run.trusted_network = true only on a network that nobody but this "
                   "run's machines can reach");
}

std::string hex(const unsigned char* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

// The proof rank `rank` stores with its arrival: HMAC-SHA256(secret, nonce, rank, world) in hex, or a fixed marker
// without a secret. The nonce (rank 0's, then the arriving process's token) makes it new at every rendezvous;
// binding the rank and world keeps one rank's proof from standing in for another's.
std::string proof(const std::string& secret, const std::string& nonce, int rank, int world) {
  if (secret.empty()) return "no secret";
  const std::string message = "dloco rendezvous v2|" + nonce + "|rank " + std::to_string(rank) + "|world " +
                              std::to_string(world);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length) == nullptr) {
    throw CollectiveError("HMAC-SHA256 failed (OpenSSL)");
  }
  return hex(mac, length);
}

std::string text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// Opens the store: a FileStore, or a TCPStore that rank 0 serves. Throws (c10d's errors) when it cannot.
c10::intrusive_ptr<c10d::Store> open_store(const CollectiveOptions& o, std::chrono::milliseconds rendezvous) {
  if (!is_tcp_rendezvous(o.store)) {
    auto store = c10::make_intrusive<c10d::FileStore>(o.store, o.world);
    store->setTimeout(rendezvous);
    return store;
  }
  const TcpRendezvous tcp = parse_tcp(o.store);
  c10d::TCPStoreOptions opts;
  opts.port = tcp.port;
  opts.isServer = o.rank == 0 && tcp.prefix.empty();  // a group inside another's store: that group's rank 0 serves
  opts.numWorkers = c10::nullopt;  // the arrival keys below wait for the ranks, with the secret's proofs
  opts.waitWorkers = false;
  opts.timeout = rendezvous;  // also how long a rank keeps dialing a rank 0 that is not up yet
  auto tcp_store = c10::make_intrusive<c10d::TCPStore>(bare(tcp.host), opts);
  tcp_store->setTimeout(rendezvous);
  if (tcp.prefix.empty()) return tcp_store;
  return c10::make_intrusive<c10d::PrefixStore>(tcp.prefix + "/", tcp_store);
}

// Sets `key` to `value` unless it exists; returns what the key holds afterwards (another writer's value if it came
// first). FileStore and TCPStore both implement compareSet with "expected empty = the key is absent"; TCPStore's
// compareSet does not wake the ranks waiting for the key (measured: they time out), so a won claim is set again.
std::string set_once(c10d::Store& store, const std::string& key, const std::string& value) {
  const std::string held = text(store.compareSet(key, {}, bytes(value)));
  if (held == value) store.set(key, bytes(value));
  return held;
}

// A random hex token of 16 bytes. Throws CollectiveError when OpenSSL cannot draw one.
std::string random_token() {
  unsigned char raw[16];
  if (RAND_bytes(raw, sizeof(raw)) != 1) throw CollectiveError("could not draw random bytes (OpenSSL RAND_bytes)");
  return hex(raw, sizeof(raw));
}

// Every rank arrives before Gloo's own rendezvous starts (Gloo waits for its peers' addresses with the
// collectives' deadline, not the store's, so a longer rendezvous deadline is waited for here), with its proof of
// the run secret; every rank checks every proof, and rank 0's verdict is the group's (docs/protocol.md §11 "Across
// hosts"). Throws CollectiveError naming the ranks whose proofs do not match, or a rank claimed twice.
void arrive(c10d::Store& store, const CollectiveOptions& o, std::chrono::milliseconds rendezvous) {
  const std::string where = "'" + o.store.substr(0, 256) + "'";
  if (o.rank == 0) {
    const std::string drawn = random_token();
    if (set_once(store, "dloco/nonce", drawn) != drawn) {
      throw CollectiveError("refused the group at " + where + ": its store already held a nonce (a store used "
                            "before, or another process wrote it)");
    }
  }
  const std::string nonce = text(store.get("dloco/nonce"));
  // Arrival: "<token>:<proof over the token>", claimed once; a token of this process tells a second process that
  // claims the same rank (or an outsider that came first) from this one.
  const std::string token = random_token();
  const std::string mine = token + ":" + proof(o.secret, nonce + "|" + token, o.rank, o.world);
  const std::string key = "dloco/arrived/" + std::to_string(o.rank);
  if (set_once(store, key, mine) != mine) {
    throw CollectiveError("refused the group at " + where + ": rank " + std::to_string(o.rank) +
                          " was already claimed by another process (a rank started twice, or a process of another "
                          "run at the same rendezvous)");
  }
  std::vector<std::string> arrived;
  for (int r = 0; r < o.world; ++r) arrived.push_back("dloco/arrived/" + std::to_string(r));
  store.wait(arrived, rendezvous);
  std::string refused;
  for (int r = 0; r < o.world; ++r) {
    const std::string value = text(store.get(arrived[static_cast<size_t>(r)]));
    const auto colon = value.find(':');
    const std::string their_token = colon == std::string::npos ? "" : value.substr(0, colon);
    if (colon == std::string::npos ||
        value.substr(colon + 1) != proof(o.secret, nonce + "|" + their_token, r, o.world)) {
      refused += (refused.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  const std::string verdict = refused.empty() ? "ok" : "rank(s) " + refused;
  if (o.rank == 0) store.set("dloco/verdict", bytes(verdict));
  const std::string group_verdict = o.rank == 0 ? verdict : text(store.get("dloco/verdict"));
  store.set("dloco/checked/" + std::to_string(o.rank), bytes("1"));
  if (refused.empty() && group_verdict == "ok") return;
  // The rank serving a TCP store keeps it up until every rank has read the verdict (or 10 s), so each of them
  // fails with this message rather than a closed connection.
  if (o.rank == 0 && is_tcp_rendezvous(o.store) && parse_tcp(o.store).prefix.empty()) {
    std::vector<std::string> checked;
    for (int r = 0; r < o.world; ++r) checked.push_back("dloco/checked/" + std::to_string(r));
    try {
      store.wait(checked, std::min(rendezvous, std::chrono::milliseconds(10000)));
    } catch (const std::exception&) {  // a rank that never reads it: refused all the same
    }
  }
  throw CollectiveError("refused the group at " + where + ": the proof of the run secret of " +
                        (refused.empty() ? group_verdict + " (rank 0's verdict)" : "rank(s) " + refused) +
                        " does not match rank " + std::to_string(o.rank) +
                        "'s (a process of another run, or a different run.secret / DLOCO_SECRET)");
}

}  // namespace

Collective::Collective(const CollectiveOptions& options)
    : rank_(options.rank), world_(options.world), timeout_(to_ms(options.timeout_s)) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    throw InputError("collective rank " + std::to_string(options.rank) + " is outside [0, world = " +
                     std::to_string(options.world) + ")");
  }
  if (is_tcp_rendezvous(options.store)) parse_tcp(options.store);  // InputError when malformed
  hostname_ = gloo_hostname(options);
  check_trusted(options, hostname_);
  const auto rendezvous = options.rendezvous_timeout_s > 0 ? to_ms(options.rendezvous_timeout_s) : timeout_;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = open_store(options, rendezvous);
    arrive(*store, options, rendezvous);
  } catch (const CollectiveError& e) {
    throw CollectiveError("rank " + std::to_string(options.rank) + " of " + std::to_string(options.world) + ": " +
                          e.what());
  } catch (const std::exception& e) {
    throw CollectiveError("rank " + std::to_string(options.rank) + " of " + std::to_string(options.world) +
                          " could not open the store '" + options.store.substr(0, 256) +
                          "' or its peers did not arrive within " + std::to_string(rendezvous.count() / 1000.0) +
                          " s: " + e.what());
  }
  store_ = erase(store);
  join("through '" + options.store.substr(0, 256) + "'", rendezvous);
  store->setTimeout(timeout_);  // sub-groups rendezvous with the collectives' deadline
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

void Collective::set_timeout(double seconds) {
  if (!(seconds > 0)) throw InputError("a collective's deadline must be > 0 s, not " + std::to_string(seconds));
  timeout_ = to_ms(seconds);
}

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
