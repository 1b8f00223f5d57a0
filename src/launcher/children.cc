// Child processes of a launcher; see children.h.
#include "launcher/children.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/atomic_file.h"
#include "core/check.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"
#include "train/run.h"
#include "train/threads.h"

extern char** environ;

namespace dloco {

using Clock = std::chrono::steady_clock;

std::filesystem::path self_exe() { return std::filesystem::read_symlink("/proc/self/exe"); }

// Spawns `dloco ARGS...` with stdout/stderr appended to `log` and the thread environment set before exec.
pid_t spawn(const std::vector<std::string>& args, const std::filesystem::path& log, int threads, pid_t pgroup) {
  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    if (kv.rfind("OMP_NUM_THREADS=", 0) == 0 || kv.rfind("OPENBLAS_NUM_THREADS=", 0) == 0 ||
        kv.rfind("OMP_WAIT_POLICY=", 0) == 0 || kv.rfind("MKL_NUM_THREADS=", 0) == 0) {
      continue;
    }
    env_store.push_back(kv);
  }
  env_store.push_back("OMP_NUM_THREADS=1");
  env_store.push_back("OPENBLAS_NUM_THREADS=" + std::to_string(threads));
  env_store.push_back("MKL_NUM_THREADS=" + std::to_string(threads));
  env_store.push_back("OMP_WAIT_POLICY=PASSIVE");
  std::vector<char*> envp;
  for (auto& kv : env_store) envp.push_back(kv.data());
  envp.push_back(nullptr);
  const std::string exe = self_exe().string();
  std::vector<std::string> argv_store = {exe};
  argv_store.insert(argv_store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // Ctrl-C reaches the launcher, which stops children
  posix_spawnattr_setpgroup(&attr, pgroup);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw InputError("cannot start '" + exe + "': " + std::strerror(rc));
  return pid;
}


void reap(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.exited || c.pid <= 0) continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.exited = true;
      c.status = status;
      c.died_at = Clock::now();
    }
  }
}

// Sends SIGTERM, waits up to `grace`, then SIGKILL.
void stop_children(std::vector<Child>& children, std::chrono::seconds grace) {
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) ::kill(c.pid, SIGTERM);
  }
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    reap(children);
    if (std::all_of(children.begin(), children.end(), [](const Child& c) { return c.exited; })) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) ::kill(c.pid, SIGKILL);
  }
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) ::waitpid(c.pid, &c.status, 0);
    c.exited = true;
  }
}

RunFolder prepare_run_folder(const Config& config) {
  namespace fs = std::filesystem;
  split_shards(fs::path(config.data.dir), "train");
  split_shards(fs::path(config.data.dir), "val");
  Tokenizer(fs::path(config.data.dir) / "tokenizer.model").encode("And God said");
  RunFolder f;
  f.learners = static_cast<int>(config.diloco.learners);
  f.cores = config.run.threads > 0 ? static_cast<int>(config.run.threads) : machine_cores();
  f.child_threads = std::max(1, f.cores / f.learners);
  const fs::path run_dir = config.run_dir();
  fs::create_directories(run_dir / "logs");
  fs::create_directories(run_dir / "events");
  write_file_atomically(run_dir / "config.toml", to_toml(config));
  f.config_path = (run_dir / "config.toml").string();
  return f;
}

nlohmann::json evaluate_final_checkpoint(const Config& config, int cores) {
  apply_thread_budget(thread_budget(cores));
  const auto ckpt = resolve_checkpoint(config.run_dir());
  const auto eval = evaluate_checkpoint(ckpt.dir, std::nullopt, 0, cores);
  return {{"checkpoint", ckpt.dir.string()},
          {"val_loss", eval["val_loss"]},
          {"val_perplexity", eval["val_perplexity"]},
          {"sample", generate_from_checkpoint(ckpt.dir, "And God said", 48, 0.8, 40, config.run.seed, cores)}};
}

}  // namespace dloco
