#!/usr/bin/env bash
# Learner overhead (issue: target >= 0.97): tokens/s of the learners of a 2-learner decoupled run (syncer,
# evaluator and network included) against two bare local training loops of the same model run side by side,
# each with the same single thread the launcher gives a learner on 2 cores. Repeats alternate bare/decoupled;
# the ratio of medians is printed. Rates come from the event timestamps after a warm-up, so start-up, the
# final evaluation and the report are not counted in either.
# WIRE=q4 (or bf16, q8) adds, in each repeat, a decoupled run with that codec both ways and error feedback and
# prints its ratio too (issue 14: target >= 0.98).
# Usage (from the repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [STEPS=80] [REPEATS=3] [WIRE=fp32|bf16|q8|q4] bench/learner_overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DLOCO=${DLOCO:-build/bin/dloco}
DATA=${DATA:-data/kjv}
STEPS=${STEPS:-80}
REPEATS=${REPEATS:-3}
WIRE=${WIRE:-fp32}
B=8
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
per_learner=$((STEPS * B * 128))
common=(--config configs/demo.toml --set "data.dir=\"$DATA\"" --set train.batch_size=$B --set train.eval_interval=0
        --set train.checkpoint_interval=0 --set "run.out_dir=\"$out\"" --set train.log_interval=5)
source bench/demo_before_48.sh
common+=("${demo_before_48[@]}")

bare() {
  for i in 0 1; do
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$DLOCO" train "${common[@]}" --set diloco.mode=local --set run.threads=1 \
      --set run.name=bare${1}_$i --set train.total_tokens=$per_learner > "$out/bare${1}_$i.log" 2>&1 &
  done
  wait
}
decoupled() {  # repeat, codec
  "$DLOCO" train "${common[@]}" --set diloco.mode=decoupled --set diloco.learners=2 --set run.threads=2 \
    --set run.name=dec$1_$2 --set train.total_tokens=$((2 * per_learner)) --set diloco.quorum=2 \
    --set diloco.grace_window=false --set diloco.wire_up=$2 --set diloco.wire_down=$2 \
    --set diloco.error_feedback=$([ "$2" = fp32 ] && echo false || echo true) > "$out/dec$1_$2.log" 2>&1
}
for r in $(seq 1 "$REPEATS"); do
  bare "$r"
  decoupled "$r" fp32
  [ "$WIRE" = fp32 ] || decoupled "$r" "$WIRE"
done

python3 - "$out" "$REPEATS" "$WIRE" <<'PY'
import json, statistics, sys
out, repeats, wire = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def rate(path, event, warmup=10):
    ev = [json.loads(l) for l in open(path)]
    pts = [(e["t"], e["tokens"]) for e in ev if e["event"] == event]
    pts = pts[warmup // (5 if event == "progress" else 1):]
    (t0, k0), (t1, k1) = pts[0], pts[-1]
    return (k1 - k0) / (t1 - t0)
bare = [rate(f"{out}/bare{r}_{i}/events.jsonl", "progress") for r in range(1, repeats + 1) for i in (0, 1)]
mb = statistics.median(bare)
print(f"bare loops:        {', '.join(f'{x:.0f}' for x in bare)} tokens/s per process (median {mb:.0f})")
for codec in ["fp32"] + ([wire] if wire != "fp32" else []):
    dec = [rate(f"{out}/dec{r}_{codec}/events/learner_{i}.jsonl", "step") for r in range(1, repeats + 1) for i in (0, 1)]
    md = statistics.median(dec)
    print(f"decoupled learners, {codec} both ways: {', '.join(f'{x:.0f}' for x in dec)} tokens/s per learner (median {md:.0f})")
    print(f"learner overhead ratio, {codec} (decoupled / bare, medians of {repeats} alternating repeats): {md / mb:.3f} "
          f"(target >= {0.97 if codec == 'fp32' else 0.98})")
PY
