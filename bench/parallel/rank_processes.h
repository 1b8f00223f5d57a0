// What the bench/parallel benchmarks share: a benchmark binary runs as the parent (no --rank flag), which spawns
// itself once per rank through process/children.h's spawn() (posix_spawn, one BLAS thread and one OpenMP thread
// each, its output in a log), and as a rank (--rank r --world W --store FILE --out FILE), which joins a c10d
// FileStore group, measures, and writes one JSON object that the parent reads back. Ranks are processes, so
// /proc/self/status (VmRSS, VmHWM, VmPeak) is one rank's own.
// Deliberately not here: any measurement (each benchmark's .cc decides what a rank does and what is printed).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "collective/process_group.h"
#include "process/children.h"
#include "train/threads.h"

namespace dloco::bench {

namespace fs = std::filesystem;
using Flags = std::map<std::string, std::string>;

/// One flag of a benchmark: `--name VALUE`, its default (as text) and what it sets.
struct FlagSpec {
  std::string name, fallback, help;
};

/// Parses argv with CLI11 against `specs` plus the rank flags the parent passes its ranks (--rank, --world, --store,
/// --out): every flag's value (or its default) as {"name": "value"}. --help prints them and exits 0; an unknown flag
/// or a missing value exits 2 with CLI11's message.
inline Flags parse_flags(const char* name, const std::string& description, std::vector<FlagSpec> specs, int argc,
                         char** argv) {
  CLI::App app{description, name};
  specs.push_back({"rank", "-1", "this process's rank (set by the parent; -1: this process is the parent)"});
  specs.push_back({"world", "1", "ranks in the group (set by the parent)"});
  specs.push_back({"store", "", "the group's c10d FileStore (set by the parent)"});
  specs.push_back({"out", "", "where the rank writes its JSON result (set by the parent)"});
  Flags flags;
  for (const FlagSpec& spec : specs) {
    flags[spec.name] = spec.fallback;
    // The last value of a flag given twice wins: a parent passes its own flags on and appends the rank's.
    CLI::Option* option = app.add_option("--" + spec.name, flags[spec.name], spec.help)
                              ->capture_default_str()
                              ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    if (!spec.fallback.empty() && CLI::Number(spec.fallback).empty()) option->check(CLI::Number);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    std::exit(code == 0 ? 0 : 2);
  }
  return flags;
}

/// The parent's flags as "--name value" pairs for its ranks, without the rank flags and those named in `except`.
inline std::vector<std::string> forward_flags(const Flags& flags, const std::set<std::string>& except = {}) {
  static const std::set<std::string> rank_flags = {"rank", "world", "store", "out"};
  std::vector<std::string> out;
  for (const auto& [name, value] : flags) {
    if (rank_flags.count(name) || except.count(name)) continue;
    out.insert(out.end(), {"--" + name, value});
  }
  return out;
}

inline std::string flag(const Flags& flags, const std::string& key, const std::string& fallback) {
  const auto it = flags.find(key);
  return it == flags.end() ? fallback : it->second;
}
inline int64_t flag_int(const Flags& flags, const std::string& key, int64_t fallback) {
  return std::stoll(flag(flags, key, std::to_string(fallback)));
}
inline double flag_double(const Flags& flags, const std::string& key, double fallback) {
  const auto it = flags.find(key);
  return it == flags.end() ? fallback : std::stod(it->second);
}

/// This process's memory counters from /proc/self/status, bytes.
struct ProcStatus {
  int64_t rss = 0;   // VmRSS: resident now
  int64_t hwm = 0;   // VmHWM: peak resident since start
  int64_t size = 0;  // VmSize: address space now
  int64_t peak = 0;  // VmPeak: peak address space since start
};

inline ProcStatus proc_status() {
  ProcStatus s;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    fields >> key >> kib;
    if (key == "VmRSS:") s.rss = kib * 1024;
    if (key == "VmHWM:") s.hwm = kib * 1024;
    if (key == "VmSize:") s.size = kib * 1024;
    if (key == "VmPeak:") s.peak = kib * 1024;
  }
  return s;
}

inline nlohmann::json to_json(const ProcStatus& s) {
  return {{"rss", s.rss}, {"hwm", s.hwm}, {"size", s.size}, {"peak", s.peak}};
}

// gperftools' C interface, weak: with DLOCO_TCMALLOC=OFF (glibc's malloc) the symbols are null and heap_stats()
// reports -1.
extern "C" int MallocExtension_GetNumericProperty(const char* property, size_t* value) __attribute__((weak));
extern "C" void MallocExtension_ReleaseFreeMemory() __attribute__((weak));

/// What tcmalloc says about its heap, bytes (-1 when tcmalloc is not the allocator).
struct HeapStats {
  int64_t allocated = -1;  // generic.current_allocated_bytes: in use by the program (tensors, everything malloc'd)
  int64_t free = -1;       // tcmalloc.pageheap_free_bytes + the central/thread caches: freed, still mapped
};

inline HeapStats heap_stats() {
  HeapStats h;
  if (MallocExtension_GetNumericProperty == nullptr) return h;
  size_t v = 0;
  if (MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &v)) h.allocated = static_cast<int64_t>(v);
  size_t page = 0, central = 0, thread = 0;
  MallocExtension_GetNumericProperty("tcmalloc.pageheap_free_bytes", &page);
  MallocExtension_GetNumericProperty("tcmalloc.central_cache_free_bytes", &central);
  MallocExtension_GetNumericProperty("tcmalloc.thread_cache_free_bytes", &thread);
  h.free = static_cast<int64_t>(page + central + thread);
  return h;
}

/// Returns tcmalloc's free pages to the kernel (no-op without tcmalloc).
inline void release_free_memory() {
  if (MallocExtension_ReleaseFreeMemory != nullptr) MallocExtension_ReleaseFreeMemory();
}

inline nlohmann::json to_json(const HeapStats& h) { return {{"allocated", h.allocated}, {"free", h.free}}; }

/// A rank's side of the command line: who it is and where its group meets.
struct RankArgs {
  int rank = -1;  // -1: this process is the parent
  int world = 1;
  fs::path store, out;
};

inline RankArgs rank_args(const Flags& flags) {
  RankArgs a;
  a.rank = static_cast<int>(flag_int(flags, "rank", -1));
  a.world = static_cast<int>(flag_int(flags, "world", 1));
  a.store = flag(flags, "store", "");
  a.out = flag(flags, "out", "");
  return a;
}

/// The benchmarks' main: flags parsed by parse_flags(name, description, specs); with --rank this process is one rank
/// (rank_main(flags)), else the parent that spawns them (parent_main(flags, argc, argv)); stdout line-buffered so
/// rows reach a log as they are measured; an exception is printed under `name` and exits 1.
inline int bench_main(const char* name, const std::string& description, std::vector<FlagSpec> specs, int argc,
                      char** argv, int (*rank_main)(const Flags&), int (*parent_main)(const Flags&, int, char**)) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const Flags f = parse_flags(name, description, std::move(specs), argc, argv);
  try {
    return rank_args(f).rank >= 0 ? rank_main(f) : parent_main(f, argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

/// Joins the rank's group (deadline `timeout_s` for the rendezvous and every collective). One thread for LibTorch
/// and one for OpenBLAS (spawn() set the environment; this makes LibTorch's pool follow it).
inline std::unique_ptr<Collective> join_group(const RankArgs& a, double timeout_s = 600) {
  CollectiveOptions o;
  o.store = a.store.string();
  o.rank = a.rank;
  o.world = a.world;
  o.timeout_s = timeout_s;
  return std::make_unique<Collective>(o);
}

inline void one_thread_each() { apply_thread_budget(thread_budget(1)); }

/// Writes a rank's result (to a temporary name, then renamed, so the parent never reads half a file).
inline void write_result(const fs::path& out, const nlohmann::json& j) {
  const fs::path tmp = out.string() + ".tmp";
  std::ofstream(tmp) << j.dump() << "\n";
  fs::rename(tmp, out);
}

/// A fresh folder for one run's store files, logs and results.
inline fs::path fresh_dir(const std::string& what) {
  static int counter = 0;
  const fs::path d = fs::temp_directory_path() /
                     ("dloco_bench_" + what + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// Spawns this executable `world` times as ranks 0 … world − 1 of one group, with `args` appended (one BLAS
/// thread each), and waits up to `timeout_s` for all of them. Returns their results in rank order; when a rank
/// exits non-zero, writes no result or the deadline passes, stops the others (by pid), prints the failed rank's
/// log to stderr and returns an empty vector.
inline std::vector<nlohmann::json> run_ranks(int world, const std::vector<std::string>& args, double timeout_s,
                                             const std::string& what) {
  const fs::path dir = fresh_dir(what);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> a = {
        "--rank",  std::to_string(r),        "--world", std::to_string(world),
        "--store", (dir / "store").string(), "--out",   (dir / ("rank_" + std::to_string(r) + ".json")).string()};
    a.insert(a.end(), args.begin(), args.end());
    pids.push_back(spawn(a, dir / ("rank_" + std::to_string(r) + ".log"), 1));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<bool> done(world, false);
  int failed = -1;
  while (failed < 0 && std::count(done.begin(), done.end(), true) < world) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (done[r] || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = r;
    }
    if (std::chrono::steady_clock::now() > deadline) failed = 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<nlohmann::json> results;
  for (int r = 0; r < world && failed < 0; ++r) {
    std::ifstream in(dir / ("rank_" + std::to_string(r) + ".json"));
    if (!in) {
      failed = r;
      break;
    }
    results.push_back(nlohmann::json::parse(in));
  }
  if (failed >= 0) {
    for (int r = 0; r < world; ++r) {
      if (!done[r]) {
        ::kill(pids[r], SIGKILL);
        ::waitpid(pids[r], nullptr, 0);
      }
    }
    std::ifstream log(dir / ("rank_" + std::to_string(failed) + ".log"));
    std::fprintf(stderr, "rank %d of %s failed; its log:\n%s\n", failed, what.c_str(),
                 std::string(std::istreambuf_iterator<char>(log), {}).c_str());
    results.clear();
  }
  fs::remove_all(dir);
  return results;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace dloco::bench
