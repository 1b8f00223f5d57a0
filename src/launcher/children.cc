// Child processes of a launcher; see children.h.
#include "launcher/children.h"

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

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/private_file.h"
#include "sim/report.h"
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
  write_private_file_atomically(run_dir / "config.toml", to_toml(config));
  copy_tokenizer_into_run(config);
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

namespace dloco {

std::string final_eval_skip_reason(bool hurry, const std::string& failure) {
  if (hurry) return "a second signal asked to stop at once";
  if (!failure.empty()) return "the run failed";
  return "";
}

nlohmann::json final_evaluation(const Config& config, int cores, const std::string& skip_reason) {
  nlohmann::json none = {
      {"checkpoint", nullptr}, {"val_loss", nullptr}, {"val_perplexity", nullptr}, {"sample", nullptr}};
  if (!skip_reason.empty()) {
    none["skipped"] = skip_reason;
    return none;
  }
  try {
    return evaluate_final_checkpoint(config, cores);
  } catch (const InputError& e) {  // no valid checkpoint: the run stopped before its first one
    none["skipped"] = e.what();
    return none;
  }
}

std::string run_status(const Config& config, bool interrupted, const std::string& failure, int64_t tokens_trained) {
  if (!failure.empty()) return "failed";
  if (interrupted) return "stopped";
  return tokens_trained < config.complete_tokens() ? "incomplete" : "finished";
}

int report_exit_code(const nlohmann::json& report) {
  const int sig = report.value("signal", 0);
  if (sig != 0) return 128 + sig;
  const std::string status = report.value("status", "");
  if (status == "finished") return 0;
  if (status == "incomplete") return 3;
  return 1;
}

namespace {

// (x, y) of the events named `event` in a JSON-lines log, with y the field `y` and x the field `x`; bad lines skipped.
std::vector<std::pair<double, double>> event_points(const std::filesystem::path& log, const std::string& event,
                                                    const char* x, const char* y) {
  std::vector<std::pair<double, double>> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"" + event + "\"") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || j.value("event", "") != event || !j.contains(x) || !j.contains(y)) continue;
    if (!j[x].is_number() || !j[y].is_number()) continue;
    const double xv = j[x].get<double>(), yv = j[y].get<double>();
    if (xv > 0 && std::isfinite(yv)) out.emplace_back(xv, yv);
  }
  return out;
}

// At most ~400 points: means over equal windows (a training loss per step is noisy and long).
sim::PlotSeries series_of(const std::string& title, const std::vector<std::pair<double, double>>& points) {
  sim::PlotSeries s{title, {}, {}};
  const size_t window = std::max<size_t>(1, points.size() / 400);
  for (size_t i = 0; i + window <= points.size(); i += window) {
    double x = 0, y = 0;
    for (size_t k = i; k < i + window; ++k) x += points[k].first, y += points[k].second;
    s.x.push_back(x / window);
    s.y.push_back(y / window);
  }
  return s;
}

}  // namespace

std::filesystem::path write_loss_plot(const Config& config, const nlohmann::json& report) {
  namespace fs = std::filesystem;
  const fs::path run = config.run_dir(), events = run / "events";
  std::vector<sim::PlotSeries> series;
  std::vector<std::pair<double, double>> val;
  if (config.diloco.mode == Mode::kLocal) {
    series.push_back(series_of("training loss", event_points(run / "events.jsonl", "progress", "step", "loss")));
    val = event_points(run / "events.jsonl", "eval", "step", "val_loss");
  } else {
    const bool decoupled = config.diloco.mode == Mode::kDecoupled;
    std::vector<std::pair<int, fs::path>> logs;  // (id, file), by id
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(events, ec)) {
      const std::string name = entry.path().filename().string(), prefix = decoupled ? "learner_" : "worker_";
      const bool rank = name.find("_rank_") != std::string::npos;  // a learner group's ranks log no loss
      if (name.rfind(prefix, 0) != 0 || rank || entry.path().extension() != ".jsonl") continue;
      try {
        logs.emplace_back(std::stoi(name.substr(prefix.size())), entry.path());
      } catch (const std::exception&) {
      }
    }
    std::sort(logs.begin(), logs.end());
    for (const auto& [id, file] : logs) {
      auto points = event_points(file, "step", "step", "loss");
      if (!points.empty()) {
        series.push_back(series_of((decoupled ? "learner " : "worker ") + std::to_string(id), points));
      }
    }
    val = decoupled ? event_points(events / "evaluator.jsonl", "eval", "global_step", "val_loss")
                    : event_points(events / "worker_0.jsonl", "eval", "step", "val_loss");
  }
  if (report.value("final_val_loss", nlohmann::json()).is_number() && report.value("steps", 0) > 0) {
    val.emplace_back(report["steps"].get<double>(), report["final_val_loss"].get<double>());
  }
  if (!val.empty()) series.push_back(series_of("global model, validation", val));
  std::erase_if(series, [](const sim::PlotSeries& s) { return s.x.empty(); });
  if (series.empty()) {
    std::printf("no loss plot: the run logged no step\n");
    return {};
  }
  const fs::path out = run / "loss.png";
  try {
    sim::plot(series, "loss of run " + config.run.name, "step", "loss (nats/token)", false, out);
  } catch (const InputError& e) {
    std::printf("no loss plot: %s\n", e.what());
    return {};
  }
  return out;
}

}  // namespace dloco
