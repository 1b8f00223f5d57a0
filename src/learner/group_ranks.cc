// Starting and joining a learner group's ranks; see group_ranks.h.
#include "learner/group_ranks.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <spdlog/spdlog.h>

#include "core/check.h"
#include "learner/group_engine.h"
#include "learner/group_inner_job.h"
#include "parallel/rank_engine.h"
#include "process/atomic_file.h"
#include "process/children.h"
#include "process/events.h"
#include "process/host.h"
#include "process/private_file.h"
#include "train/fragment_io.h"
#include "train/threads.h"

namespace dloco {

namespace fs = std::filesystem;

namespace {
double rendezvous_s(const GroupOptions& o, double bootstrap_timeout_s, double timeout_s) {
  return o.rendezvous_timeout_s > 0 ? o.rendezvous_timeout_s : bootstrap_timeout_s + timeout_s;
}

// The replica flags (the dp baseline over groups) together and in range, before any rendezvous.
void check_replicas(const Config& config, const GroupOptions& g, bool rank) {
  if (g.replicas == 0 && g.replica_store.empty() && g.replica_rank == -1) return;
  if (!rank || config.diloco.mode != Mode::kDp) {
    throw InputError("--replicas, --replica-rank and --replica-store are for a rank (--rank ≥ 1) of a dp baseline's "
                     "learner group (diloco.mode = \"dp\"); its worker passes them");
  }
  if (g.replicas < 1 || g.replica_store.empty() || g.replica_rank < 0 || g.replica_rank >= g.replicas) {
    throw InputError("--replicas (" + std::to_string(g.replicas) + " ≥ 1), --replica-rank (" +
                     std::to_string(g.replica_rank) + " in [0, --replicas)) and --replica-store go together");
  }
}
}  // namespace

double group_timeout_s(const Config& config, int id) {
  const double t = config.parallel_for(id).timeout_s;
  return config.diloco.mode == Mode::kDecoupled ? t : std::max(t, config.run.collective_timeout_s);
}

GroupRanks::GroupRanks(const Config& config, int id, const fs::path& run_dir, GroupOptions options, int threads,
                       double bootstrap_timeout_s)
    : options_(std::move(options)),
      bootstrap_timeout_s_(bootstrap_timeout_s),
      ranks_(static_cast<int>(config.parallel_for(id).ranks())),
      timeout_s_(group_timeout_s(config, id)) {
  check_replicas(config, options_, /*rank=*/config.diloco.mode == Mode::kDp);
  DLOCO_CHECK_GE(ranks_, 1);
  apply_run_security(security_, config);
  const fs::path folder = run_dir / "groups" / ("learner_" + std::to_string(id));
  fs::create_directories(folder);
  if (options_.store.empty()) {  // ours alone: a fresh rendezvous (a stale file would hold an old group's keys)
    options_.store = (folder / (std::to_string(::getpid()) + ".store")).string();
    owned_store_ = true;
    std::error_code ec;
    fs::remove(options_.store, ec);
  }  // a given store is the user's: ranks started elsewhere may already have arrived in it
  if (!is_tcp_rendezvous(options_.store)) fs::create_directories(fs::path(options_.store).parent_path());
  if (!options_.spawn) return;
  fs::create_directories(run_dir / "logs");
  config_file_ = folder / (std::to_string(::getpid()) + ".config.toml");
  const fs::path& config_file = config_file_;
  write_private_file_atomically(config_file, to_toml(config));
  for (int r = 1; r < ranks_; ++r) {
    std::vector<std::string> args{"learner", "--config", config_file.string(), "--id", std::to_string(id), "--rank",
                                  std::to_string(r), "--group-store", options_.store, "--leader-pid", std::to_string(::getpid()), "--run-dir", run_dir.string(),
                                  "--group-rendezvous-s",
                                  std::to_string(rendezvous_s(options_, bootstrap_timeout_s, timeout_s_)),
                                  "--set", "run.threads=" + std::to_string(threads)};
    if (!options_.host.empty()) args.insert(args.end(), {"--group-host", options_.host});
    if (options_.replicas > 0) {
      for (const std::string& a : {std::string("--replica-store"), options_.replica_store,
                                   std::string("--replica-rank"), std::to_string(options_.replica_rank),
                                   std::string("--replicas"), std::to_string(options_.replicas)}) {
        args.push_back(a);
      }
    }
    pids_.push_back(spawn(args,
                          run_dir / "logs" / ("learner_" + std::to_string(id) + "_rank_" + std::to_string(r) + ".log"),
                          threads, ::getpgrp()));  // the leader's process group: faults signal them together
    children_.push_back({"rank", -1, pids_.back()});
  }
}

GroupRanks::~GroupRanks() {
  stop_children(children_, std::chrono::seconds(2));
  std::error_code ec;
  if (!config_file_.empty()) fs::remove(config_file_, ec);
  if (owned_store_) fs::remove(options_.store, ec);  // a group that failed leaves it behind otherwise
}

void GroupRanks::kill() { stop_children(children_, std::chrono::seconds(0)); }

std::string GroupRanks::failed_rank() {
  reap(children_);
  for (size_t i = 0; i < children_.size(); ++i) {
    const Child& c = children_[i];
    if (!c.exited) continue;
    const std::string who = "rank " + std::to_string(i + 1);
    if (WIFSIGNALED(c.status)) return who + " was killed by signal " + std::to_string(WTERMSIG(c.status));
    if (WIFEXITED(c.status) && WEXITSTATUS(c.status) != 0 && WEXITSTATUS(c.status) != 3) {
      return who + " exited with status " + std::to_string(WEXITSTATUS(c.status));
    }
  }
  return "";
}

std::unique_ptr<Collective> GroupRanks::join() const {
  CollectiveOptions o = security_;
  o.store = options_.store;
  o.rank = 0;
  o.world = ranks_;
  o.hostname = options_.host;
  o.timeout_s = timeout_s_;
  o.rendezvous_timeout_s = rendezvous_s(options_, bootstrap_timeout_s_, timeout_s_);
  return std::make_unique<Collective>(o);
}

int run_group_rank(const Config& config, const GroupRankOptions& options) {
  const ParallelConfig& parallel = config.parallel_for(options.id);
  if (options.rank < 1 || options.rank >= parallel.ranks()) {
    throw InputError("--rank " + std::to_string(options.rank) + " is outside [1, R = " +
                     std::to_string(parallel.ranks()) + ") for learner " + std::to_string(options.id));
  }
  check_replicas(config, options.group, /*rank=*/true);
  if (options.group.store.empty()) throw InputError("--rank needs --group-store (the leader's rendezvous: a file or tcp://HOST:PORT)");
  if (options.leader > 0) {  // spawned by its leader: die with it
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != options.leader) return 3;  // the leader is already gone
  }
  apply_thread_budget(thread_budget(static_cast<int>(config.run.threads)));
  fs::create_directories(options.run_dir / "events");
  const std::string who = "learner_" + std::to_string(options.id) + "_rank_" + std::to_string(options.rank);
  EventLog events(options.run_dir / "events" / (who + ".jsonl"), Role::kLearner, options.id);
  // The group's initial GPT (the leader's seed): built here only when the group kind needs it whole (not ZeRO-3 ×
  // TP's sharded initialisation).
  const uint64_t seed = config.run.seed + 1 + static_cast<uint64_t>(options.id);
  const FragmentLayout layout = model_layout(config.model, config.diloco);
  try {
    CollectiveOptions o;
    apply_run_security(o, config);
    o.store = options.group.store;
    o.rank = options.rank;
    o.world = static_cast<int>(parallel.ranks());
    o.hostname = options.group.host;
    o.timeout_s = group_timeout_s(config, options.id);
    o.rendezvous_timeout_s = rendezvous_s(options.group, 120, o.timeout_s);  // the leader passes its own
    Collective group(o);
    auto engine = make_group_engine(config.model, seed, parallel, config.train, group, options.run_dir / "offload" / who);
    std::unique_ptr<Collective> replicas;  // the dp baseline: this rank of every learner
    if (options.group.replicas > 0) {  // checked above
      CollectiveOptions ro = o;
      ro.store = replica_rendezvous(options.group.replica_store, options.rank);
      ro.rank = options.group.replica_rank;
      ro.world = options.group.replicas;
      ro.hostname = options.group.host;
      ro.timeout_s = config.run.collective_timeout_s;  // it waits for the slowest learner, as dp's all-reduce does
      ro.rendezvous_timeout_s = o.rendezvous_timeout_s;
      replicas = std::make_unique<Collective>(ro);
      engine->set_replicas(replicas.get());
    }
    events.emit("rank_joined", {{"pid", ::getpid()}, {"host", hostname()}, {"rank", options.rank},
                                {"group", engine->describe()}, {"replicas", options.group.replicas}});
    const int64_t steps = serve_group_rank(*engine, group, layout, config.train, config.model);
    events.emit("rank_stopped", {{"steps", steps}, {"bytes_sent", group.bytes_sent()},
                                 {"replica_bytes_sent", replicas ? replicas->bytes_sent() : 0}});
    return 0;
  } catch (const CollectiveError& e) {
    events.emit("rank_failed", {{"error", e.what()}});
    spdlog::warn("[{}] the group failed: {}", who, e.what());
    return 3;
  }
}

GroupTask group_task(const Config& config, int task) {
  if (task < 0) throw InputError("task " + std::to_string(task) + " is negative");
  int first = 0;
  for (int id = 0; id < config.diloco.learners; ++id) {
    const int ranks = static_cast<int>(config.parallel_for(id).ranks());
    if (task < first + ranks) return GroupTask{id, task - first, ranks, first};
    first += ranks;
  }
  throw InputError("task " + std::to_string(task) + " is beyond the ranks of the " +
                   std::to_string(config.diloco.learners) + " learners (" + std::to_string(first) +
                   " tasks in all): give the job as many tasks as the learners have ranks");
}

int learners_for_tasks(const Config& config, int tasks) {
  if (tasks < 1) throw InputError("a job of " + std::to_string(tasks) + " tasks has no learner");
  int used = 0, last = 0;
  std::string counted;
  for (int id = 0; used < tasks; ++id) {
    last = static_cast<int>(config.parallel_for(id).ranks());
    used += last;
    counted += (counted.empty() ? "" : " + ") + std::to_string(last);
    if (used == tasks) return id + 1;
  }
  throw InputError("the job's " + std::to_string(tasks) + " tasks do not end on a learner's last rank: its learners' "
                   "ranks are " + counted + " = " + std::to_string(used) + " (give the job " +
                   (used > last ? std::to_string(used - last) + " or " : "") + std::to_string(used) + " tasks)");
}

}  // namespace dloco
