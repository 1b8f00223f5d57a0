// Placeholder until src/sim lands: registers no commands.
#include "apps/commands.h"
namespace dloco::apps {
void add_sim_commands(CLI::App&) {}
}  // namespace dloco::apps
