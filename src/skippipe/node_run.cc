// One SkipPipe node as a process; see node_run.h.
#include "skippipe/node_run.h"

#include <signal.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <list>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/config.h"
#include "data/shards.h"
#include "data/stream.h"
#include "process/atomic_file.h"
#include "process/json_file.h"
#include "skippipe/node.h"
#include "skippipe/schedule.h"
#include "skippipe/setting.h"
#include "train/trainer.h"

namespace dloco {
namespace {

// FNV-1a 64 over every parameter's name and fp32 bytes, in name order: equal hashes = bitwise equal replicas.
std::pair<std::string, int64_t> parameter_hash(const std::map<std::string, torch::Tensor>& params) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&h](const unsigned char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  };
  int64_t count = 0;
  for (const auto& [name, t] : params) {
    mix(reinterpret_cast<const unsigned char*>(name.data()), name.size());
    const torch::Tensor c = t.detach().to(torch::kFloat32).contiguous();
    mix(static_cast<const unsigned char*>(c.data_ptr()), static_cast<size_t>(c.numel()) * sizeof(float));
    count += c.numel();
  }
  std::ostringstream hex;
  hex << std::hex << std::setw(16) << std::setfill('0') << h;
  return {hex.str(), count};
}

nlohmann::json to_json(const SkipIterationStats& s, int64_t iteration, double wall_s) {
  return {{"iteration", iteration},         {"wall_s", wall_s},
          {"loss", s.loss},                 {"grad_norm", s.grad_norm},
          {"lr", s.lr},                     {"skipped", s.skipped},
          {"micro_batches", s.micro_batches}, {"peak_held", s.peak_held},
          {"bytes_sent", s.bytes_sent},     {"allreduce_bytes", s.allreduce_bytes},
          {"link_wait_s", s.link_wait_s},   {"delayed_messages", s.delayed_messages},
          {"compute_pad_s", s.compute_pad_s}};
}

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A node's state at the start of an iteration: what a roll-back restores (docs/skippipe.md "Re-routing around a
// dead node": nodes may be one iteration apart when a node dies in the closing all-gather).
struct Snapshot {
  int64_t iteration = -1;
  std::map<std::string, torch::Tensor> params;  // by full-model name, cloned
  std::string adamw;                            // the optimizer's state, serialized
};

Snapshot capture(SkipPipeNode& node, int64_t iteration) {
  Snapshot s;
  s.iteration = iteration;
  for (const auto& [name, t] : node.named_parameters()) s.params[name] = t.detach().clone();
  torch::serialize::OutputArchive archive;
  node.optimizer().save(archive);
  std::ostringstream os;
  archive.save_to(os);
  s.adamw = os.str();
  return s;
}

void restore_optimizer(SkipPipeNode& node, const std::string& adamw) {
  torch::serialize::InputArchive archive;
  std::istringstream is(adamw);
  archive.load_from(is);
  node.optimizer().load(archive);
}

// Waits up to `timeout_s` for `path` to exist and parses it; nullopt at the deadline.
std::optional<nlohmann::json> wait_for_json(const fs::path& path, double timeout_s) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < until) {
    std::error_code ec;
    // written atomically: a file that does not parse is someone else's; wait on and time out
    if (fs::exists(path, ec)) {
      if (auto j = try_read_json_file(path)) return j;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::nullopt;
}

// Shuts every socket of this process down (the node's Gloo pairs: a `skippipe node` has no other sockets), so that
// every blocked send, receive and collective of the old group fails at once, here and on every peer waiting on this
// node. The old group is then abandoned, never destroyed (its destructor could wait on work that will not finish).
int shut_down_sockets() {
  int count = 0;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && ::shutdown(fd, SHUT_RDWR) == 0) ++count;
  }
  return count;
}

// Watches out_dir for the parent's failure notice of the next generation (reroute_<g>.json) and shuts the sockets
// down when it appears; the main thread waits for `swept` before it forms the next group.
class FailureWatch {
 public:
  explicit FailureWatch(fs::path dir) : dir_(std::move(dir)), thread_([this] { loop(); }) {}
  ~FailureWatch() {
    stop_ = true;
    thread_.join();
  }
  /// Waits until the notice of generation g was seen and the sockets shut down; false at the deadline.
  bool wait_swept(int g, double timeout_s) {
    const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (swept_.load() < g) {
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
  bool notice_seen(int g) const { return swept_.load() >= g; }

 private:
  void loop() {
    while (!stop_) {
      const int next = swept_.load() + 1;
      std::error_code ec;
      if (fs::exists(dir_ / ("reroute_" + std::to_string(next) + ".json"), ec)) {
        shut_down_sockets();
        swept_ = next;
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  fs::path dir_;
  std::atomic<int> swept_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void write_json(const fs::path& path, const nlohmann::json& j) { write_file_atomically(path, j.dump(1) + "\n"); }

// A re-routing plan from the parent (plan_<g>.json), checked before anything is torn down: it comes from the
// parent, but it is still input.
struct ReroutePlan {
  int64_t redo = -1;        // the iteration the survivors redo
  int world = 0;            // the next group's size
  std::vector<int> ranks;   // rank_of_node: each node's rank in the next group, −1 for the dead
  std::string redo_file, next_file;  // the re-routed schedule of the redone iteration; the re-plan after it
};

// A node as a process, with re-routing (docs/skippipe.md "Re-routing around a dead node"): generation g's group is
// the nodes alive after the g-th failure notice, its FileStore <out>/store (g = 0) or <out>/store_<g>. run() reads
// as its steps: run an iteration (after injecting a test's fault), wait for the parent's release after the last,
// and on a peer's death: read the notice, report how far this node got, read and check the plan, form the next
// generation.
class NodeProcess {
 public:
  explicit NodeProcess(const SkipNodeOptions& o);
  void run();

 private:
  std::unique_ptr<Collective> join(int world);
  std::unique_ptr<SkipPipeNode> build(const skippipe::Schedule& schedule, const Snapshot* state);
  void position_stream(int64_t k);
  void inject_faults(int64_t k);
  void run_iteration();
  bool await_release();  // true: released; throws CollectiveError on a failure notice or at the deadline
  bool reroute(const CollectiveError& error, int64_t completed);  // false: nothing to redo, the run is over
  ReroutePlan read_plan(int g, int64_t completed) const;
  void write_result();

  // Groups and nodes of earlier generations, deliberately never destroyed (see shut_down_sockets).
  struct Abandoned {
    std::vector<std::unique_ptr<Collective>> groups;
    std::vector<std::unique_ptr<SkipPipeNode>> nodes;
    ~Abandoned() {
      for (auto& n : nodes) (void)n.release();
      for (auto& g : groups) (void)g.release();
    }
  };

  const SkipNodeOptions& o_;
  const Config config_;
  const skippipe::Setting setting_;
  std::list<skippipe::Schedule> schedules_;  // every schedule a node was built on (nodes keep references)
  int N_ = 0;
  int generation_ = 0;
  std::vector<int> rank_of_;
  Abandoned abandoned_;
  std::unique_ptr<Collective> group_;
  GPT full_{nullptr};  // the same initial model on every node
  int built_ = 0;      // nodes built on the current group: replica sub-Collective names must differ
  std::unique_ptr<SkipPipeNode> node_;
  std::shared_ptr<TokenSplit> split_;
  std::unique_ptr<DataStream> stream_;
  std::vector<int64_t> windows_before_{0};  // windows consumed before iteration k (every stage-0 node keeps its
                                            // stream there, data node or not)
  int64_t stream_at_ = -1;
  std::optional<FailureWatch> watch_;
  nlohmann::json iterations_ = nlohmann::json::array();
  nlohmann::json reroutes_ = nlohmann::json::array();
  Snapshot snapshots_[2];
  const skippipe::Schedule* next_schedule_ = nullptr;  // the re-plan, taken after the redone iteration
  bool redoing_ = false;
  int64_t k_ = 0;  // the next iteration
};

NodeProcess::NodeProcess(const SkipNodeOptions& o)
    : o_(o), config_(load_config(o.config)), setting_(skippipe::load_setting(o.setting)) {
  schedules_.push_back(skippipe::load_schedule(o.schedule, setting_));
  N_ = static_cast<int>(setting_.node_count());
  if (o.node < 0 || o.node >= N_) throw InputError("--node " + std::to_string(o.node) + ": out of range");
  if (o.reroute && is_tcp_rendezvous(o.store)) {
    throw InputError("--reroute needs the nodes' file stores (<out>/store_<g>): a group re-formed without a dead "
                     "node 0 has nobody to serve " + o.store);
  }
  for (int i = 0; i < N_; ++i) rank_of_.push_back(i);
  group_ = join(N_);
  torch::manual_seed(config_.run.seed);
  full_ = GPT(config_.model);
  node_ = build(schedules_.back(), nullptr);
  if (node_->stage() == 0) split_ = std::make_shared<TokenSplit>(split_shards(config_.data.dir, "train"));
  if (o.reroute) watch_.emplace(o.out_dir);
}

std::unique_ptr<Collective> NodeProcess::join(int world) {
  CollectiveOptions copts;
  copts.store = !o_.store.empty() ? o_.store
                : (o_.out_dir / (generation_ == 0 ? std::string("store") : "store_" + std::to_string(generation_))).string();
  copts.hostname = o_.host;
  apply_run_security(copts, config_);
  copts.rank = rank_of_[static_cast<size_t>(o_.node)];
  copts.world = world;
  copts.timeout_s = o_.timeout_s;
  return std::make_unique<Collective>(copts);
}

// A node on `schedule` in the current group, from `state` (parameters and AdamW) or from the initial model.
std::unique_ptr<SkipPipeNode> NodeProcess::build(const skippipe::Schedule& schedule, const Snapshot* state) {
  if (state) {
    torch::NoGradGuard no_grad;
    auto params = full_->named_parameters();
    for (const auto& [name, t] : state->params) params[name].copy_(t);
  }
  auto node = std::make_unique<SkipPipeNode>(full_, setting_, schedule, *group_, config_.train, make_schedule(config_),
                                             o_.node, rank_of_, "_b" + std::to_string(built_++));
  node->set_link_time_scale(o_.link_scale);
  node->set_compute_time_scale(o_.compute_scale);
  if (state) restore_optimizer(*node, state->adamw);
  return node;
}

void NodeProcess::position_stream(int64_t k) {
  if (!split_ || stream_at_ == windows_before_[static_cast<size_t>(k)]) return;
  stream_ = std::make_unique<DataStream>(config_stream(split_, 0, 1, config_, StreamCursor{}));
  for (int64_t i = 0; i < windows_before_[static_cast<size_t>(k)]; ++i) stream_->skip();
  stream_at_ = windows_before_[static_cast<size_t>(k)];
}

// The faults a test asks for at iteration k: die before it, die after one of its operations, or hang.
void NodeProcess::inject_faults(int64_t k) {
  const int node = o_.node, die_at_op = o_.die_at_op;
  if (k == o_.die_at_iteration && die_at_op < 0) {
    spdlog::warn("[skippipe node {} iteration {}] killing itself (fault injected for a test)", node,
                 static_cast<long long>(k));
    ::kill(::getpid(), SIGKILL);
  }
  if (k == o_.die_at_iteration) {
    node_->set_after_op([node, die_at_op, k](int op) {
      if (op != die_at_op) return;
      spdlog::warn("[skippipe node {} iteration {}] killing itself after operation {} (fault injected for a test)",
                   node, static_cast<long long>(k), op);
      ::kill(::getpid(), SIGKILL);
    });
  }
  if (k == o_.hang_at_iteration) {
    spdlog::warn("[skippipe node {} iteration {}] hanging (fault injected for a test)", node,
                 static_cast<long long>(k));
    for (;;) ::pause();  // until a signal ends the process
  }
}

// Iteration k_: snapshot (what a roll-back restores), faults, the iteration, its record; after a redone iteration
// the re-plan takes over.
void NodeProcess::run_iteration() {
  const int64_t k = k_;
  snapshots_[k % 2] = capture(*node_, k);
  inject_faults(k);
  position_stream(k);
  const auto began = Clock::now();
  const SkipIterationStats s = node_->run_iteration(stream_.get(), k);
  const double wall = std::chrono::duration<double>(Clock::now() - began).count();
  const auto W = static_cast<int64_t>(node_->schedule().micro_batches.size());
  windows_before_.resize(static_cast<size_t>(k) + 1);
  windows_before_.push_back(windows_before_[static_cast<size_t>(k)] + W);
  if (stream_ && node_->data_node()) stream_at_ = windows_before_[static_cast<size_t>(k) + 1];  // else unmoved
  node_->set_after_op(nullptr);
  auto record = to_json(s, k, wall);
  record["generation"] = generation_;
  record["redone"] = redoing_;
  iterations_.push_back(record);
  spdlog::info("[skippipe node {} iteration {}] loss {:.6f} grad_norm {:.6f} wall {:.3f} s sent {} B{}", o_.node,
               static_cast<long long>(k), s.loss, s.grad_norm, wall, static_cast<long long>(s.bytes_sent),
               redoing_ ? " (redone after a failure)" : "");
  redoing_ = false;
  ++k_;
  if (next_schedule_) {  // the redone iteration is over: the re-plan from the next iteration on
    Snapshot now = capture(*node_, k_);
    abandoned_.nodes.push_back(std::move(node_));
    node_ = build(*next_schedule_, &now);
    next_schedule_ = nullptr;
  }
}

// After the last iteration: the parent's release, or a failure notice (a peer may still need this node to redo an
// iteration).
bool NodeProcess::await_release() {
  write_json(o_.out_dir / ("finished_" + std::to_string(o_.node) + ".json"),
             {{"node", o_.node}, {"generation", generation_}, {"completed", k_}});
  const auto until = Clock::now() + std::chrono::duration<double>(o_.timeout_s);
  while (Clock::now() < until && !watch_->notice_seen(generation_ + 1)) {
    std::error_code ec;
    if (fs::exists(o_.out_dir / ("release_" + std::to_string(generation_) + ".json"), ec)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (!watch_->notice_seen(generation_ + 1)) throw CollectiveError("no release from the parent within the deadline");
  throw CollectiveError("a failure notice after the last iteration");
}

ReroutePlan NodeProcess::read_plan(int g, int64_t completed) const {
  const auto plan = wait_for_json(o_.out_dir / ("plan_" + std::to_string(g) + ".json"), o_.timeout_s);
  if (!plan) throw CollectiveError("no re-routing plan from the parent within the deadline");
  if (plan->contains("abort") && (*plan)["abort"].is_string()) {
    throw CollectiveError("the parent stopped the run: " + (*plan)["abort"].get<std::string>());
  }
  ReroutePlan r;
  try {
    r.redo = plan->at("redo_iteration").get<int64_t>();
    r.world = plan->at("world").get<int>();
    r.ranks = plan->at("rank_of_node").get<std::vector<int>>();
    r.redo_file = plan->at("redo_schedule").get<std::string>();
    r.next_file = plan->at("next_schedule").get<std::string>();
    if (plan->at("generation").get<int>() != g) throw std::invalid_argument("another generation");
  } catch (const std::exception& bad) {
    throw CollectiveError("malformed re-routing plan " + std::to_string(g) + ": " + bad.what());
  }
  if (r.redo == o_.iterations && completed == o_.iterations) return r;  // nothing to redo: the caller ends
  if (r.redo < 0 || r.redo > completed || r.redo < completed - 1) {
    throw CollectiveError("the plan redoes iteration " + std::to_string(r.redo) + " but this node completed " +
                          std::to_string(completed) + " (it keeps snapshots of the last two)");
  }
  std::set<int> taken;
  bool ranks_ok = static_cast<int>(r.ranks.size()) == N_ && r.world >= 1 && r.world <= N_;
  for (int rank : r.ranks) {
    ranks_ok = ranks_ok && rank >= -1 && rank < r.world && (rank < 0 || taken.insert(rank).second);
  }
  if (!ranks_ok || r.ranks[static_cast<size_t>(o_.node)] < 0 || static_cast<int>(taken.size()) != r.world) {
    throw CollectiveError("malformed re-routing plan " + std::to_string(g) + ": rank_of_node must give " +
                          std::to_string(r.world) + " distinct ranks to the survivors, this node among them");
  }
  return r;
}

// A peer died (docs/skippipe.md "Re-routing around a dead node"). Returns false when every survivor had finished:
// nothing to redo.
bool NodeProcess::reroute(const CollectiveError& error, int64_t completed) {
  // 1. The parent's notice of who died (it writes it once it reaped the node), then the old group torn down.
  const int g = generation_ + 1;
  const auto notice = wait_for_json(o_.out_dir / ("reroute_" + std::to_string(g) + ".json"), o_.timeout_s);
  if (!notice) throw error;  // no node died: a hang or a real error, as without re-routing
  if (!watch_->wait_swept(g, o_.timeout_s)) throw error;
  spdlog::warn("[skippipe node {}] iteration {} stopped ({}): node(s) {} died, waiting for the plan", o_.node,
               static_cast<long long>(completed), error.what(), (*notice)["dead"].dump());
  // 2. How far this node got; the parent answers with the iteration to redo and the schedules.
  write_json(o_.out_dir / ("ack_" + std::to_string(g) + "_" + std::to_string(o_.node) + ".json"),
             {{"node", o_.node}, {"generation", g}, {"completed", completed}});
  const ReroutePlan plan = read_plan(g, completed);
  reroutes_.push_back({{"generation", g}, {"dead", (*notice)["dead"]}, {"completed", completed},
                       {"redo_iteration", plan.redo}});
  if (plan.redo == o_.iterations && completed == o_.iterations) return false;
  const Snapshot* state = nullptr;
  for (const auto& snap : snapshots_) {
    if (snap.iteration == plan.redo) state = &snap;
  }
  if (!state) {
    throw CollectiveError("the plan redoes iteration " + std::to_string(plan.redo) + ", which this node has no "
                          "snapshot of");
  }
  const Snapshot restored = *state;
  skippipe::Schedule redo_schedule, replanned;
  try {
    redo_schedule = skippipe::load_schedule(plan.redo_file, setting_);
    replanned = skippipe::load_schedule(plan.next_file, setting_);
  } catch (const InputError& bad) {
    throw CollectiveError("the re-routing plan " + std::to_string(g) + "'s schedules: " + bad.what());
  }
  for (const auto* sch : {&redo_schedule, &replanned}) {
    if (sch->stage_of_node[static_cast<size_t>(o_.node)] != node_->stage()) {
      throw CollectiveError("the re-routing plan " + std::to_string(g) + " moves node " + std::to_string(o_.node) +
                            " out of stage " + std::to_string(node_->stage()) + " (a node keeps its stage)");
    }
  }
  // 3. The next generation's group and node: the re-routed schedule for the redone iteration, then the re-plan.
  rank_of_ = plan.ranks;
  generation_ = g;
  abandoned_.groups.push_back(std::move(group_));
  abandoned_.nodes.push_back(std::move(node_));
  group_ = join(plan.world);
  built_ = 0;
  schedules_.push_back(std::move(redo_schedule));
  node_ = build(schedules_.back(), &restored);
  schedules_.push_back(std::move(replanned));
  next_schedule_ = &schedules_.back();
  k_ = plan.redo;
  redoing_ = true;
  while (static_cast<int64_t>(iterations_.size()) > plan.redo) iterations_.erase(iterations_.size() - 1);
  stream_at_ = -1;  // repositioned at windows_before_[redo]
  return true;
}

void NodeProcess::write_result() {
  const auto [hash, count] = parameter_hash(node_->named_parameters());
  const nlohmann::json out = {{"node", o_.node},     {"stage", node_->stage()}, {"iterations", iterations_},
                              {"param_hash", hash}, {"param_count", count},    {"reroutes", reroutes_}};
  write_json(o_.out_dir / ("node_" + std::to_string(o_.node) + ".json"), out);
}

void NodeProcess::run() {
  for (;;) {
    const int64_t completed = k_;
    try {
      if (k_ < o_.iterations) {
        run_iteration();
        continue;
      }
      if (!o_.reroute || await_release()) break;
    } catch (const CollectiveError& e) {
      if (!o_.reroute) throw;
      if (!reroute(e, completed)) break;
    }
  }
  write_result();
}

void run_node(const SkipNodeOptions& o) {
  torch::set_num_threads(1);  // the parent set OMP/BLAS threads to 1 in the environment as well
  // A send on a socket that shut_down_sockets() (or a dead peer) closed must fail as an error, not kill the node
  // with SIGPIPE (seen in CI: a survivor killed by signal 13 while its group was being torn down).
  std::signal(SIGPIPE, SIG_IGN);
  NodeProcess(o).run();
}

}  // namespace

int run_skippipe_node(const SkipNodeOptions& o) {
  fs::create_directories(o.out_dir);  // started by hand on another machine, nobody made it there
  try {
    run_node(o);
  } catch (const CollectiveError& e) {
    spdlog::warn("[skippipe node {}] stopped: {}", o.node, e.what());
    return kSkipNodePeerFailedExit;
  }
  return 0;
}

}  // namespace dloco
