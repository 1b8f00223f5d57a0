#!/usr/bin/env bash
# Heterogeneous learners on real processes (issue 32 item 4; "Decoupled DiLoCo" §10 in
# ../shared/spec/decoupled-diloco.md: half the learners ~18% slower with per-step variance, K = 8 → 84% goodput,
# K = 1 → 100% but worse quality, K = 1 + grace window → 100% with the quality back).
# M = 8 learners of the horizon study's model (d_model 64, 4 layers, 0.48M parameters), B = 8 × 128 tokens, one BLAS
# thread each, configs/demo.toml's H = 12, P = 12, τ = 2, a shared budget (fast learners may train more of it).
# Every learner emulates a chip: its step takes F × (1 + ε) times its own compute, ε ~ N(0, SD²) per step
# (run.slowdown "*:F~SD"), learners 4–7 are 1.18× slower still ("i:1.18F~SD"). F leaves the machine's cores
# mostly idle, so the learners' speeds are the emulated ones, not CPU contention (8 learners at F = 6 want 1.3 cores).
# Variants: decoupled K = 8, K = 1, K = 1 + grace window (each through `dloco chaos` with a plan without faults, for
# its kept-work goodput and checks), and DiLoCo (synchronous, every worker waits for the slowest each H steps).
# Per variant: final validation loss, wall seconds, tokens/s, busy (the share of the learners' time spent in their
# steps, emulated chip time included, not waiting), kept-work goodput (docs/guide-chaos.md: a step counts when a merge
# kept it; ceiling 1 − τ/H = 0.833 here), merges, mean learners per merge, steps of the fast and slow halves.
# Usage (repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [STEPS=400] [F=6] [SD=0.1] [SEED=1] [VARIANTS="k8 k1 k1-grace diloco"] bench/hetero.sh
#   STEPS: steps per learner at equal speed (budget M × STEPS × B × T tokens). Writes runs/hetero-<date>/ (OUT=DIR:
#   there): every run's folder, results.json and table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-400}
F=${F:-6}
SD=${SD:-0.1}
SEED=${SEED:-1}
VARIANTS=${VARIANTS:-k8 k1 k1-grace diloco}
M=8 B=8 T=128
bad() { echo "bench/hetero.sh: $*" >&2; exit 2; }
[[ $STEPS =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 24 ] || bad "STEPS must be a whole number ≥ 24"
[[ $SEED =~ ^[0-9]+$ ]] || bad "SEED must be a whole number"
/usr/bin/python3 -c "import sys; f, sd = float('$F'), float('$SD'); sys.exit(0 if f >= 1 and 0 <= sd < 1 else 1)" \
  2> /dev/null || bad "F must be ≥ 1 and SD in [0, 1)"
for v in $VARIANTS; do [[ $v =~ ^(k8|k1|k1-grace|diloco)$ ]] || bad "unknown variant '$v' (k8 k1 k1-grace diloco)"; done
DLOCO=${DLOCO:-$PWD/build/bin/dloco}
[ -x "$DLOCO" ] || bad "no $DLOCO: run scripts/build.sh"
[ -f data/kjv/meta.json ] || [ -n "$(ls data/kjv/train_*.bin 2> /dev/null)" ] ||
  bad "no data/kjv: run \`build/bin/dloco data prepare --kjv --out data/kjv\`"
out=${OUT:-$PWD/runs/hetero-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
slow=$(/usr/bin/python3 -c "print(round(1.18 * $F, 4))")
slowdown="*:$F~$SD,4:$slow~$SD,5:$slow~$SD,6:$slow~$SD,7:$slow~$SD"
common=(--set model.d_model=64 --set model.n_layer=4 --set model.n_head=4 --set train.batch_size=$B
        --set train.total_tokens=$((M * STEPS * B * T)) --set train.eval_interval=0 --set train.checkpoint_interval=0
        --set train.log_interval=1000 --set run.threads=$M --set run.report_interval_s=30 --set run.seed=$SEED
        --set diloco.learners=$M --set train.shared_budget=true --set "run.slowdown=\"$slowdown\""
        --set run.out_dir="\"$out\"")
source bench/demo_before_48.sh
common+=("${demo_before_48[@]}")
printf '[plan]\nname = "no faults"\n' > "$out/no-faults.toml"
echo "bench/hetero.sh: M = $M, run.slowdown = \"$slowdown\", $STEPS steps a learner at equal speed -> $out"
for v in $VARIANTS; do
  case $v in
    k8) sets=(--set diloco.quorum=8 --set diloco.grace_window=false) ;;
    k1) sets=(--set diloco.quorum=1 --set diloco.grace_window=false) ;;
    k1-grace) sets=(--set diloco.quorum=1 --set diloco.grace_window=true) ;;
    diloco) sets=(--set 'diloco.mode="diloco"') ;;
  esac
  echo "== $v"
  if [ "$v" = diloco ]; then  # a baseline: no syncer, so no chaos analysis; its workers' waits are in their events
    "$DLOCO" train --config configs/demo.toml "${common[@]}" "${sets[@]}" --set "run.name=\"$v\"" \
      > "$out/$v.log" 2>&1 || { tail -20 "$out/$v.log"; exit 1; }
  else
    "$DLOCO" chaos --config configs/demo.toml --plan "$out/no-faults.toml" --no-reference --name "$v" \
      "${common[@]}" "${sets[@]}" > "$out/$v.log" 2>&1 || { tail -20 "$out/$v.log"; exit 1; }
  fi
done
/usr/bin/python3 bench/hetero_table.py "$out" $VARIANTS | tee "$out/table.md"
