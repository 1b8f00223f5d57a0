// `dloco skippipe train`; see skippipe_launcher.h.
#include "launcher/skippipe_launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/config.h"
#include "launcher/children.h"
#include "parallel/skip_pipeline_run.h"
#include "pipeline/schedule.h"
#include "pipeline/setting.h"
#include "pipeline/simulator.h"
#include "train/run.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string absolute(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

// Every check that can fail before a process starts. Returns the exact simulator's iteration time (unscaled).
double check_inputs(const SkipTrainOptions& o) {
  if (o.iterations < 1) throw InputError("--iterations " + std::to_string(o.iterations) + ": at least 1");
  if (!std::isfinite(o.link_scale) || o.link_scale < 0) throw InputError("--link-scale: a finite number >= 0");
  if (!std::isfinite(o.compute_scale) || o.compute_scale < 0) {
    throw InputError("--compute-scale: a finite number >= 0");
  }
  if (!std::isfinite(o.timeout_s) || o.timeout_s <= 0) throw InputError("--timeout-s: a finite number > 0");
  const Config config = load_config(o.config);
  check_data_fits_model(config);
  const pipeline::Setting setting = pipeline::load_setting(o.setting);
  const pipeline::Schedule schedule = pipeline::load_schedule(o.schedule, setting);
  for (int64_t n = 0; n < setting.node_count(); ++n) {
    if (schedule.stage_of_node[n] < 0) {
      throw InputError(o.schedule + ": the setting " + o.setting + " has " + std::to_string(setting.node_count()) +
                       " nodes but node " + std::to_string(n) + " is in no stage of the schedule's placement");
    }
  }
  const int64_t S = static_cast<int64_t>(schedule.placement.size());
  if (config.model.n_layer % S != 0) {
    throw InputError(o.schedule + ": " + std::to_string(S) + " stages do not divide model.n_layer = " +
                     std::to_string(config.model.n_layer) + " (each stage holds n_layer / S blocks)");
  }
  if (o.fault_node >= setting.node_count()) throw InputError("DLOCO_SKIPPIPE_KILL/HANG: no such node");
  return pipeline::simulate_exact(setting, schedule).iteration_time_s;  // throws when the schedule deadlocks
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) == kSkipNodePeerFailedExit) {
    return "stopped: a peer failed or a deadline passed";
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended with wait status " + std::to_string(status);
}
bool ok(const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0; }
bool peer_failed(const Child& c) { return WIFEXITED(c.status) && WEXITSTATUS(c.status) == kSkipNodePeerFailedExit; }

std::vector<Child> spawn_nodes(const SkipTrainOptions& o, int64_t nodes) {
  std::vector<Child> children;
  for (int64_t n = 0; n < nodes; ++n) {
    std::vector<std::string> args = {"skippipe", "node", "--config", absolute(o.config), "--setting",
                                     absolute(o.setting), "--schedule", absolute(o.schedule), "--node",
                                     std::to_string(n), "--iterations", std::to_string(o.iterations),
                                     "--link-scale", std::to_string(o.link_scale), "--compute-scale",
                                     std::to_string(o.compute_scale), "--out", o.out_dir.string(),
                                     "--timeout-s", std::to_string(o.timeout_s)};
    if (n == o.fault_node) {
      args.insert(args.end(), {o.fault_hangs ? "--hang-at-iteration" : "--die-at-iteration",
                               std::to_string(o.fault_iteration)});
    }
    Child c;
    c.role = "node " + std::to_string(n);
    c.learner = static_cast<int>(n);
    try {
      c.pid = spawn(args, o.out_dir / ("node_" + std::to_string(n) + ".log"), 1);
    } catch (...) {
      stop_children(children, std::chrono::seconds(2));
      throw;
    }
    children.push_back(c);
  }
  return children;
}

// Waits for every node. After the first failure the others get the deadline (plus 5 s to exit) before a SIGKILL.
// Returns "" when all exited 0, else the message naming the failed node(s).
std::string watch(std::vector<Child>& children, double timeout_s) {
  std::optional<Clock::time_point> first_failure;
  for (;;) {
    reap(children);
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; })) break;
    for (const Child& c : children) {
      if (c.exited && !ok(c) && !first_failure) first_failure = c.died_at;
    }
    if (first_failure && Clock::now() - *first_failure > std::chrono::duration<double>(timeout_s + 5)) {
      std::fprintf(stderr, "[skippipe] nodes still running %.0f s after the first failure: killing them\n",
                   timeout_s + 5);
      stop_children(children, std::chrono::seconds(2));
      for (Child& c : children) {
        if (c.died_at == Clock::time_point{}) c.died_at = Clock::now();  // stopped here, not reaped by reap()
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Blame the nodes that failed of their own accord; if all saw only a peer fail, the one that stopped first.
  std::vector<const Child*> blamed;
  for (const Child& c : children) {
    if (!ok(c) && !peer_failed(c)) blamed.push_back(&c);
  }
  if (blamed.empty()) {
    for (const Child& c : children) {
      if (!ok(c) && (blamed.empty() || c.died_at < blamed.front()->died_at)) blamed = {&c};
    }
  }
  if (blamed.empty()) return "";
  std::string msg;
  for (const Child* c : blamed) msg += (msg.empty() ? "" : "; ") + c->role + " " + describe(c->status);
  int stopped = 0;
  Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
  for (const Child& c : children) {
    if (ok(c)) continue;
    ++stopped;
    first = std::min(first, c.died_at);
    last = std::max(last, c.died_at);
  }
  char after[64];
  std::snprintf(after, sizeof(after), "%.1f", std::chrono::duration<double>(last - first).count());
  return msg + " (" + std::to_string(stopped) + " of " + std::to_string(children.size()) +
         " nodes did not finish, the last " + after + " s after the first failure; logs in node_<i>.log)";
}

void print_table(const SkipTrainOptions& o, size_t nodes, double sim_s) {
  std::vector<nlohmann::json> js;
  for (size_t n = 0; n < nodes; ++n) {
    js.push_back(nlohmann::json::parse(std::ifstream(o.out_dir / ("node_" + std::to_string(n) + ".json"))));
  }
  std::printf("[skippipe] %zu nodes, %lld iterations -> %s/node_<i>.json\n", nodes,
              static_cast<long long>(o.iterations), o.out_dir.string().c_str());
  std::printf("%9s %12s %10s %12s %14s %12s %14s\n", "iteration", "loss", "grad_norm", "wall_s(max)",
              "simulated_s", "link_wait_s", "p2p_bytes");
  double pad = 0;
  for (int64_t k = 0; k < o.iterations; ++k) {
    double wall = 0, wait = 0;
    int64_t bytes = 0;
    for (const auto& j : js) {
      const auto& it = j["iterations"][k];
      wall = std::max(wall, it["wall_s"].get<double>());
      wait = std::max(wait, it["link_wait_s"].get<double>());
      pad = std::max(pad, it["compute_pad_s"].get<double>());
      bytes += it["bytes_sent"].get<int64_t>();
    }
    const auto& first = js[0]["iterations"][k];
    std::printf("%9lld %12.6f %10.4f %12.3f %14.3f %12.3f %14lld\n", static_cast<long long>(k),
                first["loss"].get<double>(), first["grad_norm"].get<double>(), wall, sim_s * o.link_scale, wait,
                static_cast<long long>(bytes));
  }
  std::printf("simulated_s = the exact simulator's iteration time (%.6g s) x --link-scale %g. Links are emulated at\n"
              "that scale; ", sim_s, o.link_scale);
  if (o.compute_scale > 0) {
    std::printf("compute is real, padded by sleeps to at least --compute-scale %g x the setting's times\n"
                "(longest padding per node and iteration: %.3f s); comparable with simulated_s when both scales\n"
                "are equal, though the simulator leaves out the replica all-reduce, the optimizer step and the\n"
                "nodes sharing this machine's cores.\n", o.compute_scale, pad);
  } else {
    std::printf("compute is real, not emulated: the two agree only when the setting's forward_s (x scale)\n"
                "matches this machine's real compute per stage (see --compute-scale).\n");
  }
}

}  // namespace

void run_skippipe_train(const SkipTrainOptions& o) {
  const double sim_s = check_inputs(o);
  const int64_t nodes = pipeline::load_setting(o.setting).node_count();
  fs::create_directories(o.out_dir);
  fs::remove(o.out_dir / "store");  // a FileStore must be fresh
  for (int64_t n = 0; n < nodes; ++n) {
    fs::remove(o.out_dir / ("node_" + std::to_string(n) + ".json"));
    fs::remove(o.out_dir / ("node_" + std::to_string(n) + ".log"));
  }
  std::vector<Child> children = spawn_nodes(o, nodes);
  const std::string failed = watch(children, o.timeout_s);
  if (!failed.empty()) throw std::runtime_error("skippipe train: " + failed);
  print_table(o, static_cast<size_t>(nodes), sim_s);
}

}  // namespace dloco
