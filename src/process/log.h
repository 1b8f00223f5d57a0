// The process's log (spdlog): every role, launcher and command logs through spdlog's default logger, which
// init_logging() sets up once at the start of main(). Each line says who speaks, as STYLE.md asks, by the message's
// own prefix: `spdlog::info("[learner {} step {}] loss {:.4f}", id, step, loss)`.
//
// Format, on stderr: `12:43:55 [syncer] listening on …` for info and debug; `12:43:55 warning [skippipe node 3]
// stopped: …` for warnings and errors. A child of a launcher has both streams in its log file (logs/<role>.log).
// Every line is flushed when written, so a process that is killed loses none (lines are state changes, not
// polling). The level is info unless the environment sets SPDLOG_LEVEL (spdlog's own variable: debug, info, warn,
// error, off).
//
// What is not a log: a command's answer (the report of `dloco train`, the tables of `dloco sim`, `dloco compare`,
// `dloco skippipe`) goes to stdout, so `dloco sim goodput > table.txt` holds the table alone; a bad command line
// gets `dloco: error: …` on stderr from apps/main.cc.
#pragma once

namespace dloco {

/// Sets spdlog's default logger up as described above. Call once, first thing in main(), before any thread starts
/// (spdlog's registry is thread-safe afterwards). Without it, spdlog's own default (every level on stdout with a
/// date and the level in brackets) applies, which is what the test binaries use.
void init_logging();

}  // namespace dloco
