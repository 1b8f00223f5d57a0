// `dloco train`, `dloco eval`, `dloco generate`: flags -> config -> run, then the report on the console.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "apps/commands.h"
#include "baselines/launcher.h"
#include "baselines/worker.h"
#include "core/check.h"
#include "launcher/launcher.h"
#include "launcher/run_report.h"
#include "learner/group_ranks.h"
#include "learner/learner.h"
#include "model/stages.h"
#include "process/children.h"
#include "process/run_lock.h"
#include "skippipe/pipeline_check.h"
#include "syncer/syncer.h"
#include "train/run.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/handshake.h"
#include "transport/local_address.h"

namespace dloco::apps {

namespace {

int g_exit_code = 0;  // set by `dloco train` after a signal

void print_report(const nlohmann::json& r) {
  std::printf("\n== report: %s (%s) ==\n", r["run"].get<std::string>().c_str(), r["status"].get<std::string>().c_str());
  if (r.contains("failure")) std::printf("failure                %s\n", r["failure"].get<std::string>().c_str());
  if (r["final_val_loss"].is_number()) {
    std::printf("final validation loss  %.4f nats/token (perplexity %.1f)\n", r["final_val_loss"].get<double>(),
                r["final_val_perplexity"].get<double>());
  } else {
    std::printf("final validation loss  - (%s)\n", r.value("final_eval_skipped", std::string("not evaluated")).c_str());
  }
  std::printf("tokens trained         %lld in %lld steps", r["tokens_trained"].get<long long>(),
              r["steps"].get<long long>());
  if (r.value("status", "") == "incomplete") {
    std::printf(" — INCOMPLETE: a run that trains its budget reaches %lld of train.total_tokens = %lld",
                r.value("tokens_complete", 0LL), r.value("tokens_budget", 0LL));
  }
  std::printf("\n");
  if (r.contains("syncs")) {
    std::printf("syncs                  %lld (%s; rank 0 waited %.1f s in collectives)\n", r["syncs"].get<long long>(),
                r["mode"].get<std::string>().c_str(), r.value("wait_seconds_rank0", 0.0));
  }
  if (r.contains("merges")) {
    std::printf("merges                 %lld (learner restarts %lld)\n", r["merges"].get<long long>(),
                r["learner_restarts"].get<long long>());
  }
  if (r.contains("goodput") && r["goodput"].is_number()) {
    std::printf("goodput                %.1f%% (of the work trained, the share not thrown away)\n",
                100 * r["goodput"].get<double>());
  }
  std::printf("wall time              %.1f s (%.0f tokens/s)\n", r["wall_seconds"].get<double>(),
              r["tokens_per_second"].get<double>());
  if (r["checkpoint"].is_string()) std::printf("checkpoint             %s\n", r["checkpoint"].get<std::string>().c_str());
  if (r["sample"].is_string()) {  // one line: the sample's own line breaks shown as ⏎
    std::string sample = r["sample"].get<std::string>();
    for (size_t at = sample.find('\n'); at != std::string::npos; at = sample.find('\n', at + 3)) {
      sample.replace(at, 1, " ⏎ ");
    }
    std::printf("sample                 %s\n", sample.c_str());
  }
  for (const auto& [role, b] : r["bytes"].items()) {
    std::printf("bytes %-16s sent %lld, received %lld\n", role.c_str(), b["sent"].get<long long>(),
                b["received"].get<long long>());
  }
}

void print_plot(const std::filesystem::path& plot) {
  if (!plot.empty()) std::printf("loss plot              %s\n", plot.c_str());
}

// The flags of `dloco train`.
struct TrainFlags {
  std::string config_path;
  std::string resume_dir;
  std::vector<std::string> overrides;
  int64_t stop_after_steps = 0;
  std::string plan_path;
  bool insecure = false;
};

// The flags the role subcommands share (syncer, worker, learner, evaluator).
struct RoleFlags {
  std::string config, run_dir, listen = "0.0.0.0:7070", address_file, syncer;
  int id = 0;
  std::vector<std::string> overrides;
  std::string store;
  std::vector<int> slots;
  int64_t generation = 0;
  std::string resume_from;
  int rank = -1;                 // learner: a rank 1 … R − 1 of a learner group (−1: the leader)
  std::string group_store, group_host, host;
  double group_rendezvous_s = 0;
  int leader_pid = 0;
  bool no_spawn_ranks = false;
  bool insecure = false;
  std::string replica_store;  // a rank of a dp baseline's learner group: its replicas' rendezvous
  int replica_rank = -1, replicas = 0;
  std::vector<std::string> task_hosts;  // learner under srun: the node of every task of the job, in task order
  int group_port = 0;                   // … and the port of learner 0's group store (learner i: + i)
};

// The config of --config, or (--resume) the run folder's saved one, named after the folder given.
Config train_config(const TrainFlags& f, RunOptions& options) {
  if (f.resume_dir.empty()) return load_config(f.config_path, f.overrides);
  std::error_code ec;
  if (!std::filesystem::is_directory(f.resume_dir, ec)) {
    throw InputError("--resume " + f.resume_dir + ": no such run folder (runs are folders under run.out_dir, e.g. "
                     "runs/demo-<time>)");
  }
  if (!std::filesystem::exists(std::filesystem::path(f.resume_dir) / "config.toml", ec)) {
    throw InputError("--resume " + f.resume_dir + ": not a run folder (it has no config.toml)");
  }
  Config config = load_config(std::filesystem::path(f.resume_dir) / "config.toml", f.overrides);
  // The run folder is the one given, even if the run was copied or renamed since.
  const auto dir = std::filesystem::path(f.resume_dir).lexically_normal();
  const auto folder = dir.has_filename() ? dir : dir.parent_path();
  config.run.name = folder.filename().string();
  config.run.out_dir = folder.has_parent_path() ? folder.parent_path().string() : ".";
  options.resume = true;
  return config;
}

void run_train(const TrainFlags& f) {
  if (f.config_path.empty() == f.resume_dir.empty()) throw InputError("give exactly one of --config FILE or --resume RUN_DIR");
  RunOptions options;
  options.stop_after_steps = f.stop_after_steps;
  const Config config = train_config(f, options);
  std::optional<FaultPlan> plan;
  if (!f.plan_path.empty()) {
    if (config.diloco.mode != Mode::kDecoupled && config.diloco.mode != Mode::kDp) {
      throw InputError(std::string("--plan needs diloco.mode = \"decoupled\" or \"dp\" (got \"") + to_string(config.diloco.mode) +
                       "\"): the diloco and streaming baselines cannot re-form their group after a failure");
    }
    plan = load_fault_plan(f.plan_path);
  }
  if (config.diloco.mode != Mode::kLocal) {
    if (f.stop_after_steps > 0) throw InputError("--stop-after-steps applies to diloco.mode = \"local\" only");
    check_data_fits_model(config);  // before any process starts (local mode checks it itself)
    check_device(config.run.device);
    // SkipPipe learners: their setting and schedule against the model and the batch, before any process starts.
    for (int64_t id = 0; id < config.diloco.learners; ++id) {
      const ParallelConfig& g = config.parallel_for(id);
      const bool own = &g != &config.parallel;
      if (g.skippipe() && (own || id == 0)) {
        (void)skippipe::check_skippipe_learner(config, g, own ? "parallel.learner[id = " + std::to_string(id) + "]"
                                                              : "parallel");
      }
    }
    const RunLock lock(config.run_dir());  // one writer per run folder (a live run refuses a second one)
    const auto report = is_collective_mode(config.diloco.mode)
                            ? run_collective_launcher(config, options.resume, plan ? &*plan : nullptr)
                            : run_launcher(config, options.resume, *grpc_transport::make_transport(transport_security(config)),
                                           plan ? &*plan : nullptr);
    print_report(report);
    g_exit_code = report_exit_code(report);
    if (!report.value("already_finished", false)) print_plot(write_loss_plot(config, report));
  } else {
    const RunLock lock(config.run_dir());
    const auto report = run_local(config, options);
    print_report(report);
    g_exit_code = report.value("signal", 0) ? 128 + report.value("signal", 0) : 0;
    print_plot(write_loss_plot(config, report));
  }
}

// --insecure: run.insecure = true (servers may listen off loopback without TLS and a secret, warned).
void add_insecure_flag(CLI::App* cmd, bool& flag) {
  cmd->add_flag("--insecure", flag, "Allow listening off loopback without TLS and a secret (run.insecure = true; a "
                "trusted network only: anyone who reaches the port can read the run and send updates)");
}

void add_train_command(CLI::App& app) {
  auto* train = app.add_subcommand("train", "Run a training job from a TOML config to its report");
  static TrainFlags f;
  train->add_option("--config", f.config_path, "TOML config (e.g. configs/demo.toml)");
  train->add_option("--plan", f.plan_path,
                    "Fault plan to carry out during the run (plans/*.toml; decoupled, or dp with run.recovery). `dloco chaos` adds the "
                    "goodput report and a fault-free reference");
  train->add_option("--resume", f.resume_dir, "Continue a stopped run from its folder (uses its saved config.toml)");
  train->add_option("--set", f.overrides, "Override a config field, e.g. --set train.lr=1e-3 (repeatable)");
  train->add_option("--stop-after-steps", f.stop_after_steps,
                    "Stop after so many steps with a checkpoint (resume later with --resume)");
  add_insecure_flag(train, f.insecure);
  train->callback([] {
    if (f.insecure) f.overrides.push_back("run.insecure=true");
    run_train(f);
  });
}

void add_syncer_command(CLI::App& app, RoleFlags& r) {
  auto* syncer = app.add_subcommand("syncer", "Run the syncer of a decoupled run");
  syncer->group(kRoleGroup);
  syncer->add_option("--config", r.config, "TOML config")->required();
  syncer->add_option("--run-dir", r.run_dir, "Run folder (default: run.out_dir/run.name)");
  syncer->add_option("--listen", r.listen, "Listen address host:port (port 0 = any free port)")->capture_default_str();
  syncer->add_option("--address-file", r.address_file, "Write the bound host:port here");
  syncer->add_option("--set", r.overrides, "Override a config field (repeatable)");
  add_insecure_flag(syncer, r.insecure);
  syncer->callback([&r] {
    if (r.insecure) r.overrides.push_back("run.insecure=true");
    const Config c = load_config(r.config, r.overrides);
    SyncerOptions o{r.run_dir.empty() ? c.run_dir() : std::filesystem::path(r.run_dir), r.listen, r.address_file};
    o.by_hand = std::getenv("DLOCO_PARENT_PID") == nullptr;  // no launcher: rows, final evaluation, report
    if (int rc = run_syncer(c, o, *grpc_transport::make_transport(transport_security(c))); rc != 0) throw InputError("syncer exited with " + std::to_string(rc));
  });
}

// `overrides` with run.threads = SLURM_CPUS_PER_TASK first when Slurm gave this task its cores (an explicit --set
// run.threads still wins, coming later).
std::vector<std::string> with_slurm_threads(std::vector<std::string> overrides) {
  if (const char* cpus = std::getenv("SLURM_CPUS_PER_TASK"); cpus && *cpus) {
    overrides.insert(overrides.begin(), std::string("run.threads=") + cpus);
  }
  return overrides;
}

// A role's rank under srun when its flag (--id, --rank) is not given: its Slurm task rank (SLURM_PROCID), as
// torchrun-style launchers take RANK from it. Throws InputError outside Slurm.
int slurm_task_rank(const char* flag) {
  const char* rank = std::getenv("SLURM_PROCID");
  if (rank == nullptr || *rank == '\0') {
    throw InputError(std::string(flag) + " is required (or start it with srun, which sets SLURM_PROCID)");
  }
  try {
    return std::stoi(rank);
  } catch (const std::exception&) {
    throw InputError(std::string("SLURM_PROCID = '") + rank + "' is not a task rank");
  }
}

// A learner started by srun as one task of a job whose tasks are the learners' ranks in order
// (scripts/slurm/dloco.sbatch, group_task): its learner id and rank from SLURM_PROCID; a group of R > 1 ranks
// meets over a TCP store that its leader serves on the leader task's node. Checks that Slurm placed this task on the
// node the script expected (SLURMD_NODENAME), as block distribution does. Throws InputError.
void place_slurm_task(const Config& c, RoleFlags& r) {
  const char* procid = std::getenv("SLURM_PROCID");
  if (procid == nullptr || *procid == '\0') throw InputError("--task-hosts needs SLURM_PROCID: start it with srun");
  const int task = slurm_task_rank("--task-hosts");
  const int tasks = static_cast<int>(r.task_hosts.size());
  if (task < 0 || task >= tasks) {
    throw InputError("SLURM_PROCID = " + std::to_string(task) + " is not one of the " + std::to_string(tasks) +
                     " tasks --task-hosts names");
  }
  for (const auto& h : r.task_hosts) {
    if (h.empty()) throw InputError("--task-hosts names an empty host (one name per task, comma-separated)");
  }
  if (const char* node = std::getenv("SLURMD_NODENAME"); node && *node && r.task_hosts[task] != node) {
    throw InputError("Slurm placed task " + std::to_string(task) + " on " + node + ", not on " + r.task_hosts[task] +
                     " as --task-hosts says: start the tasks with srun --distribution=block");
  }
  const GroupTask t = group_task(c, task);
  r.id = t.id;
  if (t.ranks == 1) return;
  if (r.group_port < 1 || r.group_port + t.id > 65535) {
    throw InputError("--group-port " + std::to_string(r.group_port) + ": learner " + std::to_string(t.id) +
                     "'s group store needs a port in [1, 65535]");
  }
  const std::string port = std::to_string(r.group_port + t.id);
  r.group_store = "tcp://" + r.task_hosts[t.leader_task] + ":" + port;
  r.rank = t.rank == 0 ? -1 : t.rank;
  r.no_spawn_ranks = true;  // every rank is a task of its own
  if (!r.group_host.empty()) return;
  // Gloo binds this node's address on the route to a node of the group other than this one: the route to the
  // leader's name may lead through loopback on the leader's own node (Debian maps a host's own name to 127.0.1.1).
  // A group all on this node stays on loopback.
  r.group_host = "127.0.0.1";
  for (int k = t.leader_task; k < t.leader_task + t.ranks; ++k) {
    if (r.task_hosts[k] == r.task_hosts[task]) continue;
    const std::string address = local_address_towards(r.task_hosts[k] + ":" + port);
    r.group_host = address.empty() || is_loopback_host(address) ? "" : address;  // "": the store's route decides
    break;
  }
}

void add_worker_command(CLI::App& app, RoleFlags& r) {
  auto* worker = app.add_subcommand("worker", "Run one worker of a baseline (diloco.mode = dp, diloco, streaming)");
  worker->group(kRoleGroup);
  worker->add_option("--config", r.config, "TOML config (the same for every rank)")->required();
  worker->add_option("--rank", r.id, "Rank, 0 ≤ rank < M (under srun: SLURM_PROCID when not given)");
  worker->add_option("--store", r.store, "Where the ranks meet, the same for every rank: a file (c10d FileStore; one "
                     "machine or a shared filesystem), or tcp://HOST:PORT that rank 0 serves (needs "
                     "run.trusted_network off loopback)")->required();
  worker->add_option("--host", r.host, "Address this rank's Gloo binds and advertises (default: 127.0.0.1 for a file, "
                     "this machine's address on the route to HOST for tcp://)");
  worker->add_option("--run-dir", r.run_dir, "Run folder (default: run.out_dir/run.name)");
  worker->add_option("--set", r.overrides, "Override a config field (repeatable)");
  worker->add_option("--slots", r.slots, "dp: learner slot of each rank of this group, e.g. 0,1,3 (default 0…M−1)")
      ->delimiter(',');
  worker->add_option("--generation", r.generation, "dp: how many times the group was formed before this one");
  worker->add_option("--resume-from", r.resume_from, "dp: checkpoint folder (or run folder) to start from");
  worker->callback([&r, worker] {
    if (worker->count("--rank") == 0) r.id = slurm_task_rank("--rank");
    const Config c = load_config(r.config, with_slurm_threads(r.overrides));
    WorkerOptions o;
    o.run_dir = r.run_dir.empty() ? c.run_dir() : std::filesystem::path(r.run_dir);
    o.rank = r.id;
    o.store = r.store;
    o.hostname = r.host;
    o.slots = r.slots;
    o.generation = r.generation;
    o.resume_from = r.resume_from;
    o.by_hand = std::getenv("DLOCO_PARENT_PID") == nullptr;  // no launcher: rank 0 writes the report
    g_exit_code = run_worker(c, o);  // kPeerFailedExit when the group failed under it
  });
}

void add_learner_and_evaluator_commands(CLI::App& app, RoleFlags& r) {
  for (const char* name : {"learner", "evaluator"}) {
    const bool is_learner = std::string(name) == "learner";
    auto* cmd = app.add_subcommand(name, is_learner ? "Run one learner of a decoupled run"
                                                    : "Run the evaluator of a decoupled run");
    cmd->group(kRoleGroup);
    cmd->add_option("--config", r.config, "TOML config (the same as the syncer's)")->required();
    auto* syncer = cmd->add_option("--syncer", r.syncer, "Syncer address host:port (not for --rank)");
    if (!is_learner) syncer->required();
    if (is_learner) {
      cmd->add_option("--id", r.id, "Learner id: 0 ≤ id < M for the launcher's slots; any other id below 65536 "
                      "joins a running job (scavenging). Under srun: SLURM_PROCID when not given");
      cmd->add_option("--rank", r.rank, "Learner group ([parallel], R > 1 ranks): run rank 1 … R − 1 of learner --id "
                      "instead of its leader (needs --group-store)");
      cmd->add_option("--group-store", r.group_store, "Learner group: where its ranks meet, a file (default for the "
                      "leader: run_dir/groups/learner_<id>/<pid>.store; on a filesystem every rank sees) or "
                      "tcp://HOST:PORT that the leader serves (needs run.trusted_network off loopback)");
      cmd->add_option("--group-host", r.group_host, "Learner group: address this rank's Gloo binds (default: 127.0.0.1 "
                      "for a file, this machine's address on the route to HOST for tcp://)");
      cmd->add_option("--leader-pid", r.leader_pid, "Learner group: pid of the leader that spawned this rank (it dies "
                      "with it)");
      cmd->add_flag("--no-spawn-ranks", r.no_spawn_ranks, "Learner group: the leader does not start ranks 1 … R − 1 "
                    "here (they are started by hand with --rank, e.g. on other machines; needs --group-store)");
      cmd->add_option("--group-rendezvous-s", r.group_rendezvous_s, "Learner group: how long a rank waits for the "
                      "others to arrive (default: the leader's bootstrap deadline + parallel.timeout_s)");
      cmd->add_option("--replica-store", r.replica_store, "dp baseline over learner groups (set by the worker that "
                      "spawns this rank): the rendezvous of this rank of every learner, suffixed .rank_<r>");
      cmd->add_option("--replica-rank", r.replica_rank, "dp baseline over learner groups: this learner's rank there");
      cmd->add_option("--replicas", r.replicas, "dp baseline over learner groups: the learners (0: not a dp baseline)");
      cmd->add_option("--task-hosts", r.task_hosts, "Under srun: the node of each task of the job, in task order "
                      "(scripts/slurm/dloco.sbatch); the tasks are the learners' ranks in order, so this task's "
                      "learner and rank come from SLURM_PROCID")->delimiter(',');
      cmd->add_option("--group-port", r.group_port, "With --task-hosts: the port of learner 0's group store on its "
                      "leader's node (learner i: + i)");
    }
    cmd->add_option("--run-dir", r.run_dir, "Folder for this role's events (default: run.out_dir/run.name)");
    cmd->add_option("--set", r.overrides, "Override a config field (repeatable)");
    add_insecure_flag(cmd, r.insecure);
    cmd->callback([is_learner, &r, cmd] {
      const bool by_slurm_task = is_learner && cmd->count("--task-hosts") > 0;
      if (is_learner && cmd->count("--id") == 0 && !by_slurm_task) r.id = slurm_task_rank("--id");
      std::vector<std::string> overrides = with_slurm_threads(r.overrides);
      if (r.insecure) overrides.push_back("run.insecure=true");
      const Config c = load_config(r.config, overrides);
      if (by_slurm_task) {
        if (cmd->count("--id") + cmd->count("--rank") + cmd->count("--group-store") + cmd->count("--no-spawn-ranks")) {
          throw InputError("--task-hosts places this task itself: not with --id, --rank, --group-store or "
                           "--no-spawn-ranks");
        }
        place_slurm_task(c, r);
      } else if (is_learner && cmd->count("--group-port") > 0) {
        throw InputError("--group-port goes with --task-hosts (a learner task under srun)");
      }
      const auto run_dir = r.run_dir.empty() ? c.run_dir() : std::filesystem::path(r.run_dir);
      const GroupOptions group{r.group_store, r.group_host, !r.no_spawn_ranks, r.group_rendezvous_s,
                               r.replica_store, r.replica_rank, r.replicas};
      if (is_learner && r.no_spawn_ranks && r.group_store.empty()) {
        throw InputError("--no-spawn-ranks needs --group-store FILE|tcp://HOST:PORT: the ranks started elsewhere meet "
                         "the leader there");
      }
      if (is_learner && r.rank >= 0) {  // one rank of a learner group: no syncer, no transport
        g_exit_code = run_group_rank(c, GroupRankOptions{r.id, r.rank, run_dir, group, r.leader_pid});
        return;
      }
      if (r.replicas != 0 || !r.replica_store.empty() || r.replica_rank != -1) {
        throw InputError("--replicas, --replica-rank and --replica-store are for a rank (--rank ≥ 1) of a dp "
                         "baseline's learner group, not for a learner's leader");
      }
      if (r.syncer.empty()) throw InputError("--syncer host:port is required (except for --rank)");
      LearnerOptions o{r.syncer, r.id, run_dir};
      o.group = group;
      const auto transport = grpc_transport::make_transport(transport_security(c));
      const int rc = is_learner ? run_learner(c, o, *transport) : run_evaluator(c, o, *transport);
      if (rc != 0) throw InputError(std::string(is_learner ? "learner" : "evaluator") + " exited with " +
                                    std::to_string(rc));
    });
  }
}

void add_eval_command(CLI::App& app) {
  auto* eval = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
  static std::string eval_ckpt, eval_data;
  static int64_t eval_tokens = 0;
  static int eval_threads = 0;
  eval->add_option("checkpoint", eval_ckpt, "Run folder or checkpoint folder")->required();
  eval->add_option("--data", eval_data, "Prepared data folder (default: the checkpoint's data.dir)");
  eval->add_option("--tokens", eval_tokens, "Validation tokens to use (0 = all)");
  eval->add_option("--threads", eval_threads, "CPU threads (0 = all cores)");
  static std::string eval_stages;
  static StageSelection eval_sel;
  eval->add_option("--stage-count", eval_sel.count, "SkipPipe: cut the blocks into S stages (default: one block each)");
  eval->add_option("--stages", eval_stages, "SkipPipe: run only these stages, e.g. 0,2,4 (stage 0 always)");
  eval->add_option("--skip-random", eval_sel.skip_random, "SkipPipe: skip this share of the stages, stage 0 plus a "
                   "random sorted subset redrawn per batch (e.g. 0.5)");
  eval->add_option("--seed", eval_sel.seed, "SkipPipe: seed of --skip-random's subsets");
  eval->callback([eval] {
    // Any SkipPipe flag selects stages; the result then has both perplexities (docs/skippipe.md).
    const bool given_count = eval->count("--stage-count") > 0, given_stages = eval->count("--stages") > 0,
               given_skip = eval->count("--skip-random") > 0;
    const bool staged = given_count || given_stages || given_skip;
    if (given_count && eval_sel.count < 1) throw InputError("--stage-count must be ≥ 1");
    if (given_skip && !(eval_sel.skip_random >= 0 && eval_sel.skip_random < 1)) {
      throw InputError("--skip-random must be in [0, 1) (got " + std::to_string(eval_sel.skip_random) + ")");
    }
    if (given_stages && given_skip) throw InputError("give --stages or --skip-random, not both");
    if (given_stages) eval_sel.stages = parse_stage_list(eval_stages);
    const auto r = evaluate_checkpoint(eval_ckpt, eval_data.empty() ? std::nullopt : std::optional(eval_data),
                                       eval_tokens, eval_threads, staged ? &eval_sel : nullptr);
    std::printf("%s\n", r.dump(2).c_str());
  });
}

void add_generate_command(CLI::App& app) {
  auto* gen = app.add_subcommand("generate", "Sample text from a checkpoint");
  static std::string gen_ckpt, gen_prompt = "And God said";
  static int64_t gen_tokens = 64, gen_top_k = 40;
  static double gen_temperature = 0.8;
  static uint64_t gen_seed = 1;
  static int gen_threads = 0;
  gen->add_option("checkpoint", gen_ckpt, "Run folder or checkpoint folder")->required();
  gen->add_option("--prompt", gen_prompt, "Prompt text")->capture_default_str();
  gen->add_option("--tokens", gen_tokens, "Tokens to generate")->capture_default_str();
  gen->add_option("--temperature", gen_temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  static std::string gen_tokenizer;
  gen->add_option("--tokenizer", gen_tokenizer, "tokenizer.model to use (default: the run folder's copy, else the "
                  "checkpoint's data.dir)");
  gen->add_option("--top-k", gen_top_k, "Sample among the k most likely tokens (0 = all)")->capture_default_str();
  gen->add_option("--seed", gen_seed, "Sampling seed")->capture_default_str();
  gen->add_option("--threads", gen_threads, "CPU threads (0 = all cores)");
  static std::string gen_stages;
  static StageSelection gen_sel;
  gen->add_option("--stage-count", gen_sel.count, "SkipPipe: cut the blocks into S stages (default: one block each)");
  gen->add_option("--stages", gen_stages, "SkipPipe: run only these stages, e.g. 0,2,4 (stage 0 always)");
  gen->callback([gen] {
    const bool given_count = gen->count("--stage-count") > 0, given_stages = gen->count("--stages") > 0;
    const bool staged = given_count || given_stages;
    if (given_count && gen_sel.count < 1) throw InputError("--stage-count must be ≥ 1");
    if (given_stages) gen_sel.stages = parse_stage_list(gen_stages);
    std::printf("%s\n", generate_from_checkpoint(gen_ckpt, gen_prompt, gen_tokens, gen_temperature, gen_top_k,
                                                 gen_seed, gen_threads, staged ? &gen_sel : nullptr, gen_tokenizer)
                            .c_str());
  });
}

}  // namespace

int train_exit_code() { return g_exit_code; }

void add_train_commands(CLI::App& app) {
  add_train_command(app);
  // The roles, each its own process: `dloco syncer` and `dloco learner` also run on separate machines.
  static RoleFlags role;
  add_syncer_command(app, role);
  add_worker_command(app, role);
  add_learner_and_evaluator_commands(app, role);
  add_eval_command(app);
  add_generate_command(app);
}

}  // namespace dloco::apps
