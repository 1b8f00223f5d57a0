// dloco: entry point of the command line. Registers the subcommand groups, parses, and turns the three error
// tiers into exit codes: InputError (bad input, exit 2) and InvariantError (a bug, exit 70) are reported here.
#include <cstdio>
#include <exception>

#include <c10/util/Exception.h>

#include "apps/commands.h"
#include "core/check.h"

int main(int argc, char** argv) {
  CLI::App app{"dloco: resilient distributed pre-training (Decoupled DiLoCo)"};
  app.require_subcommand(1);
  if (argc == 1) {
    std::printf("%s", app.help().c_str());
    return 2;
  }
  dloco::apps::add_data_commands(app);
  dloco::apps::add_train_commands(app);
  dloco::apps::add_compare_command(app);
  dloco::apps::add_chaos_command(app);
  dloco::apps::add_sim_commands(app);
  dloco::apps::add_skippipe_commands(app);
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
  } catch (const c10::Error& e) {  // LibTorch: the message without its C++ backtrace
    std::fprintf(stderr, "dloco: error (LibTorch): %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dloco: error: %s\n", e.what());
    return 1;
  }
  return dloco::apps::train_exit_code();
}
