#!/usr/bin/env bash
# Learner overhead (issue: target >= 0.97): tokens/s of the learners of a 2-learner decoupled run (syncer,
# evaluator and network included) against two bare local training loops of the same model run side by side,
# each with the same single thread the launcher gives a learner on 2 cores. Repeats alternate bare/decoupled;
# the ratio of medians is printed. Rates come from the event timestamps after a warm-up, so start-up, the
# final evaluation and the report are not counted in either.
# Usage (from the repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   bench/learner_overhead.sh [STEPS=80] [REPEATS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
DLOCO=${DLOCO:-build/bin/dloco}
DATA=${DATA:-data/kjv}
STEPS=${STEPS:-80}
REPEATS=${REPEATS:-3}
B=8
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
per_learner=$((STEPS * B * 128))
common=(--config configs/demo.toml --set "data.dir=\"$DATA\"" --set train.batch_size=$B --set train.eval_interval=0
        --set train.checkpoint_interval=0 --set "run.out_dir=\"$out\"" --set train.log_interval=5)

bare() {
  for i in 0 1; do
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$DLOCO" train "${common[@]}" --set diloco.mode=local --set run.threads=1 \
      --set run.name=bare${1}_$i --set train.total_tokens=$per_learner > "$out/bare${1}_$i.log" 2>&1 &
  done
  wait
}
decoupled() {
  "$DLOCO" train "${common[@]}" --set diloco.mode=decoupled --set diloco.learners=2 --set run.threads=2 \
    --set run.name=dec$1 --set train.total_tokens=$((2 * per_learner)) --set diloco.quorum=2 \
    --set diloco.grace_window=false > "$out/dec$1.log" 2>&1
}
for r in $(seq 1 "$REPEATS"); do
  bare "$r"
  decoupled "$r"
done

python3 - "$out" "$REPEATS" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
def rate(path, event, warmup=10):
    ev = [json.loads(l) for l in open(path)]
    pts = [(e["t"], e["tokens"]) for e in ev if e["event"] == event]
    pts = pts[warmup // (5 if event == "progress" else 1):]
    (t0, k0), (t1, k1) = pts[0], pts[-1]
    return (k1 - k0) / (t1 - t0)
bare, dec = [], []
for r in range(1, repeats + 1):
    bare += [rate(f"{out}/bare{r}_{i}/events.jsonl", "progress") for i in (0, 1)]
    dec += [rate(f"{out}/dec{r}/events/learner_{i}.jsonl", "step") for i in (0, 1)]
mb, md = statistics.median(bare), statistics.median(dec)
print(f"bare loops:        {', '.join(f'{x:.0f}' for x in bare)} tokens/s per process (median {mb:.0f})")
print(f"decoupled learners: {', '.join(f'{x:.0f}' for x in dec)} tokens/s per learner (median {md:.0f})")
print(f"learner overhead ratio (decoupled / bare, medians of {repeats} alternating repeats): {md / mb:.3f} (target >= 0.97)")
PY
