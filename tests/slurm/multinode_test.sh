#!/usr/bin/env bash
# Slurm on several nodes (issue 31): a real Slurm cluster of 3 nodes on this one machine — slurmctld plus one slurmd
# per network namespace, each namespace a node with its own address on a bridge (NodeAddr), its own hostname (a UTS
# namespace) and a hosts file naming every node (bind-mounted over /etc/hosts in a private mount namespace; `ip netns
# exec` would remount /sys and hide the cgroups slurmd needs) — runs scripts/slurm/dloco.sbatch across the nodes to the report:
#   1. a decoupled job whose learners are a plain one, a TP2 group and a 3-node SkipPipe pipeline, the groups spanning
#      nodes (their ranks meet over their leaders' TCP stores): the syncer on the first node, every learner ending
#      with Θ;
#   2. a dp baseline, one worker per node, meeting over rank 0's TCP rendezvous: refused without
#      run.trusted_network (naming it), then run with it to rank 0's report.
# Checks each report and that the learners' ranks or the workers really ran on the nodes expected (their hostnames).
# Usage: tests/slurm/multinode_test.sh BUILD_DIR (ctest passes it). Exit 77 (skipped) when not root.
# DLOCO_TEST_SLOWDOWN=F slows the decoupled job's learners F× (run.slowdown).
set -euo pipefail
BUILD=$(cd "${1:?usage: multinode_test.sh BUILD_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "skipped: a Slurm cluster in network namespaces needs root"; exit 77; }
for tool in munged mungekey slurmctld slurmd sbatch sinfo scontrol ip unshare nsenter; do
  command -v "$tool" > /dev/null || { echo "FAILED: $tool missing (scripts/setup.sh installs it)"; exit 1; }
done
dir=$(mktemp -d /tmp/dloco_slurm3.XXXXXX)
p="dsl$(( $$ % 10000 ))"             # namespace and interface prefix (interface names stay under 16 characters)
net="10.79.$(( $$ % 250 + 1 ))"
nodes=(dlocon1 dlocon2 dlocon3)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
  sleep 1
  for pid in "${pids[@]}"; do kill -9 "$pid" 2> /dev/null || true; done
  for i in 1 2 3 w; do ip netns del "$p$i" 2> /dev/null || true; done
  [ -n "${DLOCO_KEEP_TEST_RUNS:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$dir"/*.log "$dir"/*.out; do [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }; done
  exit 1
}
# in_node I CMD…: CMD on node I (its network namespace, the nodes' hosts file); in_node_named also takes its hostname
in_node() {
  local i=$1; shift
  nsenter --net="/run/netns/$p$i" unshare --mount sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$dir/hosts.$i" "$@"
}
in_node_named() {
  local i=$1; shift
  nsenter --net="/run/netns/$p$i" unshare --mount --uts sh -c \
    'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$dir/hosts.$i" "dlocon$i" "$@"
}

# three hosts on one bridge: namespace <p>i is node dlocon<i> at $net.<i>
source "$SRC/scripts/netns.sh"
bridge_hosts "$p" "$net" 1 2 3 || fail "cannot make the 3 hosts (network namespaces on a bridge)"
# Each node's hosts file maps its own name to 127.0.1.1 first, as Debian's does: a group's rank on its leader's node
# must still bind an address the others reach (dloco learner --task-hosts picks the route to another node of it).
for i in 1 2 3; do
  { echo "127.0.0.1 localhost"; echo "127.0.1.1 dlocon$i"; for j in 1 2 3; do echo "$net.$j dlocon$j"; done; } \
    > "$dir/hosts.$i"
done

# munge: one key and socket for every node (a Unix socket is a file: every namespace reaches it)
source "$SRC/tests/slurm/common.sh"
start_munge
pids+=("$(cat "$dir/munged.pid")")

# slurm: the controller on node 1 (under this machine's own hostname, which slurmctld checks, at node 1's address),
# one slurmd per node, each in a UTS namespace named after its node (slurmd finds its NodeName from the hostname)
mkdir -p "$dir/state" "$dir/spool"
{
  slurm_conf_common
  cat <<CONF
ClusterName=dloco-multi
SlurmctldHost=$(hostname -s)($net.1)
SlurmctldPort=6817
SlurmdPort=6818
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmdLogFile=$dir/slurmd.%n.log
CONF
  for i in 1 2 3; do echo "NodeName=dlocon$i NodeAddr=$net.$i NodeHostname=dlocon$i CPUs=2 RealMemory=1000 State=UNKNOWN"; done
  echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE"
} > "$dir/slurm.conf"
export SLURM_CONF="$dir/slurm.conf"
in_node 1 slurmctld -i || fail "slurmctld did not start"
for _ in $(seq 50); do [ -s "$dir/slurmctld.pid" ] && break; sleep 0.2; done
pids+=("$(cat "$dir/slurmctld.pid")")
for i in 1 2 3; do
  mkdir -p "$dir/spool/dlocon$i"
  in_node_named "$i" slurmd || fail "slurmd on dlocon$i did not start"
  for _ in $(seq 50); do [ -s "$dir/slurmd.dlocon$i.pid" ] && break; sleep 0.2; done
  pids+=("$(cat "$dir/slurmd.dlocon$i.pid")")
done
for _ in $(seq 300); do
  idle=$(in_node 1 sinfo -h -N -o %T 2> /dev/null | grep -c '^idle$' || true)
  [ "$idle" = 3 ] && break
  sleep 0.2
done
[ "$idle" = 3 ] || fail "the 3 nodes never became idle ($idle idle: $(in_node 1 sinfo -h -N -o '%N %T' | paste -sd' '))"

# a tiny corpus and the jobs' config, 100 steps per learner (the run folder and the corpus: paths every node sees,
# as on a cluster)
write_tiny_job 3 100

submit() {  # name, tasks per node, config, then the script's arguments after the config
  local name=$1 per_node=$2 config=$3; shift 3
  local env="ALL,DLOCO=$BUILD/bin/dloco,DLOCO_RUN_NAME=$name,DLOCO_MAKE_CERTS=$SRC/scripts/make-certs.sh"
  in_node 1 sbatch --wait --nodes=3 --ntasks-per-node="$per_node" --cpus-per-task=1 --time=10 --chdir="$dir" \
    --output="$dir/$name.out" --export="$env,DLOCO_TLS_DIR=$dir/tls-$name" "$SRC/scripts/slurm/dloco.sbatch" \
    "$config" "$@" > "$dir/sbatch-$name.log" 2>&1 || fail "sbatch --wait ($name)"
}

# 1. decoupled, with learners that are groups spanning nodes: 6 tasks, 2 per node in blocks, are learner 0 (plain,
# task 0 on dlocon1), learner 1 (a TP2 group: tasks 1, 2 on dlocon1, dlocon2) and learner 2 (a SkipPipe pipeline of
# 3 nodes in 2 stages: tasks 3, 4, 5 on dlocon2, dlocon3, dlocon3); the syncer on dlocon1
cat > "$dir/setting.json" <<'JSON'
{"format": "dloco-skippipe-setting", "version": 1, "source": "hand case", "regions": ["A"],
 "nodes": [{"region": "A", "forward_s": 1.0}, {"region": "A", "forward_s": 1.0}, {"region": "A", "forward_s": 1.0}],
 "links": [], "default_link": {"latency_s": 0.1, "bandwidth_bytes_per_s": 1e6}, "hop_overhead_s": 0.05,
 "bytes_per_hop": 16384, "memory_capacity": 2, "backward_factor": 1.5, "head_factor": 0.25}
JSON
cat > "$dir/schedule.json" <<'JSON'
{"format": "dloco-skippipe-schedule", "version": 1, "source": "hand case", "method": "hand",
 "placement": [[0, 1], [2]],
 "micro_batches": [{"id": 0, "data_node": 0, "path": [2], "inject_s": 0},
                   {"id": 1, "data_node": 1, "path": [2], "inject_s": 0}]}
JSON
{ cat "$dir/tiny.toml"  # 76800 tokens: 3 learners × 50 steps of 2 × 8 × 32 (train.grad_accum = 2, below)
  printf '[parallel]\ntimeout_s = 60\n[[parallel.learner]]\nid = 1\ntensor = 2\n'
  printf '[[parallel.learner]]\nid = 2\nskippipe_setting = "setting.json"\nskippipe_schedule = "schedule.json"\n'
} > "$dir/groups.toml"
slow=()
if [ -n "${DLOCO_TEST_SLOWDOWN:-}" ]; then
  f=$DLOCO_TEST_SLOWDOWN
  slow=(--set "run.slowdown=\"0:$f,1:$f,2:$f\"")
fi
submit groups 2 "$dir/groups.toml" --set train.grad_accum=2 --set run.trusted_network=true "${slow[@]}"
/usr/bin/python3 - "$dir/runs/groups" "$dir/data/meta.json" <<'PY' || fail "the decoupled job's report"
import json, sys
run, meta = sys.argv[1], json.load(open(sys.argv[2]))
events = lambda name: [json.loads(line) for line in open(f"{run}/events/{name}.jsonl")]
report = json.load(open(f"{run}/report.json"))
assert report["status"] == "finished", report["status"]
steps = {l["id"]: l["steps"] for l in report["learners"]}
assert sorted(steps) == [0, 1, 2] and all(s > 0 for s in steps.values()), steps
assert report["final_val_loss"] < meta["unigram_val_nats_per_token"], report["final_val_loss"]
# where each rank ran: the leaders as the syncer saw them join, the other ranks by their own word
hosts = {(e["learner"], 0): e["host"] for e in events("syncer") if e["event"] == "learner_joined"}
for learner, rank in [(1, 1), (2, 1), (2, 2)]:
    joined = [e for e in events(f"learner_{learner}_rank_{rank}") if e["event"] == "rank_joined"]
    hosts[(learner, rank)] = joined[0]["host"]
expected = {(0, 0): "dlocon1", (1, 0): "dlocon1", (1, 1): "dlocon2",
            (2, 0): "dlocon2", (2, 1): "dlocon3", (2, 2): "dlocon3"}
assert hosts == expected, hosts
groups = {l: [e["group"] for e in events(f"learner_{l}") if e["event"] == "group_formed"] for l in (1, 2)}
assert groups[1] == ["tensor-parallel t = 2"], groups
assert len(groups[2]) == 1 and groups[2][0].startswith("SkipPipe pipeline of 3 nodes in 2 stages"), groups
# every learner ends holding Θ: its final copy's fragment versions and hashes are the syncer's
final = [e for e in events("syncer") if e["event"] == "final_state"][-1]
for l in range(3):
    stopped = [e for e in events(f"learner_{l}") if e["event"] == "stopped"][-1]
    assert (stopped["versions"], stopped["hashes"]) == (final["versions"], final["hashes"]), (l, stopped, final)
print(f"decoupled over 3 nodes (a TP2 group and a SkipPipe pipeline spanning nodes): val loss "
      f"{report['final_val_loss']:.4f}, learner steps {steps}, ranks on {hosts}")
PY

# 2. a dp baseline: one worker per node; without run.trusted_network the workers refuse to meet off loopback
in_node 1 sbatch --wait --nodes=3 --ntasks-per-node=1 --cpus-per-task=1 --time=10 --chdir="$dir" \
  --output="$dir/untrusted.out" --export="ALL,DLOCO=$BUILD/bin/dloco,DLOCO_RUN_NAME=untrusted" \
  "$SRC/scripts/slurm/dloco.sbatch" "$dir/tiny.toml" --set 'diloco.mode="dp"' > "$dir/sbatch-untrusted.log" 2>&1 \
  && fail "a dp job off loopback without run.trusted_network was not refused"
grep -q "run.trusted_network = true" "$dir/untrusted.out" || fail "the refusal does not name run.trusted_network"
submit dp 1 "$dir/tiny.toml" --set 'diloco.mode="dp"' --set run.trusted_network=true
/usr/bin/python3 - "$dir/runs/dp" "$dir/data/meta.json" <<'PY' || fail "the dp job's report"
import json, sys
run, meta = sys.argv[1], json.load(open(sys.argv[2]))
report = json.load(open(f"{run}/report.json"))
assert report["status"] == "finished", report["status"]
assert report["written_by"] == "worker 0", report.get("written_by")
assert report["final_val_loss"] < meta["unigram_val_nats_per_token"], report["final_val_loss"]
workers = report["workers"]
assert [w["rank"] for w in workers] == [0, 1, 2] and all(w["steps"] > 0 for w in workers), workers
hosts = {}
for r in range(3):
    for line in open(f"{run}/events/worker_{r}.jsonl"):
        e = json.loads(line)
        if e["event"] == "joined":
            hosts[r] = e["host"]
assert sorted(hosts.values()) == ["dlocon1", "dlocon2", "dlocon3"], hosts
print(f"dp over 3 nodes: val loss {report['final_val_loss']:.4f}, {report['steps']} steps, workers on {hosts}")
PY
echo "PASSED"
