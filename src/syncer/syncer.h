// The syncer process's entry point (docs/protocol.md "Syncer"): Θ initialised from the run seed or restored
// from run_dir/syncer, served on a transport until the run is finished.
#pragma once

#include <filesystem>
#include <string>

#include "core/check.h"
#include "core/config.h"
#include "transport/transport.h"

namespace dloco {

struct SyncerOptions {
  std::filesystem::path run_dir;       // run folder: events, syncer/ persistence, checkpoints
  std::string address;                 // listen address, e.g. "0.0.0.0:7070"; port 0 picks a free port
  std::filesystem::path address_file;  // if set, the bound "host:port" is written here (atomically)
  // Started by hand (no launcher): a console row every run.report_interval_s, and at the end the final checkpoint
  // evaluated on the whole validation split and run_dir/report.json (a launcher does both itself).
  bool by_hand = false;
};

/// Runs the syncer, served on `transport`, until the run is finished (then writes the final checkpoint) or
/// SIGTERM/SIGINT (then persists and checkpoints); says where it stands on the console (a row per report interval
/// when by hand, and a summary at the end). Returns the process exit code. Throws InputError on bad set-up (cannot
/// listen, missing tokenizer).
int run_syncer(const Config& config, const SyncerOptions& options, wire::Transport& transport);

}  // namespace dloco
