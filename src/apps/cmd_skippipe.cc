// `dloco skippipe ...`: SkipPipe on the command line (docs/skippipe.md, issue 13).
//   dloco skippipe simulate --setting FILE --schedule FILE [--mode exact|reference] [--format table|json]
//     the iteration time of one schedule on one setting, and each node's busy time and visits.
// Flags -> files -> run happens here; the formats and the simulators live in src/pipeline. Bad input throws
// InputError (exit 2). Deliberately not here yet: `dloco skippipe schedule` (part 2 of the issue).
#include <charconv>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/check.h"
#include "pipeline/schedule.h"
#include "pipeline/setting.h"
#include "pipeline/simulator.h"

namespace dloco::apps {
namespace {

using namespace dloco::pipeline;

// The shortest decimal that reads back as the same double (what the reference's Python prints).
std::string shortest(double x) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x);
  return std::string(buf, res.ptr);
}

void print_table(const Setting& setting, const Schedule& schedule, SimMode mode, const SimResult& r) {
  std::printf("[skippipe] %s mode, schedule \"%s\": %zu micro-batches, %zu stages, %lld nodes\n", to_string(mode),
              schedule.method.c_str(), schedule.micro_batches.size(), schedule.placement.size(),
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

void add_simulate(CLI::App& skippipe) {
  struct Args {
    std::string setting;
    std::string schedule;
    std::string mode = "exact";
    std::string format = "table";
  };
  auto args = std::make_shared<Args>();
  CLI::App* sub = skippipe.add_subcommand("simulate", "iteration time of a schedule on a setting (exact or reference)");
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
      std::fprintf(stderr, "[skippipe] warning: %lld micro-batches never finished in reference mode (the reference "
                           "drops them silently; the iteration time ignores them)\n",
                   static_cast<long long>(r.stranded));
    }
  });
}

}  // namespace

void add_skippipe_commands(CLI::App& app) {
  CLI::App* skippipe = app.add_subcommand("skippipe", "SkipPipe: pipelines that skip and reorder stages");
  skippipe->require_subcommand(1);
  add_simulate(*skippipe);
}

}  // namespace dloco::apps
