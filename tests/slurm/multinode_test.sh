#!/usr/bin/env bash
# Slurm on several nodes (issue 31): a real Slurm cluster of 3 nodes on this one machine — slurmctld plus one slurmd
# per network namespace, each namespace a node with its own address on a bridge (NodeAddr), its own hostname (a UTS
# namespace) and a hosts file naming every node (bind-mounted over /etc/hosts in a private mount namespace; `ip netns
# exec` would remount /sys and hide the cgroups slurmd needs) — runs scripts/slurm/dloco.sbatch across the nodes to the report:
#   1. a decoupled job, one learner per node: the syncer on the first node, every learner dialing it by name;
#   2. a dp baseline, one worker per node, meeting over rank 0's TCP rendezvous: refused without
#      run.trusted_network (naming it), then run with it to rank 0's report.
# Checks each report and that the learners or workers really ran on 3 different nodes (their hostnames).
# Usage: tests/slurm/multinode_test.sh BUILD_DIR (ctest passes it). Exit 77 (skipped) when not root.
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
  nsenter --net="/run/netns/$p$i" unshare --mount sh -c 'mount --bind "$0" /etc/hosts && exec "$@"' "$dir/hosts" "$@"
}
in_node_named() {
  local i=$1; shift
  nsenter --net="/run/netns/$p$i" unshare --mount --uts sh -c \
    'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' "$dir/hosts" "dlocon$i" "$@"
}

# three hosts on one bridge: namespace <p>i is node dlocon<i> at $net.<i>
ip netns add "${p}w" || fail "cannot add a network namespace"
ip -n "${p}w" link add br0 type bridge && ip -n "${p}w" link set br0 up || fail "cannot make the bridge"
for i in 1 2 3; do
  ip netns add "$p$i"
  ip link add "$p${i}a" type veth peer name "$p${i}b"
  ip link set "$p${i}a" netns "$p$i"
  ip link set "$p${i}b" netns "${p}w"
  ip -n "${p}w" link set "$p${i}b" master br0 up
  ip -n "$p$i" addr add "$net.$i/24" dev "$p${i}a"
  ip -n "$p$i" link set "$p${i}a" up
  ip -n "$p$i" link set lo up
done
{ echo "127.0.0.1 localhost"; for j in 1 2 3; do echo "$net.$j dlocon$j"; done; } > "$dir/hosts"

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

submit() {  # name, then sbatch.sh's arguments after the config
  local name=$1; shift
  in_node 1 sbatch --wait --nodes=3 --ntasks-per-node=1 --cpus-per-task=1 --time=10 --chdir="$dir" \
    --output="$dir/$name.out" \
    --export="ALL,DLOCO=$BUILD/bin/dloco,DLOCO_RUN_NAME=$name,DLOCO_MAKE_CERTS=$SRC/scripts/make-certs.sh,DLOCO_TLS_DIR=$dir/tls-$name" \
    "$SRC/scripts/slurm/dloco.sbatch" "$dir/tiny.toml" "$@" > "$dir/sbatch-$name.log" 2>&1 || fail "sbatch --wait ($name)"
}

# 1. decoupled: the syncer on dlocon1, one learner per node
submit decoupled
/usr/bin/python3 - "$dir/runs/decoupled" "$dir/data/meta.json" <<'PY' || fail "the decoupled job's report"
import json, sys
run, meta = sys.argv[1], json.load(open(sys.argv[2]))
report = json.load(open(f"{run}/report.json"))
assert report["status"] == "finished", report["status"]
steps = {l["id"]: l["steps"] for l in report["learners"]}
assert sorted(steps) == [0, 1, 2] and all(s > 0 for s in steps.values()), steps
assert report["final_val_loss"] < meta["unigram_val_nats_per_token"], report["final_val_loss"]
hosts = {}  # the hostname each learner joined the syncer from: one per node
for line in open(f"{run}/events/syncer.jsonl"):
    e = json.loads(line)
    if e["event"] == "learner_joined":
        hosts[e["learner"]] = e["host"]
assert sorted(hosts.values()) == ["dlocon1", "dlocon2", "dlocon3"], hosts
print(f"decoupled over 3 nodes: val loss {report['final_val_loss']:.4f}, learner steps {steps}")
PY

# 2. a dp baseline: one worker per node; without run.trusted_network the workers refuse to meet off loopback
in_node 1 sbatch --wait --nodes=3 --ntasks-per-node=1 --cpus-per-task=1 --time=10 --chdir="$dir" \
  --output="$dir/untrusted.out" --export="ALL,DLOCO=$BUILD/bin/dloco,DLOCO_RUN_NAME=untrusted" \
  "$SRC/scripts/slurm/dloco.sbatch" "$dir/tiny.toml" --set 'diloco.mode="dp"' > "$dir/sbatch-untrusted.log" 2>&1 \
  && fail "a dp job off loopback without run.trusted_network was not refused"
grep -q "run.trusted_network = true" "$dir/untrusted.out" || fail "the refusal does not name run.trusted_network"
submit dp --set 'diloco.mode="dp"' --set run.trusted_network=true
/usr/bin/python3 - "$dir/runs/dp" "$dir/data/meta.json" <<'PY' || fail "the dp job's report"
import json, sys
run, meta = sys.argv[1], json.load(open(sys.argv[2]))
report = json.load(open(f"{run}/report.json"))
assert report["status"] == "finished", report["status"]
assert report["written_by"] == "worker 0", report.get("written_by")
assert report["final_val_loss"] < meta["unigram_val_nats_per_token"], report["final_val_loss"]
assert [w["rank"] for w in report["workers"]] == [0, 1, 2] and all(w["steps"] > 0 for w in report["workers"]), report["workers"]
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
