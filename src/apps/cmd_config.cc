// `dloco config`: a config as dloco resolves it (the file, its preset, every --set, defaults filled in), whole or one
// field. Scripts read a field from it (scripts/slurm/dloco.sbatch: diloco.mode picks what the job starts) instead of
// parsing TOML and --set themselves.
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "core/check.h"
#include "core/config.h"

namespace dloco::apps {

void add_config_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Print a config as dloco resolves it (file, preset, --set, defaults), or "
                                           "one field: `dloco config --config cfg.toml diloco.mode`");
  static std::string path, field;
  static std::vector<std::string> overrides;
  cmd->add_option("--config", path, "TOML config")->required();
  cmd->add_option("--set", overrides, "Override a config field, e.g. --set train.lr=1e-3 (repeatable)")
      ->allow_extra_args(false);  // one value per --set: the field after them stays positional
  cmd->add_option("field", field, "section.key to print alone (a string without quotes); default: the whole config "
                                  "as TOML; run.secret shows as \"<set>\" when set");
  cmd->callback([] {
    Config c = load_config(path, overrides);
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
