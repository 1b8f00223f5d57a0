// dloco: entry point of the command line. Registers the subcommand groups, parses, and turns the three error
// tiers into exit codes: InputError (bad input, exit 2) and InvariantError (a bug, exit 70) are reported here.
// Bare `dloco` lists the commands; an unknown command gets the nearest one suggested (exit 2).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "apps/commands.h"
#include "core/check.h"
#include "dloco_version.h"
#include "process/children.h"
#include "process/log.h"

namespace {

// "dloco 0.1.0 (commit …), LibTorch …, CPU build": what `--version` prints.
std::string version_text() {
  return std::string("dloco ") + DLOCO_VERSION + " (commit " + DLOCO_COMMIT + "), LibTorch " + TORCH_VERSION +
         ", " +
         (torch::cuda::is_available() ? "CUDA available (" + std::to_string(torch::cuda::device_count()) + " devices)"
                                      : std::string("CPU only (no CUDA device)"));
}

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The commands a user types, one per line with its description; the roles `dloco train` starts come last.
std::string command_list(const CLI::App& app) {
  std::string users, roles;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    char line[256];
    std::snprintf(line, sizeof(line), "  %-10s %s\n", sub->get_name().c_str(), sub->get_description().c_str());
    (sub->get_group() == dloco::apps::kRoleGroup ? roles : users) += line;
  }
  return "Commands:\n" + users + "\n" + dloco::apps::kRoleGroup + ":\n" + roles;
}

// "dloco", or "dloco skippipe schedule": the deepest command the parse reached.
std::string command_path(const CLI::App& app) {
  std::string path = "dloco";
  const CLI::App* at = &app;
  for (;;) {
    const std::vector<const CLI::App*> subs = at->get_subcommands([](const CLI::App* s) { return s->parsed(); });
    if (subs.empty()) return path;
    at = subs.front();
    path += " " + at->get_name();
  }
}

}  // namespace

int main(int argc, char** argv) {
  // A role a launcher started dies with it (SIGTERM), also when the launcher is killed with SIGKILL.
  if (!dloco::die_with_launcher()) return dloco::kLauncherGoneExit;
  dloco::init_logging();
  CLI::App app{"dloco: resilient distributed pre-training (Decoupled DiLoCo)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "Print the version, the commit and the build's devices");
  dloco::apps::add_data_commands(app);
  dloco::apps::add_train_commands(app);
  dloco::apps::add_config_command(app);
  dloco::apps::add_compare_command(app);
  dloco::apps::add_chaos_command(app);
  dloco::apps::add_sim_commands(app);
  dloco::apps::add_skippipe_commands(app);
  if (argc == 1) {
    std::printf("%s\n\nUsage: dloco COMMAND [OPTIONS]   (dloco COMMAND --help for its options)\n\n%s\n"
                "Start with: dloco data prepare --kjv --out data/kjv && dloco train --config configs/demo.toml\n",
                app.get_description().c_str(), command_list(app).c_str());
    return 2;
  }
  const std::string first = argv[1];
  if (!first.empty() && first[0] != '-') {
    std::string nearest;
    size_t best = std::string::npos;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known |= sub->check_name(first);
      const size_t d = edit_distance(first, sub->get_name());
      if (d < best) best = d, nearest = sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "dloco: '%s' is not a command.%s\n\n%s", first.c_str(),
                   best <= 2 ? (" Did you mean '" + nearest + "'?").c_str() : "", command_list(app).c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" of code 0. Every other is a usage error: exit 2 (CLI11's own codes, 104–
    // 114, mean nothing to a script), naming the command whose options to read.
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    std::fprintf(stderr, "dloco: error: %s\nRun '%s --help' for its options.\n", e.what(),
                 command_path(app).c_str());
    return 2;
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
