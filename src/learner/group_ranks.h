// Starting the ranks of a learner group (docs/parallel.md "A learner of many ranks"): the leader (the `dloco
// learner` the launcher or a user started) spawns ranks 1 … R − 1 of its group on this machine, each its own
// process with its share of the learner's cores, and they meet through a fresh rendezvous file. A rank dies with
// its leader (PR_SET_PDEATHSIG), and the leader stops its ranks when it exits; a rank that dies makes the
// leader's next collective fail, so the learner stops and is restarted as a whole group (by the launcher, like any
// learner that died). Ranks on other machines are started by hand with `dloco learner --rank R --group-store F`
// (F on a filesystem every machine of the group sees) and the leader with --no-spawn-ranks.
// Deliberately not here: what the ranks run (learner/group_inner_job.h).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "collective/process_group.h"
#include "core/config.h"
#include "process/children.h"

namespace dloco {

/// The deadline of learner `id`'s group collectives and of its ranks' wait for a command, s: parallel.timeout_s,
/// and in the baselines (dp, diloco, streaming) at least run.collective_timeout_s, since a leader waits that long
/// in an all-reduce over the workers while its ranks wait for its next command.
double group_timeout_s(const Config& config, int id);

/// How a learner's group meets.
struct GroupOptions {
  std::string store;            // the rendezvous: a file, or tcp://HOST:PORT that the leader (rank 0) serves
                                // (collective/process_group.h); empty = run_dir/groups/learner_<id>/<leader pid>.store
  std::string host = "";        // address Gloo binds and advertises on this machine; "" = loopback for a file, the
                                // address on the route to HOST for tcp://
  bool spawn = true;            // the leader starts ranks 1 … R − 1 on this machine
  double rendezvous_timeout_s = 0;  // how long a rank waits for the others to arrive; 0 = the leader's bootstrap
                                    // deadline + parallel.timeout_s (the leader passes it to the ranks it spawns)
  // The dp baseline over learner groups (parallel/rank_engine.h set_replicas): rank r ≥ 1 also joins
  // "<replica_store>.rank_<r>" with the same rank of every other learner, as rank `replica_rank` of `replicas`
  // (the leaders average over the workers' own group). replicas = 0: not a dp baseline.
  std::string replica_store;
  int replica_rank = -1;
  int replicas = 0;
};

/// The leader's handle on its group's other ranks.
class GroupRanks {
 public:
  /// Spawns ranks 1 … R − 1 of learner `id` (R = config.parallel_for(id).ranks() ≥ 1) with `threads` BLAS threads
  /// each, logging to run_dir/logs/learner_<id>_rank_<r>.log. Throws InputError when a process cannot start.
  /// `bootstrap_timeout_s`: the leader's deadline to reach the syncer, which it spends before it joins; the ranks'
  /// rendezvous deadline is that plus parallel.timeout_s (unless options.rendezvous_timeout_s is set).
  GroupRanks(const Config& config, int id, const std::filesystem::path& run_dir, GroupOptions options, int threads,
             double bootstrap_timeout_s);
  /// SIGTERM, then SIGKILL after 2 s, to every rank still running; removes the rendezvous file it made and the
  /// config file it wrote for the ranks.
  ~GroupRanks();
  GroupRanks(const GroupRanks&) = delete;
  GroupRanks& operator=(const GroupRanks&) = delete;

  /// Joins the group as rank 0 (blocks until every rank arrived, up to the rendezvous deadline). Throws
  /// CollectiveError.
  std::unique_ptr<Collective> join() const;
  const std::string& store() const { return options_.store; }
  const std::vector<pid_t>& pids() const { return pids_; }
  /// After a collective failed: "rank r was killed by signal 9" (or "… exited with status s") when one of the
  /// spawned ranks died of something other than a failed collective (exit 3) or a clean exit, else empty. Tells a
  /// group that failed on its own from one that a peer learner took down (the dp baseline's launcher holds out
  /// only the former).
  std::string failed_rank();
  /// SIGKILLs every rank still running and reaps it (after a failed collective: their sockets close, so an operation
  /// of this process still blocked on a hung rank fails instead of holding its exit until the deadline).
  void kill();

 private:
  GroupOptions options_;
  double bootstrap_timeout_s_;
  bool owned_store_ = false;           // the default, pid-named store: removed at the end
  std::filesystem::path config_file_;  // written for the spawned ranks
  CollectiveOptions security_;         // the run's secret and trusted_network, for join()
  int ranks_;
  double timeout_s_;
  std::vector<pid_t> pids_;
  std::vector<Child> children_;  // the same processes, for reaping
};

/// One rank 1 … R − 1 of a group, as its own process.
struct GroupRankOptions {
  int id = 0;                    // the learner slot
  int rank = 1;                  // this rank, 1 ≤ rank < R
  std::filesystem::path run_dir;  // where its events go (run_dir/events/learner_<id>_rank_<r>.jsonl)
  GroupOptions group;            // store must be set
  pid_t leader = 0;              // the leader that spawned it (the rank exits at once if it is gone); 0 = remote
};

/// The rank's process: joins the group, builds its RankEngine from the same initial GPT as the leader and serves
/// the leader's commands until told to stop. Returns 0 after a stop, 3 when the group failed (the leader died or
/// a deadline passed). Throws InputError on a bad rank or config.
int run_group_rank(const Config& config, const GroupRankOptions& options);

/// Where task `task` of a job whose tasks are the learners' ranks in order sits (scripts/slurm/dloco.sbatch):
/// learner 0's R_0 = config.parallel_for(0).ranks() ranks are tasks 0 … R_0 − 1, learner 1's the next R_1, and so
/// on over M = config.diloco.learners. rank 0 is the learner's leader; leader_task its task.
struct GroupTask {
  int id = 0;           // the learner
  int rank = 0;         // its rank in the learner's group, 0 … ranks − 1
  int ranks = 1;        // R of that learner
  int leader_task = 0;  // the task of its rank 0
};
/// Throws InputError when `task` is negative or beyond the M learners' ranks.
GroupTask group_task(const Config& config, int task);

/// The M whose learners' ranks fill exactly `tasks` tasks in group_task's order (learner i's ranks from
/// config.parallel_for(i), whatever config.diloco.learners says). Throws InputError when no M does (a group would
/// straddle the end), naming the ranks of each learner counted.
int learners_for_tasks(const Config& config, int tasks);

}  // namespace dloco
