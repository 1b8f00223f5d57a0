// The `dloco` command line: each group of subcommands registers itself on the CLI11 app.
// Parsing flags -> config -> run happens here and nowhere else; library code never calls exit().
#pragma once

#include <CLI/CLI.hpp>

namespace dloco::apps {

/// `dloco data prepare`: text -> SentencePiece BPE tokenizer + token shards (src/data).
void add_data_commands(CLI::App& app);
/// `dloco train`, `dloco eval`, `dloco generate` (src/train).
void add_train_commands(CLI::App& app);
/// Exit status the last `dloco train` asks for: 0 finished, 1 failed, 3 incomplete, 128 + the signal that stopped it
/// (report_exit_code, launcher/run_report.h).
int train_exit_code();

/// The help group of the role subcommands (syncer, learner, evaluator, worker) that `dloco train` starts and that
/// run by hand on other machines: listed apart from the commands a user types first.
inline constexpr const char* kRoleGroup = "Roles (started by `dloco train`, or by hand on other machines)";
/// `dloco config`: a config as resolved (file, preset, --set, defaults), whole or one field.
void add_config_command(CLI::App& app);
/// `dloco compare`: modes/variants × seeds at equal tokens, side by side (table, JSON, loss curves).
void add_compare_command(CLI::App& app);
/// `dloco chaos`: a decoupled run under a fault plan beside a fault-free one; goodput, recoveries, checks.
void add_chaos_command(CLI::App& app);
/// `dloco sim goodput|bandwidth|...` (src/sim).
void add_sim_commands(CLI::App& app);
/// `dloco skippipe simulate` (src/skippipe): the SkipPipe iteration-time simulator.
void add_skippipe_commands(CLI::App& app);

}  // namespace dloco::apps
