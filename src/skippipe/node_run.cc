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

// A node as a process, with re-routing (docs/skippipe.md "Re-routing around a dead node"): generation g's group is
// the nodes alive after the g-th failure notice, its FileStore <out>/store (g = 0) or <out>/store_<g>.
void run_node(const SkipNodeOptions& o) {
  torch::set_num_threads(1);  // the parent set OMP/BLAS threads to 1 in the environment as well
  // A send on a socket that shut_down_sockets() (or a dead peer) closed must fail as an error, not kill the node
  // with SIGPIPE (seen in CI: a survivor killed by signal 13 while its group was being torn down).
  std::signal(SIGPIPE, SIG_IGN);
  const Config config = load_config(o.config);
  const skippipe::Setting setting = skippipe::load_setting(o.setting);
  std::list<skippipe::Schedule> schedules;  // every schedule a node was built on (nodes keep references)
  schedules.push_back(skippipe::load_schedule(o.schedule, setting));
  const int N = static_cast<int>(setting.node_count());
  if (o.node < 0 || o.node >= N) throw InputError("--node " + std::to_string(o.node) + ": out of range");

  int generation = 0;
  std::vector<int> rank_of(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i) rank_of[static_cast<size_t>(i)] = i;
  auto join = [&](int world) {
    CollectiveOptions copts;
    copts.store_file = o.out_dir / (generation == 0 ? std::string("store") : "store_" + std::to_string(generation));
    copts.rank = rank_of[static_cast<size_t>(o.node)];
    copts.world = world;
    copts.timeout_s = o.timeout_s;
    return std::make_unique<Collective>(copts);
  };
  // Groups and nodes of earlier generations, deliberately never destroyed (see shut_down_sockets).
  struct Abandoned {
    std::vector<std::unique_ptr<Collective>> groups;
    std::vector<std::unique_ptr<SkipPipeNode>> nodes;
    ~Abandoned() {
      for (auto& n : nodes) (void)n.release();
      for (auto& g : groups) (void)g.release();
    }
  } abandoned;
  std::unique_ptr<Collective> group = join(N);

  torch::manual_seed(config.run.seed);
  GPT full(config.model);  // the same initial model on every node
  int built = 0;           // nodes built on the current group: replica sub-Collective names must differ
  // A node on `schedule` in the current group, from `state` (parameters and AdamW) or from `full`.
  auto build = [&](const skippipe::Schedule& schedule, const Snapshot* state) {
    if (state) {
      torch::NoGradGuard no_grad;
      auto params = full->named_parameters();
      for (const auto& [name, t] : state->params) params[name].copy_(t);
    }
    auto node = std::make_unique<SkipPipeNode>(full, setting, schedule, *group, config.train, make_schedule(config),
                                               o.node, rank_of, "_b" + std::to_string(built++));
    node->set_link_time_scale(o.link_scale);
    node->set_compute_time_scale(o.compute_scale);
    if (state) restore_optimizer(*node, state->adamw);
    return node;
  };
  std::unique_ptr<SkipPipeNode> node = build(schedules.back(), nullptr);
  std::unique_ptr<DataStream> stream;
  std::shared_ptr<TokenSplit> split;
  if (node->stage() == 0) split = std::make_shared<TokenSplit>(split_shards(config.data.dir, "train"));
  // Windows consumed before iteration k (every stage-0 node keeps its stream there, data node or not).
  std::vector<int64_t> windows_before{0};
  int64_t stream_at = -1;
  auto position_stream = [&](int64_t k) {
    if (!split || stream_at == windows_before[static_cast<size_t>(k)]) return;
    stream = std::make_unique<DataStream>(split, 0, 1, config.train.batch_size, config.model.seq_len, StreamCursor{});
    for (int64_t i = 0; i < windows_before[static_cast<size_t>(k)]; ++i) stream->skip();
    stream_at = windows_before[static_cast<size_t>(k)];
  };
  std::optional<FailureWatch> watch;
  if (o.reroute) watch.emplace(o.out_dir);

  nlohmann::json iterations = nlohmann::json::array();
  nlohmann::json reroutes = nlohmann::json::array();
  Snapshot snapshots[2];
  const skippipe::Schedule* next_schedule = nullptr;  // the re-plan, taken after the redone iteration
  bool redoing = false;
  int64_t k = 0;
  while (true) {
    int64_t completed = k;
    try {
      if (k < o.iterations) {
        snapshots[k % 2] = capture(*node, k);
        if (k == o.die_at_iteration && o.die_at_op < 0) {
          std::fprintf(stderr, "[skippipe node %d iteration %lld] killing itself (fault injected for a test)\n",
                       o.node, static_cast<long long>(k));
          std::fflush(stderr);
          ::kill(::getpid(), SIGKILL);
        }
        if (k == o.die_at_iteration) {
          node->set_after_op([&o, k](int op) {
            if (op != o.die_at_op) return;
            std::fprintf(stderr, "[skippipe node %d iteration %lld] killing itself after operation %d (fault "
                         "injected for a test)\n", o.node, static_cast<long long>(k), op);
            std::fflush(stderr);
            ::kill(::getpid(), SIGKILL);
          });
        }
        if (k == o.hang_at_iteration) {
          std::fprintf(stderr, "[skippipe node %d iteration %lld] hanging (fault injected for a test)\n", o.node,
                       static_cast<long long>(k));
          std::fflush(stderr);
          for (;;) ::pause();  // until a signal ends the process
        }
        position_stream(k);
        const auto began = Clock::now();
        const SkipIterationStats s = node->run_iteration(stream.get(), k);
        const double wall = std::chrono::duration<double>(Clock::now() - began).count();
        const auto W = static_cast<int64_t>(node->schedule().micro_batches.size());
        windows_before.resize(static_cast<size_t>(k) + 1);
        windows_before.push_back(windows_before[static_cast<size_t>(k)] + W);
        if (stream && node->data_node()) stream_at = windows_before[static_cast<size_t>(k) + 1];  // else unmoved
        node->set_after_op(nullptr);
        auto record = to_json(s, k, wall);
        record["generation"] = generation;
        record["redone"] = redoing;
        iterations.push_back(record);
        std::printf("[skippipe node %d iteration %lld] loss %.6f grad_norm %.6f wall %.3f s sent %lld B%s\n", o.node,
                    static_cast<long long>(k), s.loss, s.grad_norm, wall, static_cast<long long>(s.bytes_sent),
                    redoing ? " (redone after a failure)" : "");
        std::fflush(stdout);
        redoing = false;
        ++k;
        if (next_schedule) {  // the redone iteration is over: the re-plan from the next iteration on
          Snapshot now = capture(*node, k);
          abandoned.nodes.push_back(std::move(node));
          node = build(*next_schedule, &now);
          next_schedule = nullptr;
        }
        continue;
      }
      // The last iteration is done: wait for the parent's release, or a failure notice (a peer may still need this
      // node to redo an iteration).
      if (!o.reroute) break;
      write_json(o.out_dir / ("finished_" + std::to_string(o.node) + ".json"),
                 {{"node", o.node}, {"generation", generation}, {"completed", k}});
      const auto until = Clock::now() + std::chrono::duration<double>(o.timeout_s);
      bool released = false;
      while (Clock::now() < until && !watch->notice_seen(generation + 1)) {
        std::error_code ec;
        if (fs::exists(o.out_dir / ("release_" + std::to_string(generation) + ".json"), ec)) {
          released = true;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      if (released) break;
      if (!watch->notice_seen(generation + 1)) throw CollectiveError("no release from the parent within the deadline");
      throw CollectiveError("a failure notice after the last iteration");
    } catch (const CollectiveError& e) {
      if (!o.reroute) throw;
      // 1. The parent's notice of who died (it writes it once it reaped the node), then the old group torn down.
      const int g = generation + 1;
      const auto notice = wait_for_json(o.out_dir / ("reroute_" + std::to_string(g) + ".json"), o.timeout_s);
      if (!notice) throw;  // no node died: a hang or a real error, as without re-routing
      if (!watch->wait_swept(g, o.timeout_s)) throw;
      std::fprintf(stderr, "[skippipe node %d] iteration %lld stopped (%s): node(s) %s died, waiting for the plan\n",
                   o.node, static_cast<long long>(completed), e.what(), (*notice)["dead"].dump().c_str());
      // 2. How far this node got; the parent answers with the iteration to redo and the schedules.
      write_json(o.out_dir / ("ack_" + std::to_string(g) + "_" + std::to_string(o.node) + ".json"),
                 {{"node", o.node}, {"generation", g}, {"completed", completed}});
      const auto plan = wait_for_json(o.out_dir / ("plan_" + std::to_string(g) + ".json"), o.timeout_s);
      if (!plan) throw CollectiveError("no re-routing plan from the parent within the deadline");
      // The plan comes from the parent, but it is still input: every field is checked before anything is torn down.
      if (plan->contains("abort") && (*plan)["abort"].is_string()) {
        throw CollectiveError("the parent stopped the run: " + (*plan)["abort"].get<std::string>());
      }
      int64_t redo = -1;
      int world = 0;
      std::vector<int> ranks;
      std::string redo_file, next_file;
      try {
        redo = (*plan).at("redo_iteration").get<int64_t>();
        world = (*plan).at("world").get<int>();
        ranks = (*plan).at("rank_of_node").get<std::vector<int>>();
        redo_file = (*plan).at("redo_schedule").get<std::string>();
        next_file = (*plan).at("next_schedule").get<std::string>();
        if ((*plan).at("generation").get<int>() != g) throw std::invalid_argument("another generation");
      } catch (const std::exception& bad) {
        throw CollectiveError("malformed re-routing plan " + std::to_string(g) + ": " + bad.what());
      }
      if (redo == o.iterations && completed == o.iterations) {
        // The node died after every survivor finished the last iteration: nothing to redo.
        reroutes.push_back({{"generation", g}, {"dead", (*notice)["dead"]}, {"completed", completed},
                            {"redo_iteration", redo}});
        break;
      }
      if (redo < 0 || redo > completed || redo < completed - 1) {
        throw CollectiveError("the plan redoes iteration " + std::to_string(redo) + " but this node completed " +
                              std::to_string(completed) + " (it keeps snapshots of the last two)");
      }
      std::set<int> taken;
      bool ranks_ok = static_cast<int>(ranks.size()) == N && world >= 1 && world <= N;
      for (int r : ranks) ranks_ok = ranks_ok && r >= -1 && r < world && (r < 0 || taken.insert(r).second);
      if (!ranks_ok || ranks[static_cast<size_t>(o.node)] < 0 || static_cast<int>(taken.size()) != world) {
        throw CollectiveError("malformed re-routing plan " + std::to_string(g) + ": rank_of_node must give " +
                              std::to_string(world) + " distinct ranks to the survivors, this node among them");
      }
      const Snapshot* state = nullptr;
      for (const auto& snap : snapshots) {
        if (snap.iteration == redo) state = &snap;
      }
      if (!state) {
        throw CollectiveError("the plan redoes iteration " + std::to_string(redo) + ", which this node has no "
                              "snapshot of");
      }
      const Snapshot restored = *state;
      skippipe::Schedule redo_schedule, replanned;
      try {
        redo_schedule = skippipe::load_schedule(redo_file, setting);
        replanned = skippipe::load_schedule(next_file, setting);
      } catch (const InputError& bad) {
        throw CollectiveError("the re-routing plan " + std::to_string(g) + "'s schedules: " + bad.what());
      }
      for (const auto* sch : {&redo_schedule, &replanned}) {
        if (sch->stage_of_node[static_cast<size_t>(o.node)] != node->stage()) {
          throw CollectiveError("the re-routing plan " + std::to_string(g) + " moves node " + std::to_string(o.node) +
                                " out of stage " + std::to_string(node->stage()) + " (a node keeps its stage)");
        }
      }
      // 3. The next generation's group and node: the re-routed schedule for the redone iteration, then the re-plan.
      rank_of = ranks;
      generation = g;
      abandoned.groups.push_back(std::move(group));
      abandoned.nodes.push_back(std::move(node));
      group = join(world);
      built = 0;
      schedules.push_back(std::move(redo_schedule));
      node = build(schedules.back(), &restored);
      schedules.push_back(std::move(replanned));
      next_schedule = &schedules.back();
      reroutes.push_back({{"generation", g}, {"dead", (*notice)["dead"]}, {"completed", completed},
                          {"redo_iteration", redo}});
      k = redo;
      redoing = true;
      while (static_cast<int64_t>(iterations.size()) > redo) iterations.erase(iterations.size() - 1);
      stream_at = -1;  // repositioned at windows_before[redo]
    }
  }
  const auto [hash, count] = parameter_hash(node->named_parameters());
  const nlohmann::json out = {{"node", o.node},     {"stage", node->stage()}, {"iterations", iterations},
                              {"param_hash", hash}, {"param_count", count},   {"reroutes", reroutes}};
  write_json(o.out_dir / ("node_" + std::to_string(o.node) + ".json"), out);
}

}  // namespace

int run_skippipe_node(const SkipNodeOptions& o) {
  try {
    run_node(o);
  } catch (const CollectiveError& e) {
    std::fprintf(stderr, "[skippipe node %d] stopped: %s\n", o.node, e.what());
    return kSkipNodePeerFailedExit;
  }
  return 0;
}

}  // namespace dloco
