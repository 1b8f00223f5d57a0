// dloco: entry point of the command line. Registers the subcommand groups, parses, and turns the three error
// tiers into exit codes: InputError (bad input, exit 2) and InvariantError (a bug, exit 70) are reported here.
#include <cstdio>
#include <exception>

#include "apps/commands.h"
#include "core/check.h"

int main(int argc, char** argv) {
  CLI::App app{"dloco: resilient distributed pre-training (Decoupled DiLoCo)"};
  app.require_subcommand(1);
  dloco::apps::add_data_commands(app);
  dloco::apps::add_train_commands(app);
  dloco::apps::add_sim_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const dloco::InputError& e) {
    std::fprintf(stderr, "dloco: error: %s\n", e.what());
    return 2;
  } catch (const dloco::InvariantError& e) {
    std::fprintf(stderr, "dloco: internal error (please report): %s\n", e.what());
    return 70;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dloco: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
