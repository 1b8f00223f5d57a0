// `dloco config`: a config as dloco resolves it (the file, its preset, every --set, defaults filled in), whole or one
// field. Scripts read a field from it (scripts/slurm/dloco.sbatch: diloco.mode picks what the job starts) instead of
// parsing TOML and --set themselves.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/check.h"
#include "core/config.h"
#include "learner/group_ranks.h"

namespace dloco::apps {

namespace {

// The config resolved for a job of `tasks` Slurm tasks (scripts/slurm/dloco.sbatch) and checked with its M: a
// decoupled job's tasks are its learners' ranks in order (learners_for_tasks), a baseline's one worker each. Which
// applies, and the ranks, come from the first M in 1 … tasks with which the config passes its checks (with another M,
// the task count say, a valid config could be refused: data.streams ≥ M). Throws InputError: the checks' own error
// with the job's M, or with M = tasks when no M passes.
Config config_for_tasks(const std::string& path, const std::vector<std::string>& overrides, int tasks) {
  if (tasks < 1) throw InputError("--learners-for-tasks " + std::to_string(tasks) + ": a job has at least one task");
  auto with_m = [&](int m) {
    std::vector<std::string> o = overrides;
    o.push_back("diloco.learners=" + std::to_string(m));
    return load_config(path, o);
  };
  std::optional<Config> any;
  for (int m = 1; m < tasks && !any; ++m) {
    try {
      any = with_m(m);
    } catch (const InputError&) {  // this M fails the checks: try the next
    }
  }
  if (!any) any = with_m(tasks);  // the last try: its error is the one to show
  const int M = any->diloco.mode == Mode::kDecoupled ? learners_for_tasks(*any, tasks) : tasks;
  Config c = with_m(M);
  for (const auto& l : c.parallel_learners) {
    if (l.id >= M) {
      std::fprintf(stderr, "dloco: warning: [[parallel.learner]] id = %lld is no learner of a job of %d tasks "
                   "(M = %d): it is not used\n", static_cast<long long>(l.id), tasks, M);
    }
  }
  return c;
}

}  // namespace

void add_config_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Print a config as dloco resolves it (file, preset, --set, defaults), or "
                                           "one field: `dloco config --config cfg.toml diloco.mode`");
  static std::string path, field;
  static std::vector<std::string> overrides;
  static int tasks = 0;
  cmd->add_option("--config", path, "TOML config")->required();
  cmd->add_option("--set", overrides, "Override a config field, e.g. --set train.lr=1e-3 (repeatable)")
      ->allow_extra_args(false);  // one value per --set: the field after them stays positional
  cmd->add_option("field", field, "section.key to print alone (a string without quotes); default: the whole config "
                                  "as TOML; run.secret shows as \"<set>\" when set");
  auto* for_tasks = cmd->add_option("--learners-for-tasks", tasks, "A Slurm job of N tasks "
                                    "(scripts/slurm/dloco.sbatch): resolve M = diloco.learners for it (decoupled: the "
                                    "learners whose ranks fill the tasks, learner 0's first; a baseline: one worker "
                                    "per task) and print M, or the field given");
  cmd->callback([for_tasks] {
    const bool slurm = for_tasks->count() > 0;
    Config c = slurm ? config_for_tasks(path, overrides, tasks) : load_config(path, overrides);
    if (slurm && field.empty()) {
      std::printf("%lld\n", static_cast<long long>(c.diloco.learners));
      return;
    }
    if (field.empty()) {
      if (!c.run.secret.empty()) c.run.secret = "<set>";
      std::printf("%s", to_toml(c).c_str());
      return;
    }
    const auto dot = field.find('.');
    const nlohmann::json all = to_json(c);
    const std::string section = field.substr(0, dot), key = dot == std::string::npos ? "" : field.substr(dot + 1);
    const bool known = dot != std::string::npos && all.contains(section) && all[section].is_object() &&
                       all[section].contains(key);
    if (!known) {
      throw InputError("no config field '" + field + "' (give section.key, e.g. diloco.mode)");
    }
    if (field == "run.secret" && !c.run.secret.empty()) {  // a secret does not go to a terminal or a log
      std::printf("<set>\n");
      return;
    }
    const nlohmann::json& value = all[section][key];
    std::printf("%s\n", value.is_string() ? value.get<std::string>().c_str() : value.dump().c_str());
  });
}

}  // namespace dloco::apps
