// Child processes: spawning, reaping, stopping; see children.h.
#include "process/children.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/check.h"
#include "process/private_file.h"

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
        kv.rfind("OMP_WAIT_POLICY=", 0) == 0 || kv.rfind("MKL_NUM_THREADS=", 0) == 0 ||
        kv.rfind("DLOCO_PARENT_PID=", 0) == 0) {
      continue;
    }
    env_store.push_back(kv);
  }
  env_store.push_back("OMP_NUM_THREADS=1");
  env_store.push_back("OPENBLAS_NUM_THREADS=" + std::to_string(threads));
  env_store.push_back("MKL_NUM_THREADS=" + std::to_string(threads));
  env_store.push_back("OMP_WAIT_POLICY=PASSIVE");
  env_store.push_back("DLOCO_PARENT_PID=" + std::to_string(::getpid()));  // die_with_launcher()
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

bool die_with_launcher() {
  const char* parent = std::getenv("DLOCO_PARENT_PID");
  if (parent == nullptr || *parent == '\0') return true;
  const long pid = std::strtol(parent, nullptr, 10);
  if (pid <= 1) return true;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  return ::getppid() == static_cast<pid_t>(pid);  // else it died before prctl: no signal will come
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  return "status " + std::to_string(status);
}

bool failed_by_itself(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) != 0;
  if (!WIFSIGNALED(status)) return false;
  const int sig = WTERMSIG(status);
  return sig == SIGSEGV || sig == SIGABRT || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

std::string last_error_line(const std::filesystem::path& log) {
  std::ifstream in(log, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 65536);
  in.seekg(from);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  std::string last, last_error;
  std::stringstream lines(tail);
  for (std::string line; std::getline(lines, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    last = line;
    if (line.find("error") != std::string::npos || line.find("Error") != std::string::npos ||
        line.find("what()") != std::string::npos || line.find("terminate") != std::string::npos) {
      last_error = line;
    }
  }
  std::string out = last_error.empty() ? last : last_error;
  if (out.size() > 600) out = out.substr(0, 600) + "…";
  return out;
}

bool stepped_since(const std::filesystem::path& events, std::uintmax_t offset) {
  std::ifstream in(events, std::ios::binary);
  if (!in) return false;
  in.seekg(static_cast<std::streamoff>(offset));
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"step\"") != std::string::npos) return true;
  }
  return false;
}

std::uintmax_t file_size_or_zero(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
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
void stop_children(std::vector<Child>& children, std::chrono::seconds grace, const std::function<bool()>& hurry) {
  for (auto& c : children) {
    if (!c.exited && c.pid > 0) ::kill(c.pid, SIGTERM);
  }
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline && !(hurry && hurry())) {
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

}  // namespace dloco
