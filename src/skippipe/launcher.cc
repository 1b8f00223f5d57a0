// `dloco skippipe train`; see launcher.h.
#include "skippipe/launcher.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include "core/check.h"
#include "core/config.h"
#include "process/atomic_file.h"
#include "process/children.h"
#include "process/json_file.h"
#include "skippipe/node_run.h"
#include "skippipe/pipeline_check.h"
#include "skippipe/reroute.h"
#include "skippipe/schedule.h"
#include "skippipe/scheduler.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"
#include "train/run.h"

namespace dloco {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string absolute(const std::string& p) { return fs::absolute(p).lexically_normal().string(); }

// Every check that can fail before a process starts. Returns the setting, the schedule and the exact simulator's
// iteration time (unscaled).
skippipe::CheckedPipeline check_inputs(const SkipTrainOptions& o) {
  if (o.iterations < 1) throw InputError("--iterations " + std::to_string(o.iterations) + ": at least 1");
  if (!std::isfinite(o.link_scale) || o.link_scale < 0) throw InputError("--link-scale: a finite number >= 0");
  if (!std::isfinite(o.compute_scale) || o.compute_scale < 0) {
    throw InputError("--compute-scale: a finite number >= 0");
  }
  if (!std::isfinite(o.timeout_s) || o.timeout_s <= 0) throw InputError("--timeout-s: a finite number > 0");
  const Config config = load_config(o.config);
  check_data_fits_model(config);
  const auto checked = skippipe::load_checked_pipeline(o.setting, o.schedule, config.model.n_layer);
  if (o.fault_node >= checked.setting.node_count()) throw InputError("DLOCO_SKIPPIPE_KILL/HANG: no such node");
  return checked;
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
    if (o.reroute) args.push_back("--reroute");
    if (n == o.fault_node) {
      args.insert(args.end(), {o.fault_hangs ? "--hang-at-iteration" : "--die-at-iteration",
                               std::to_string(o.fault_iteration)});
      if (o.fault_op >= 0) args.insert(args.end(), {"--die-at-op", std::to_string(o.fault_op)});
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
// `routed_around`: nodes already handled by re-routing (neither blamed nor the start of the clock); `failed_at`: when
// the run failed if no node's exit says so (a re-routing that could not go on).
std::string watch(std::vector<Child>& children, double timeout_s, const std::set<int>& routed_around = {},
                  std::optional<Clock::time_point> failed_at = {}) {
  std::optional<Clock::time_point> first_failure = failed_at;
  for (;;) {
    reap(children);
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; })) break;
    for (const Child& c : children) {
      if (c.exited && !ok(c) && !routed_around.count(c.learner) && !first_failure) first_failure = c.died_at;
    }
    if (first_failure && Clock::now() - *first_failure > std::chrono::duration<double>(timeout_s + 5)) {
      spdlog::warn("[skippipe] nodes still running {:.0f} s after the first failure: killing them",
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
    if (!ok(c) && !peer_failed(c) && !routed_around.count(c.learner)) blamed.push_back(&c);
  }
  if (blamed.empty()) {
    for (const Child& c : children) {
      if (!ok(c) && !routed_around.count(c.learner) && (blamed.empty() || c.died_at < blamed.front()->died_at)) {
        blamed = {&c};
      }
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

void write_json(const fs::path& path, const nlohmann::json& j) { write_file_atomically(path, j.dump(1) + "\n"); }

std::optional<nlohmann::json> read_json(const fs::path& path) { return try_read_json_file(path); }

namespace reroute {

// What the parent keeps across generations: the schedules the survivors run (`rerouted_last` for iteration
// `redone`, `current` from the next one on; before any failure the start's for every iteration), the generation and
// whether the survivors were released.
struct State {
  skippipe::Schedule current, rerouted_last;
  int64_t redone = -1;
  int g = 0;
  bool released = false;
};

// Tells the survivors at once that the re-routing of generation g cannot go on (they stop instead of waiting out
// the deadline); returns `why`.
std::string give_up(const SkipTrainOptions& o, int g, const std::string& why) {
  write_json(o.out_dir / ("plan_" + std::to_string(g) + ".json"), {{"generation", g}, {"abort", why}});
  return why;
}

// Every survivor's answer to notice g: how many iterations it completed. "" when all answered, else why not.
std::string await_acks(std::vector<Child>& children, const SkipTrainOptions& o, const std::set<int>& dead, int g,
                       const std::string& names, std::map<int, int64_t>& completed) {
  const auto deadline = std::chrono::duration<double>(o.timeout_s + 5);
  const auto asked = Clock::now();
  while (completed.size() + dead.size() < children.size()) {
    for (const Child& c : children) {
      if (dead.count(c.learner) || completed.count(c.learner)) continue;
      const std::string ack = "ack_" + std::to_string(g) + "_" + std::to_string(c.learner) + ".json";
      if (auto a = read_json(o.out_dir / ack)) completed[c.learner] = (*a)["completed"].get<int64_t>();
    }
    reap(children);
    for (const Child& c : children) {
      if (c.exited && !ok(c) && !dead.count(c.learner)) {
        return c.role + " " + describe(c.status) + " while the others re-routed around node(s) " + names;
      }
    }
    if (Clock::now() - asked > deadline) return "the survivors did not answer the re-routing notice in time";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "";
}

// Nodes `died` died: announce generation g + 1, collect the survivors' answers, write the plan (the iteration to
// redo on a schedule routed around the dead, then the re-plan). "" when the survivors go on, else the failure.
std::string route_around(std::vector<Child>& children, const SkipTrainOptions& o,
                         const skippipe::CheckedPipeline& start, std::set<int>& dead,
                         const std::vector<const Child*>& died, State& st) {
  std::string names, what;
  for (const Child* c : died) {
    dead.insert(c->learner);
    names += (names.empty() ? "" : ", ") + std::to_string(c->learner);
    what += (what.empty() ? "" : "; ") + c->role + " " + describe(c->status);
  }
  const int g = ++st.g;
  write_json(o.out_dir / ("reroute_" + std::to_string(g) + ".json"),
             {{"generation", g}, {"dead", std::vector<int>(dead.begin(), dead.end())}, {"why", what}});
  spdlog::info("[skippipe] {}: routing around it (generation {})", what, g);
  std::map<int, int64_t> completed;
  if (const std::string failed = await_acks(children, o, dead, g, names, completed); !failed.empty()) {
    return give_up(o, g, failed);
  }
  int64_t redo = o.iterations;
  for (const auto& [n, c] : completed) redo = std::min(redo, c);
  std::vector<int> rank_of(children.size(), -1);
  int world = 0;
  for (size_t n = 0; n < children.size(); ++n) {
    if (!dead.count(static_cast<int>(n))) rank_of[n] = world++;
  }
  nlohmann::json plan = {{"generation", g}, {"redo_iteration", redo}, {"rank_of_node", rank_of}, {"world", world},
                         {"redo_schedule", ""}, {"next_schedule", ""}};
  if (redo == o.iterations) {  // it died after every survivor finished: nothing to redo
    write_json(o.out_dir / ("plan_" + std::to_string(g) + ".json"), plan);
    spdlog::info("[skippipe] it died after the last iteration: nothing to redo");
    st.released = true;  // the survivors finish on this plan
    return "";
  }
  // The iteration to redo ran on the re-routed schedule if it is the one redone last, else on `current`.
  const skippipe::Schedule& base = redo == st.redone ? st.rerouted_last : st.current;
  skippipe::Schedule rerouted, next;
  std::string why;
  try {
    rerouted = skippipe::reroute_around(base, start.setting, dead);
    next = skippipe::replan_around(rerouted, base, start.setting, &why);
  } catch (const InputError& e) {
    return give_up(o, g, what + ", and it cannot be routed around: " + e.what());
  }
  const fs::path redo_file = fs::absolute(o.out_dir / ("schedule_redo_" + std::to_string(g) + ".json"));
  const fs::path next_file = fs::absolute(o.out_dir / ("schedule_next_" + std::to_string(g) + ".json"));
  write_json(redo_file, skippipe::schedule_to_json(rerouted, {"re-routed around node(s) " + names}));
  write_json(next_file, skippipe::schedule_to_json(next, {why}));
  plan["redo_schedule"] = redo_file.string();
  plan["next_schedule"] = next_file.string();
  write_json(o.out_dir / ("plan_" + std::to_string(g) + ".json"), plan);
  spdlog::info("[skippipe] iteration {} redone on {} nodes with node(s) {} routed around ({:.6g} s simulated, "
               "was {:.6g} s); then {}",
               static_cast<long long>(redo), world, names,
               skippipe::simulate_exact(start.setting, rerouted).iteration_time_s,
               skippipe::simulate_exact(start.setting, base).iteration_time_s, why);
  st.rerouted_last = rerouted;
  st.redone = redo;
  st.current = next;
  return "";
}

// Releases the survivors once every one finished the last iteration in this generation. nullopt while nodes still
// run; then "" when they all succeeded, else the failure.
std::optional<std::string> release_or_end(const std::vector<Child>& children, const SkipTrainOptions& o,
                                          const std::set<int>& dead, State& st) {
  size_t finished = 0, exited = 0;
  for (const Child& c : children) {
    if (dead.count(c.learner)) continue;
    exited += c.exited;
    if (auto f = read_json(o.out_dir / ("finished_" + std::to_string(c.learner) + ".json"))) {
      finished += (*f)["generation"].get<int>() == st.g;
    }
  }
  if (!st.released && finished + dead.size() == children.size()) {
    write_json(o.out_dir / ("release_" + std::to_string(st.g) + ".json"), {{"generation", st.g}});
    st.released = true;
  }
  if (exited + dead.size() < children.size()) return std::nullopt;
  for (const Child& c : children) {
    if (!dead.count(c.learner) && !ok(c)) return c.role + " " + describe(c.status) + " after the last iteration";
  }
  return "";
}

}  // namespace reroute

// Re-routing (docs/skippipe.md "Re-routing around a dead node"): a node that dies of its own accord (a signal, an
// exit other than 0 and 75) is announced in reroute_<g>.json; every survivor tears its group down, answers with how
// many iterations it completed (ack_<g>_<node>.json); the parent writes the re-routed schedule for the iteration to
// redo (the fewest completed), the scheduler's re-plan for the rest, and plan_<g>.json (the survivors' ranks); at
// the end release_<g>.json once every survivor finished. Returns "" when the survivors finished, else the failure
// (the survivors are then left to watch()).
std::string watch_rerouting(std::vector<Child>& children, const SkipTrainOptions& o,
                            const skippipe::CheckedPipeline& start, std::set<int>& dead) {
  reroute::State st{start.schedule, start.schedule};
  for (;;) {
    reap(children);
    std::vector<const Child*> died, gave_up;
    for (const Child& c : children) {
      if (!c.exited || ok(c) || dead.count(c.learner)) continue;
      (peer_failed(c) ? gave_up : died).push_back(&c);
    }
    if (!gave_up.empty()) return gave_up.front()->role + " " + describe(gave_up.front()->status);
    if (!died.empty() && !st.released) {
      if (std::string failed = reroute::route_around(children, o, start, dead, died, st); !failed.empty()) {
        return failed;
      }
      continue;
    }
    if (auto end = reroute::release_or_end(children, o, dead, st)) return *end;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void print_table(const SkipTrainOptions& o, size_t nodes, double sim_s, const std::set<int>& dead) {
  std::vector<nlohmann::json> js;
  for (size_t n = 0; n < nodes; ++n) {
    if (dead.count(static_cast<int>(n))) continue;
    js.push_back(nlohmann::json::parse(std::ifstream(o.out_dir / ("node_" + std::to_string(n) + ".json"))));
  }
  fmt::print("[skippipe] {} nodes ({} died and were routed around), {} iterations -> {}/node_<i>.json\n", nodes,
             dead.size(), static_cast<long long>(o.iterations), o.out_dir.string());
  fmt::print("{:>9} {:>12} {:>10} {:>12} {:>14} {:>12} {:>14}\n", "iteration", "loss", "grad_norm", "wall_s(max)",
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
    fmt::print("{:9} {:12.6f} {:10.4f} {:12.3f} {:14.3f} {:12.3f} {:14}\n", static_cast<long long>(k),
               first["loss"].get<double>(), first["grad_norm"].get<double>(), wall, sim_s * o.link_scale, wait,
               static_cast<long long>(bytes));
  }
  fmt::print("simulated_s = the exact simulator's iteration time ({:.6g} s) x --link-scale {:g}. Links are emulated at\n"
             "that scale; ", sim_s, o.link_scale);
  if (o.compute_scale > 0) {
    fmt::print("compute is real, padded by sleeps to at least --compute-scale {:g} x the setting's times\n"
               "(longest padding per node and iteration: {:.3f} s); comparable with simulated_s when both scales\n"
               "are equal, though the simulator leaves out the replica all-reduce, the optimizer step and the\n"
               "nodes sharing this machine's cores.\n", o.compute_scale, pad);
  } else {
    fmt::print("compute is real, not emulated: the two agree only when the setting's forward_s (x scale)\n"
               "matches this machine's real compute per stage (see --compute-scale).\n");
  }
}

}  // namespace

void run_skippipe_train(const SkipTrainOptions& o) {
  const skippipe::CheckedPipeline checked = check_inputs(o);
  const double sim_s = checked.iteration_time_s;
  const int64_t nodes = skippipe::load_setting(o.setting).node_count();
  fs::create_directories(o.out_dir);
  // A fresh folder for this run: the FileStores must be new, and an earlier run's re-routing files (a notice, a
  // plan, a release) would be read as this run's.
  for (const char* prefix : {"store", "node_", "reroute_", "ack_", "plan_", "finished_", "release_",
                             "schedule_redo_", "schedule_next_"}) {
    std::vector<fs::path> stale;
    for (const auto& entry : fs::directory_iterator(o.out_dir)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) stale.push_back(entry.path());
    }
    for (const auto& p : stale) fs::remove(p);
  }
  std::vector<Child> children = spawn_nodes(o, nodes);
  std::set<int> dead;
  std::string failed;
  if (o.reroute) {
    try {
      failed = watch_rerouting(children, o, checked, dead);
    } catch (...) {  // a file that could not be written or read: no node is left running
      stop_children(children, std::chrono::seconds(2));
      throw;
    }
    if (!failed.empty()) {
      spdlog::warn("[skippipe] {}: stopping the others", failed);
      const std::string rest = watch(children, o.timeout_s, dead, Clock::now());
      if (!rest.empty()) failed += "; " + rest;
    }
  } else {
    failed = watch(children, o.timeout_s);
  }
  if (!failed.empty()) throw std::runtime_error("skippipe train: " + failed);
  print_table(o, static_cast<size_t>(nodes), sim_s, dead);
}

}  // namespace dloco
