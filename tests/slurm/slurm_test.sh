#!/usr/bin/env bash
# Slurm (issue 15): a one-node Slurm cluster (Debian's slurm-wlm + munge, started here as root in a temporary folder,
# on ports of its own) runs scripts/slurm/dloco.sbatch: a tiny decoupled job with 2 learners as 2 Slurm tasks, to
# the syncer's report. Checks the report (finished, both learners trained, the global model beat the unigram
# baseline of the corpus) and that each learner took its id from SLURM_PROCID.
# Usage: tests/slurm/slurm_test.sh BUILD_DIR (ctest passes it). Exit 77 (skipped) when not root.
set -euo pipefail
BUILD=$(cd "${1:?usage: slurm_test.sh BUILD_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "skipped: a Slurm cluster needs root"; exit 77; }
for tool in munged mungekey slurmctld slurmd sbatch sinfo scontrol; do
  command -v "$tool" > /dev/null || { echo "FAILED: $tool missing (scripts/setup.sh installs slurm-wlm and munge)"; exit 1; }
done
dir=$(mktemp -d /tmp/dloco_slurm.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2> /dev/null || true; done
  sleep 1
  [ -n "${DLOCO_KEEP_TEST_RUNS:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; for f in "$dir"/*.log "$dir"/job.out; do [ -f "$f" ] && { echo "== $f"; tail -n 30 "$f"; }; done; exit 1; }

source "$SRC/tests/slurm/common.sh"
start_munge
pids+=("$(cat "$dir/munged.pid")")

# slurm: one node (this host), 2 CPUs
host=$(hostname -s)
port=$(( 20000 + $$ % 20000 ))
mkdir -p "$dir/state" "$dir/spool"
{
  slurm_conf_common
  cat <<CONF
ClusterName=dloco-test
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/slurmd.log
NodeName=$host CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
} > "$dir/slurm.conf"
export SLURM_CONF="$dir/slurm.conf"
slurmctld -i || fail "slurmctld did not start"
for _ in $(seq 50); do [ -s "$dir/slurmctld.pid" ] && break; sleep 0.2; done
pids+=("$(cat "$dir/slurmctld.pid")")
slurmd || fail "slurmd did not start"
for _ in $(seq 50); do [ -s "$dir/slurmd.pid" ] && break; sleep 0.2; done
pids+=("$(cat "$dir/slurmd.pid")")
for _ in $(seq 150); do
  state=$(sinfo -h -o %T 2> /dev/null | head -n 1)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || fail "the node never became idle (state '$state')"

# a tiny corpus and a tiny decoupled run with M = 2 (150 steps each; ends at 0.3146 every time here)
write_tiny_job 2 150

# 2 learners as 2 Slurm tasks; the batch script runs the syncer and the evaluator beside them
sbatch --wait --ntasks=2 --cpus-per-task=1 --time=10 --chdir="$dir" --output="$dir/job.out" \
  --export="ALL,DLOCO=$BUILD/bin/dloco,DLOCO_RUN_NAME=job,DLOCO_SYNCER_PORT=$((port + 2)),DLOCO_MAKE_CERTS=$SRC/scripts/make-certs.sh,DLOCO_TLS_DIR=$dir/tls" \
  "$SRC/scripts/slurm/dloco.sbatch" "$dir/tiny.toml" > "$dir/sbatch.log" 2>&1 || fail "sbatch --wait failed"

report="$dir/runs/job/report.json"
[ -f "$report" ] || fail "no report at $report"
/usr/bin/python3 - "$report" "$dir/data/meta.json" "$dir/runs/job/events" <<'PY' || fail "the report"
import json, sys
report, meta = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert report["status"] == "finished", report["status"]
assert report["written_by"] == "syncer", report
steps = {l["id"]: l["steps"] for l in report["learners"]}
assert sorted(steps) == [0, 1] and all(s > 0 for s in steps.values()), steps
unigram = meta["unigram_val_nats_per_token"]
assert report["final_val_loss"] < unigram, (report["final_val_loss"], unigram)
for i in (0, 1):  # each learner's id came from its SLURM_PROCID (no --id on the srun line)
    events = [json.loads(l) for l in open(f"{sys.argv[3]}/learner_{i}.jsonl")]
    assert any(e["event"] == "bootstrapped" for e in events), i
print(f"slurm job finished: val loss {report['final_val_loss']:.4f} < unigram {unigram:.4f}, learner steps {steps}")
PY
grep -q "\[slurm\] job" "$dir/job.out" || fail "the batch script's first line is missing"
# the syncer listened on every interface, so the job made its certificates (a plain-text syncer would have refused)
[ -f "$dir/tls/nodes.pem" ] || fail "the job made no TLS certificates"
echo "PASSED"
