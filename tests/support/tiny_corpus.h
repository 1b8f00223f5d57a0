// Shared by the process tests: a scratch folder with a tiny tokenized corpus (vocabulary 400) made by the real
// dloco-data tool, so `dloco train` runs on it in seconds; a tiny decoupled config; reading event logs.
//
// Machine speed: the process tests size their runs in steps and trigger their faults at steps, so they must pass
// on a machine 2–3× faster or slower than this one. To check the slower side, run them with the environment
// variable DLOCO_TEST_SLOWDOWN=3: every config written here then makes each of its M learner slots 3× slower
// (run.slowdown = "0:3,1:3,…": a learner sleeps 2× its steady compute after each step). Learners a plan adds
// (ids ≥ M) are not slowed (run.slowdown names the M slots only); slowdown_of(id, M) says which factor applies.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dloco::testing_support {

/// DLOCO_TEST_SLOWDOWN as a factor ≥ 1 (1 when unset; a value that is not a number ≥ 1 counts as unset).
inline double test_slowdown() {
  const char* v = std::getenv("DLOCO_TEST_SLOWDOWN");
  if (v == nullptr || *v == 0) return 1.0;
  char* end = nullptr;
  const double f = std::strtod(v, &end);
  return end != v && *end == 0 && std::isfinite(f) && f >= 1.0 ? f : 1.0;
}

/// The slowdown factor the configs written here give learner `id` of a run of M learners.
inline double slowdown_of(int id, int learners) { return id >= 0 && id < learners ? test_slowdown() : 1.0; }

/// Creates (afresh) temp/<prefix>_<pid>/ with corpus.txt and data/ (tokenizer + shards); points DLOCO_DATA_BIN at
/// `data_tool`. Returns the folder; returns an empty path if dloco-data failed.
inline std::filesystem::path make_tiny_corpus(const std::string& prefix, const std::string& data_tool) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  ::setenv("DLOCO_DATA_BIN", data_tool.c_str(), 1);
  {
    std::ofstream txt(root / "corpus.txt");
    for (int i = 0; i < 6000; ++i) txt << "And it came to pass on day " << i % 97 << " that the word was spoken.\n";
  }
  const std::string cmd = data_tool + " prepare " + (root / "corpus.txt").string() + " --out " +
                          (root / "data").string() + " --vocab-size 400 --threads 1 > /dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? root : fs::path();
}

/// Writes root/<name>.toml: a tiny decoupled run on the tiny corpus (M learners, P = 4 fragments, H = 4, τ = 1,
/// K = 1), run folder root/<name>. `extra` is appended under [run] (e.g. "restart_delay_s = -1.0\n"),
/// `train_extra` under [train], `data_extra` under [data]. Under DLOCO_TEST_SLOWDOWN every one of the M slots is
/// slowed (see above).
inline std::filesystem::path write_decoupled_config(const std::filesystem::path& root, const std::string& name,
                                                    int64_t total_tokens, const std::string& extra = "",
                                                    int batch_size = 8, int d_model = 32, int learners = 3,
                                                    int eval_interval = 10, const std::string& train_extra = "",
                                                    const std::string& data_extra = "") {
  const std::filesystem::path path = root / (name + ".toml");
  std::string slowdown;
  if (test_slowdown() > 1.0) {
    for (int id = 0; id < learners; ++id) {
      slowdown += (id > 0 ? "," : "") + std::to_string(id) + ":" + std::to_string(test_slowdown());
    }
    slowdown = "slowdown = \"" + slowdown + "\"\n";
  }
  std::ofstream(path) << "[model]\npreset = \"tiny\"\nvocab_size = 400\nd_model = " << d_model << "\n"
                      << "[data]\ndir = \"" << (root / "data").string() << "\"\n" << data_extra
                      << "[train]\nbatch_size = " << batch_size << "\ntotal_tokens = " << total_tokens
                      << "\nlr = 3e-3\nwarmup_steps = 5\neval_interval = " << eval_interval << "\neval_tokens = 4096\n"
                      << "checkpoint_interval = 0\n" << train_extra
                      << "[diloco]\nmode = \"decoupled\"\nlearners = " << learners
                      << "\ninner_steps = 4\nfragments = 4\noverlap = 1\nquorum = 1\n"
                      << "[run]\nname = \"" << name << "\"\nout_dir = \"" << root.string()
                      << "\"\nthreads = 2\nreport_interval_s = 1.0\n"
                      << slowdown << extra;
  return path;
}

/// Every complete line of a JSON-lines event log (events/<role>.jsonl); empty if the file does not exist yet. A
/// last line without its newline is being written by a live process (stdio may split a long line into several
/// writes): it is left for the next read.
inline std::vector<nlohmann::json> read_events(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline after it: unfinished
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

/// Removes the folder unless DLOCO_KEEP_TEST_RUNS is set (to inspect a failed run).
inline void remove_unless_kept(const std::filesystem::path& root) {
  if (!std::getenv("DLOCO_KEEP_TEST_RUNS")) std::filesystem::remove_all(root);
}

}  // namespace dloco::testing_support
