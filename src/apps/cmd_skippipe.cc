// `dloco skippipe ...`: SkipPipe on the command line (docs/skippipe.md, issue 13).
//   dloco skippipe simulate --setting FILE --schedule FILE [--mode exact|reference] [--format table|json]
//     the iteration time of one schedule on one setting, and each node's busy time and visits.
//   dloco skippipe schedule --setting FILE [--placement FILE | --stages S] [--method skippipe|full|oblivious] ...
//     --out FILE: a schedule (docs/skippipe.md, "Scheduler") that `simulate` reads, with its time in both
//     simulator modes, the visits per stage and the search's wall time printed.
//   dloco skippipe train --config FILE --setting FILE --schedule FILE [--iterations K] [--link-scale X]
//     [--compute-scale Y] [--out DIR] [--timeout-s S]: the pipeline as one process per node on this machine
//     (skippipe/launcher.h), each a hidden `dloco skippipe node` (skippipe/node_run.h).
// Flags -> files -> run happens here; the formats, the simulators and the scheduler live in src/skippipe. Bad input
// throws InputError (exit 2). Deliberately not here: any scheduling logic.
#include <charconv>
#include <fstream>
#include <sstream>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <iostream>
#include <limits>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include "apps/commands.h"
#include "core/check.h"
#include "process/json_file.h"
#include "skippipe/json_fields.h"
#include "skippipe/launcher.h"
#include "skippipe/node_run.h"
#include "skippipe/schedule.h"
#include "skippipe/scheduler.h"
#include "skippipe/setting.h"
#include "skippipe/simulator.h"

namespace dloco::apps {
namespace {

using namespace dloco::skippipe;

// The shortest decimal that reads back as the same double (what the reference's Python prints).
std::string shortest(double x) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, res.ptr);
}

void print_table(const Setting& setting, const Schedule& schedule, SimMode mode, const SimResult& r) {
  fmt::print("[skippipe] {} mode, schedule \"{}\": {} micro-batches, {} stages, {} nodes\n", to_string(mode),
             schedule.method, schedule.micro_batches.size(), schedule.placement.size(),
             static_cast<long long>(setting.node_count()));
  std::printf("iteration time: %s s", shortest(r.iteration_time_s).c_str());
  if (schedule.reference_iteration_time_s) {
    std::printf("  (the source reports %s s)", shortest(*schedule.reference_iteration_time_s).c_str());
  }
  std::printf("\n%5s %6s %-12s %9s %9s %10s %8s\n", "node", "stage", "region", "forwards", "backwards", "busy_s",
              "busy_%");
  for (int64_t n = 0; n < setting.node_count(); ++n) {
    const double share = r.iteration_time_s > 0 ? 100.0 * r.busy_s[n] / r.iteration_time_s : 0.0;
    std::printf("%5lld %6d %-12s %9lld %9lld %10.4f %8.1f\n", static_cast<long long>(n), schedule.stage_of_node[n],
                setting.regions[setting.nodes[n].region].c_str(), static_cast<long long>(r.forwards[n]),
                static_cast<long long>(r.backwards[n]), r.busy_s[n], share);
  }
}

nlohmann::json to_json(const Schedule& schedule, SimMode mode, const SimResult& r) {
  nlohmann::json nodes = nlohmann::json::array();
  for (size_t n = 0; n < r.busy_s.size(); ++n) {
    nodes.push_back({{"node", n},
                     {"stage", schedule.stage_of_node[n]},
                     {"forwards", r.forwards[n]},
                     {"backwards", r.backwards[n]},
                     {"busy_s", r.busy_s[n]}});
  }
  nlohmann::json j = {{"mode", to_string(mode)},         {"method", schedule.method},
                      {"iteration_time_s", r.iteration_time_s}, {"micro_batches", schedule.micro_batches.size()},
                      {"completed", r.completed},         {"stranded", r.stranded},
                      {"nodes", nodes}};
  if (schedule.reference_iteration_time_s) j["reference_iteration_time_s"] = *schedule.reference_iteration_time_s;
  return j;
}

void add_simulate(CLI::App& cmd) {
  struct Args {
    std::string setting;
    std::string schedule;
    std::string mode = "exact";
    std::string format = "table";
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = cmd.add_subcommand("simulate", "iteration time of a schedule on a setting (exact or reference)");
  sub->add_option("--setting", args->setting, "setting file (e.g. configs/skippipe/reference_setting.json)")
      ->required();
  sub->add_option("--schedule", args->schedule, "schedule file (e.g. configs/skippipe/skippipe.json)")->required();
  sub->add_option("--mode", args->mode, "exact (event-driven) or reference (gensyn-ai/skippipe's com_sym.py)");
  sub->add_option("--format", args->format, "table or json");
  sub->callback([args] {
    const SimMode mode = parse_sim_mode(args->mode);
    if (args->format != "table" && args->format != "json") {
      throw InputError("--format \"" + args->format + "\": expected table or json");
    }
    const Setting setting = load_setting(args->setting);
    const Schedule schedule = load_schedule(args->schedule, setting);
    const SimResult r = simulate(mode, setting, schedule);
    if (args->format == "json") {
      std::cout << to_json(schedule, mode, r).dump(1) << "\n";
    } else {
      print_table(setting, schedule, mode, r);
    }
    if (r.stranded > 0) {
      spdlog::warn("[skippipe] {} micro-batches never finished in reference mode (the reference "
                   "drops them silently; the iteration time ignores them)",
                   static_cast<long long>(r.stranded));
    }
  });
}

struct ScheduleArgs {
  std::string setting, placement, out;
  std::string method = "skippipe";
  std::string score = "exact";
  std::string format = "table";
  SchedulerOptions options;
};

// The placement of a JSON file: its "placement" field (a schedule file or {"placement": ...}) or a bare array.
std::vector<std::vector<int>> load_placement(const std::string& path) {
  const nlohmann::json j = read_json_file(path);
  const nlohmann::json& arr = j.is_object() && j.contains("placement") ? j["placement"] : j;
  if (!arr.is_array()) throw InputError(path + ": expected a \"placement\" field or an array of stages");
  std::vector<std::vector<int>> placement;
  for (size_t s = 0; s < arr.size(); ++s) {
    const std::string at = path + ": placement[" + std::to_string(s) + "]";
    if (!arr[s].is_array()) throw InputError(at + ": expected an array of node ids");
    placement.emplace_back();
    for (size_t k = 0; k < arr[s].size(); ++k) {
      placement.back().push_back(static_cast<int>(json_integer_in(arr[s][k], at + "[" + std::to_string(k) + "]", 0,
                                                               std::numeric_limits<int>::max())));
    }
  }
  return placement;
}

// The command line that reproduces the file (recorded in its notes): every option that shapes the result.
std::string command_line(const ScheduleArgs& a) {
  const SchedulerOptions& o = a.options;
  std::ostringstream c;
  c << "dloco skippipe schedule --setting " << a.setting;
  if (a.placement.empty()) c << " --stages " << o.stages << " --placement-iterations " << o.placement_iterations;
  else c << " --placement " << a.placement;
  c << " --method " << a.method << " --skip " << shortest(o.skip) << " --micro-batches-per-data-node "
    << o.micro_batches_per_data_node << " --data-nodes " << o.data_nodes << " --memory " << o.memory << " --swaps "
    << o.max_swaps << " --seed " << o.seed << " --iterations " << o.iterations << " --score " << a.score
    << " --out " << a.out;
  if (o.budget_s > 0) c << " --budget-s " << shortest(o.budget_s) << " (a wall-time cap: rerun may differ if it bit)";
  return c.str();
}

void print_schedule_report(const ScheduleArgs& a, const SchedulerResult& r) {
  const std::vector<int64_t> visits = visits_per_stage(r.schedule);
  if (a.format == "json") {
    nlohmann::json j = {{"method", a.method}, {"out", a.out}, {"micro_batches", r.schedule.micro_batches.size()},
                        {"reference_s", r.reference_s}, {"exact_s", r.exact_s}, {"visits_per_stage", visits},
                        {"routes_per_data_node", r.groups_per_data_node}, {"moves", r.iterations_run},
                        {"improvements", r.improvements}, {"wall_s", r.wall_s}};
    std::cout << j.dump(1) << "\n";
    return;
  }
  fmt::print("[skippipe] {}: {} micro-batches, {} stages -> {}\n", a.method, r.schedule.micro_batches.size(),
             r.schedule.placement.size(), a.out);
  std::printf("iteration time: reference mode %s s, exact mode %s s\n", shortest(r.reference_s).c_str(),
              shortest(r.exact_s).c_str());
  std::printf("visits per stage:");
  for (int64_t v : visits) std::printf(" %lld", static_cast<long long>(v));
  std::printf("\nroutes per data node %lld, moves %lld (%lld improvements), search wall time %.2f s\n",
              static_cast<long long>(r.groups_per_data_node), static_cast<long long>(r.iterations_run),
              static_cast<long long>(r.improvements), r.wall_s);
}

void run_schedule(ScheduleArgs& a) {
  if (a.format != "table" && a.format != "json") {
    throw InputError("--format \"" + a.format + "\": expected table or json");
  }
  a.options.score_mode = parse_sim_mode(a.score);
  const Setting setting = load_setting(a.setting);
  if (!a.placement.empty()) a.options.placement = load_placement(a.placement);
  if (a.placement.empty() && a.options.stages < 2) throw InputError("give --placement FILE or --stages S (S >= 2)");
  SchedulerResult r;
  if (a.method == "skippipe") {
    r = schedule_skippipe(setting, a.options);
  } else if (a.method == "oblivious") {
    r = schedule_oblivious(setting, a.options);
  } else if (a.method == "full") {
    r = schedule_full_pipeline(setting, a.options);
  } else {
    throw InputError("--method \"" + a.method + "\": expected skippipe, full or oblivious");
  }
  SchedulerOptions rules = a.options;
  if (a.method == "full") rules.skip = 0.0;
  const std::string broken = check_schedule_rules(r.schedule, setting, rules);
  DLOCO_CHECK(broken.empty());  // the scheduler keeps its own rules
  const std::vector<std::string> notes = {
      "produced by: " + command_line(a),
      "times with this setting's simulators: reference mode " + shortest(r.reference_s) + " s, exact mode " +
          shortest(r.exact_s) + " s (memory C = " +
          std::to_string(a.options.memory > 0 ? a.options.memory : setting.memory_capacity) + ")"};
  std::ofstream out(a.out);
  if (!out) throw InputError("--out " + a.out + ": cannot open for writing");
  out << schedule_to_json(r.schedule, notes).dump(1) << "\n";
  if (!out) throw InputError("--out " + a.out + ": write failed");
  print_schedule_report(a, r);
}

void add_schedule(CLI::App& cmd) {
  auto a = std::make_shared<ScheduleArgs>();
  SchedulerOptions& o = a->options;
  CLI::App* sub = cmd.add_subcommand("schedule", "find a SkipPipe schedule (or a baseline) for a setting");
  sub->add_option("--setting", a->setting, "setting file (e.g. configs/skippipe/reference_setting.json)")->required();
  sub->add_option("--placement", a->placement, "placement: a schedule file's \"placement\" or a bare array");
  sub->add_option("--stages", o.stages, "S, to search a placement when none is given");
  sub->add_option("--method", a->method, "skippipe (collision-aware search), full (full pipeline) or oblivious");
  sub->add_option("--skip", o.skip, "skip ratio k: a path visits round(S·(1 − k)) stages incl. stage 0 (1/3)");
  sub->add_option("--micro-batches-per-data-node", o.micro_batches_per_data_node, "N per data node (6)");
  sub->add_option("--data-nodes", o.data_nodes, "use the first D nodes of stage 0 (0: all)");
  sub->add_option("--memory", o.memory, "C: routes per node at most, and the simulators' memory (0: the setting's)");
  sub->add_option("--swaps", o.max_swaps, "adjacent-stage swaps (inversions) allowed per path (0)");
  sub->add_option("--seed", o.seed, "random seed of the search (1)");
  sub->add_option("--iterations", o.iterations, "annealing moves (20000); the result depends only on this");
  sub->add_option("--budget-s", o.budget_s, "stop the search after this much wall time too (0: no cap)");
  sub->add_option("--placement-iterations", o.placement_iterations, "placement-search moves without --placement");
  sub->add_option("--score", a->score, "simulator that scores candidates: exact (default) or reference");
  sub->add_option("--out", a->out, "schedule file to write")->required();
  sub->add_option("--format", a->format, "table or json");
  sub->callback([a] { run_schedule(*a); });
}

// DLOCO_SKIPPIPE_KILL=node:iteration[:op] or DLOCO_SKIPPIPE_HANG=node:iteration (tests): that node SIGKILLs
// itself at the start of that iteration (or after its operation `op` of it: mid-iteration), or blocks for ever.
void read_fault_plan(SkipTrainOptions& o) {
  for (const char* name : {"DLOCO_SKIPPIPE_KILL", "DLOCO_SKIPPIPE_HANG"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) continue;
    const std::string s(v);
    const bool kill = std::string(name) == "DLOCO_SKIPPIPE_KILL";
    const size_t colon = s.find(':'), second = colon == std::string::npos ? colon : s.find(':', colon + 1);
    try {
      if (colon == std::string::npos || (!kill && second != std::string::npos)) throw std::invalid_argument(s);
      o.fault_node = std::stoi(s.substr(0, colon));
      o.fault_iteration = std::stoll(s.substr(colon + 1, second == std::string::npos ? std::string::npos
                                                                                   : second - colon - 1));
      if (second != std::string::npos) o.fault_op = std::stoll(s.substr(second + 1));
      if (o.fault_node < 0 || o.fault_iteration < 0 || (second != std::string::npos && o.fault_op < 0)) {
        throw std::invalid_argument(s);
      }
    } catch (const std::exception&) {
      throw InputError(std::string(name) + "=\"" + s + "\": expected node:iteration" + (kill ? "[:op]" : "") +
                       " (integers ≥ 0), e.g. 2:1");
    }
    o.fault_hangs = !kill;
  }
}

void add_train(CLI::App& cmd) {
  auto o = std::make_shared<SkipTrainOptions>();
  CLI::App* sub = cmd.add_subcommand("train", "train on a SkipPipe pipeline: one process per node, this machine");
  sub->add_option("--config", o->config, "config: model, data and train (train.batch_size = micro-batch size b)")
      ->required();
  sub->add_option("--setting", o->setting, "setting file: the nodes and links")->required();
  sub->add_option("--schedule", o->schedule, "schedule file: placement and paths")->required();
  sub->add_option("--iterations", o->iterations, "K iterations (2)");
  sub->add_option("--link-scale", o->link_scale, "emulate links at this scale of the setting's hop times (0: off)");
  sub->add_option("--compute-scale", o->compute_scale,
                  "pad each forward/head/backward to at least this scale of the setting's times (0: off)");
  sub->add_option("--out", o->out_dir, "output folder: node_<i>.json, node_<i>.log (skippipe_run)");
  sub->add_option("--timeout-s", o->timeout_s, "deadline of every blocking wait in the nodes, s (60)");
  auto on_failure = std::make_shared<std::string>("reroute");
  sub->add_option("--on-failure", *on_failure,
                  "a node that dies: reroute (its micro-batches through another replica of its stage, the iteration "
                  "redone, the scheduler re-plans; default) or stop (the run stops naming it)")
      ->check(CLI::IsMember({"reroute", "stop"}));
  sub->callback([o, on_failure] {
    o->reroute = *on_failure == "reroute";
    read_fault_plan(*o);
    run_skippipe_train(*o);
  });
}

// One node (started by `train`; hidden from --help).
void add_node(CLI::App& cmd) {
  auto o = std::make_shared<SkipNodeOptions>();
  CLI::App* sub = cmd.add_subcommand("node", "one SkipPipe node (started by `dloco skippipe train`, or by hand on "
                                     "several machines with --store tcp://HOST:PORT)");
  sub->group("");
  sub->add_option("--config", o->config)->required();
  sub->add_option("--setting", o->setting)->required();
  sub->add_option("--schedule", o->schedule)->required();
  sub->add_option("--node", o->node)->required();
  sub->add_option("--iterations", o->iterations)->required();
  sub->add_option("--link-scale", o->link_scale);
  sub->add_option("--compute-scale", o->compute_scale);
  sub->add_option("--out", o->out_dir)->required();
  sub->add_option("--timeout-s", o->timeout_s);
  sub->add_flag("--reroute", o->reroute);
  sub->add_option("--store", o->store, "where the nodes meet: tcp://HOST:PORT that node 0 serves (nodes on several "
                  "machines; needs run.trusted_network), default <out>/store");
  sub->add_option("--host", o->host, "address this node's Gloo binds (default: the route to HOST for tcp://)");
  sub->add_option("--die-at-iteration", o->die_at_iteration);
  sub->add_option("--die-at-op", o->die_at_op);
  sub->add_option("--hang-at-iteration", o->hang_at_iteration);
  sub->callback([o] {
    const int code = run_skippipe_node(*o);
    // A peer failed: exit at once with the status the parent reads as "not this node's fault" (the edge of the
    // program; the Collective was already destroyed while the error unwound).
    if (code != 0) {
      std::fflush(nullptr);
      std::_Exit(code);
    }
  });
}

}  // namespace

void add_skippipe_commands(CLI::App& app) {
  CLI::App* skippipe = app.add_subcommand("skippipe", "SkipPipe: pipelines that skip and reorder stages");
  skippipe->require_subcommand(1);
  add_simulate(*skippipe);
  add_schedule(*skippipe);
  add_train(*skippipe);
  add_node(*skippipe);
}

}  // namespace dloco::apps
