#!/usr/bin/env bash
# SkipPipe convergence and inference with stages down (issue 13, docs/skippipe.md "Training with skips"):
# trains configs/skippipe-train.toml (6 stages of one block, skip 33%: every micro-batch runs stage 0 + 3 of the
# other 5) and the same config with skippipe.skip = 0 (every micro-batch the full depth) at equal tokens on the KJV
# corpus, then evaluates both final models on the whole validation split at full depth and with stage 0 plus a
# random sorted subset of the other stages per batch: 33% and 50% of the six stages missing (round(6·0.66) = 4 and
# 3 of 6 kept), each with both perplexity definitions. Prints the table and the ratios measured in this one run.
# Usage (from the repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   bench/skippipe/convergence.sh [OUT=runs/bench-skippipe]    # REUSE=1 evaluates runs already trained in OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
DLOCO=${DLOCO:-build/bin/dloco}
OUT=${OUT:-runs/bench-skippipe}
SEED=${SEED:-1}
mkdir -p "$OUT"
train() {  # name, extra --set flags
  local name=$1; shift
  if [[ "${REUSE:-0}" == 1 && -f "$OUT/$name/report.json" ]]; then return; fi
  echo "training $name (log: $OUT/$name.log)" >&2
  rm -rf "${OUT:?}/$name"
  "$DLOCO" train --config configs/skippipe-train.toml --set "run.out_dir=\"$OUT\"" --set run.name=$name "$@" \
    > "$OUT/$name.log" 2>&1
}
train skip33
train noskip --set skippipe.skip=0

eval_json() {  # run, extra flags -> "loss ppl ppl_per_sequence"
  "$DLOCO" eval "$OUT/$1" --stage-count 6 "${@:2}" --seed "$SEED" 2>"$OUT/eval.err" |
    /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["val_loss"], j["val_perplexity"], j["val_perplexity_per_sequence"])'
}
declare -A R
for run in skip33 noskip; do
  R[$run,full]=$(eval_json $run)
  R[$run,33]=$(eval_json $run --skip-random 0.34)
  R[$run,50]=$(eval_json $run --skip-random 0.5)
done
/usr/bin/python3 - "$OUT" <<PY
import json, sys
R = {}
for key, val in [$(for k in "${!R[@]}"; do printf '("%s", "%s"),' "$k" "${R[$k]}"; done)]:
    R[key] = [float(x) for x in val.split()]
out = sys.argv[1]
tokens = {r: json.load(open(f"{out}/{r}/report.json"))["tokens_trained"] for r in ("skip33", "noskip")}
print(f"tokens trained: skip33 {tokens['skip33']}, noskip {tokens['noskip']}")
print("| model | stages run | val loss | exp(mean loss) | mean exp(seq NLL) | vs its full depth (both) |")
print("|---|---|---|---|---|---|")
for run in ("skip33", "noskip"):
    f = R[run + ",full"]
    for cut, label in (("full", "6 of 6"), ("33", "4 of 6 (33% missing)"), ("50", "3 of 6 (50% missing)")):
        l, p, q = R[run + "," + cut]
        print(f"| {run} | {label} | {l:.4f} | {p:.2f} | {q:.2f} | {p / f[1] - 1:+.1%} / {q / f[2] - 1:+.1%} |")
s, n = R["skip33,full"][0], R["noskip,full"][0]
print(f"full-depth validation loss, skip33 / noskip: {s / n:.4f} (goal: within 3%)")
print(f"perplexity lost with half the stages missing: skip33 {R['skip33,50'][1] / R['skip33,full'][1] - 1:+.1%}, "
      f"noskip {R['noskip,50'][1] / R['noskip,full'][1] - 1:+.1%} (goal: skip33 ≤ +7% and below noskip)")
PY
