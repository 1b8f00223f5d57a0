#!/usr/bin/env bash
# Quality at equal tokens, measured fairly (issue 14 part 5): every mode (dp, diloco, streaming, decoupled) gets its
# own inner learning rate from a 3-value sweep (seed 1) — extended by one run past the edge when the best rate is
# the highest or lowest tried —, then runs again at its best rate with seed 2; the table gives each mode's best
# rate, its loss per seed and the gap to dp. Run at two model sizes to see whether the
# DiLoCo family's gap to data parallelism shrinks with size:
#   small   the demo's model (C 128, L 4: 0.85M block parameters, 1.38M in all)
#   medium  C 256, L 8 (6.43M block parameters: 7.5x the small model's; 7.48M in all)
# Everything else is configs/demo.toml (M = 4, 2.4M tokens, H = 12, P = 12), with the settings its tables were measured
# with pinned: η = 1, μ = 0, contiguous data (the demo moved to shuffled rows, η 0.7, μ 0.5). dp runs 4 workers on a
# 4x larger global batch and so 1/4 of the steps; at small size its grid is one factor of 2 higher than the others'.
# Usage (from the repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [SIZE=small|medium] [NAME=quality-$SIZE] [CONFIG=configs/demo.toml] [LR_DP="a b c"] [LR_DILOCO="a b c"]
#   [MODES="dp diloco streaming decoupled"] [LR_<MODE>_ONLY="a b"] [ALSO="compare.json …"] [CONFIRM=1]
#   [DLOCO=build/bin/dloco] bench/quality.sh
# ~3.5 min a run for small and ~11 for medium on 2 cores; 16–20 runs per size (12 sweep, up to 4 past an edge, 4 at
# seed 2; CONFIRM=0 skips the seed-2 runs). Results: runs/<NAME>-{sweep,extend,best}/compare.md and runs/<NAME>.md.
set -euo pipefail
CONFIG=${CONFIG:-configs/demo.toml}
cd "$(dirname "$0")/.."
DLOCO=${DLOCO:-build/bin/dloco}
SIZE=${SIZE:-small}
NAME=${NAME:-quality-$SIZE}
MODES=${MODES:-dp diloco streaming decoupled}
CONFIRM=${CONFIRM:-1}
ALSO=${ALSO:-}  # more compare.json files whose runs join the sweep (e.g. an earlier, partial sweep's)
case $SIZE in
  small)
    model=()
    LR_DP=${LR_DP:-3e-3 6e-3 1.2e-2}
    LR_DILOCO=${LR_DILOCO:-1.5e-3 3e-3 6e-3}
    ;;
  medium)
    model=(--set model.d_model=256 --set model.n_layer=8)
    LR_DP=${LR_DP:-1.5e-3 3e-3 6e-3}
    LR_DILOCO=${LR_DILOCO:-1.5e-3 3e-3 6e-3}
    ;;
  *) echo "unknown SIZE '$SIZE' (small, medium)" >&2; exit 2 ;;
esac
source bench/demo_before_48.sh
model+=("${demo_before_48[@]}")
PY=/usr/bin/python3  # Debian's Python; another python3 may come first on PATH

sweep=()
for mode in $MODES; do
  grid=$LR_DILOCO
  [ "$mode" = dp ] && grid=$LR_DP
  override="LR_$(echo "$mode" | tr a-z A-Z)_ONLY"  # LR_STREAMING_ONLY="6e-3": that mode's own grid
  [ -n "${!override:-}" ] && grid=${!override}
  for lr in $grid; do sweep+=("--variant=$mode-lr$lr:diloco.mode=$mode;train.lr=$lr"); done
done
if [ ! -f "runs/$NAME-sweep/compare.json" ]; then
  "$DLOCO" compare --config "$CONFIG" "${model[@]}" --seeds 1 --name "$NAME-sweep" "${sweep[@]}"
fi

# The best rate of each mode (lowest final validation loss at seed 1) over the sweep and its extension; with
# "edges" it prints instead, for each mode whose best rate is the highest (lowest) it tried, the rate 2x higher
# (lower) to try next.
pick() {  # pick best|edges
  "$PY" - "$1" "runs/$NAME-sweep/compare.json" "runs/$NAME-extend/compare.json" $ALSO <<'PY'
import json, os, sys
what, files = sys.argv[1], [f for f in sys.argv[2:] if os.path.exists(f)]
losses = {}
for f in files:
    for r in json.load(open(f))["runs"]:
        if r["report"]:
            losses.setdefault(r["config"]["diloco"]["mode"], {})[r["config"]["train"]["lr"]] = r["report"]["final_val_loss"]
out = []
for mode, by_lr in losses.items():
    lr = min(by_lr, key=by_lr.get)
    if what == "best":
        out.append(f"{mode}:{lr!r}")
    elif lr == max(by_lr):
        out.append(f"{mode}:{2 * lr!r}")
    elif lr == min(by_lr):
        out.append(f"{mode}:{lr / 2!r}")
print(" ".join(out))
PY
}
# A best rate at the edge of its grid is not a best rate: one more run beyond that edge.
if [ ! -f "runs/$NAME-extend/compare.json" ]; then
  extend=()
  for pair in $(pick edges); do extend+=("--variant=${pair%%:*}-lr${pair#*:}:diloco.mode=${pair%%:*};train.lr=${pair#*:}"); done
  if [ ${#extend[@]} -gt 0 ]; then
    "$DLOCO" compare --config "$CONFIG" "${model[@]}" --seeds 1 --name "$NAME-extend" "${extend[@]}"
  fi
fi
best=$(pick best)
echo "[quality] best inner learning rate per mode (seed 1): $best"
if [ "$CONFIRM" = 1 ] && [ ! -f "runs/$NAME-best/compare.json" ]; then
  confirm=()
  for pair in $best; do confirm+=("--variant=${pair%%:*}:diloco.mode=${pair%%:*};train.lr=${pair#*:}"); done
  "$DLOCO" compare --config "$CONFIG" "${model[@]}" --seeds 2 --name "$NAME-best" "${confirm[@]}"
fi

"$PY" - "runs/$NAME-sweep/compare.json" "runs/$NAME-best/compare.json" "$SIZE" "runs/$NAME-extend/compare.json" \
  $ALSO > "runs/$NAME.md" <<'PY'
import json, os, sys
sweep, confirm, size, extend = sys.argv[1:5]
rows = {}
for f in [sweep] + [x for x in [extend] + sys.argv[5:] if os.path.exists(x)]:
    for r in json.load(open(f))["runs"]:
        mode, lr = r["config"]["diloco"]["mode"], r["config"]["train"]["lr"]
        loss = r["report"]["final_val_loss"] if r["report"] else float("nan")
        rows.setdefault(mode, {})[lr] = loss
seed2 = {}
if os.path.exists(confirm):
    for r in json.load(open(confirm))["runs"]:
        if r["report"]:
            seed2[r["config"]["diloco"]["mode"]] = r["report"]["final_val_loss"]
model = json.load(open(sweep))["runs"][0]["config"]["model"]
print(f"# Quality at equal tokens, {size} model (d_model {model['d_model']}, n_layer {model['n_layer']})\n")
print("| mode | sweep: lr → val loss (seed 1) | best lr | seed 1 | seed 2 | mean | gap to dp |")
print("|---|---|---|---|---|---|---|")
means = {}
for mode, by_lr in rows.items():
    lr, s1 = min(by_lr.items(), key=lambda kv: kv[1])
    s2 = seed2.get(mode)
    means[mode] = (s1 + s2) / 2 if s2 is not None else s1
for mode, by_lr in rows.items():
    lr, s1 = min(by_lr.items(), key=lambda kv: kv[1])
    s2 = seed2.get(mode)
    sweep_text = ", ".join(f"{k:g} → {v:.4f}" for k, v in sorted(by_lr.items()))
    gap = f"{means[mode] - means['dp']:+.4f}" if "dp" in means else ""
    print(f"| {mode} | {sweep_text} | {lr:g} | {s1:.4f} | {'' if s2 is None else f'{s2:.4f}'} | {means[mode]:.4f} | {gap} |")
PY
cat "runs/$NAME.md"
