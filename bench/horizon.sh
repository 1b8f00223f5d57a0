#!/usr/bin/env bash
# Quality at the scaling-law horizon (issue 33): "Scaling Laws for DiLoCo" (arXiv 2503.09799, Table 4) trains to
# the Chinchilla budget D = 20 N with H = 30, AdamW β = (0.9, 0.99), cosine to 5%, outer Nesterov μ = 0.9 and η
# swept; at 35M parameters DiLoCo M = 1, 2, 4, 8 end −0.1%, +0.7%, +2.0%, +3.9% against data parallelism. This runs
# the same recipe transposed to this machine, for dp, diloco M = 1, 2, 4, 8, streaming M = 4 and decoupled M = 4,
# at 1/10, 1/4 and all of D = 20 N, two seeds for dp and decoupled M = 4 at the full budget; and decoupled M = 4
# with the sparse codec (topk both ways, error feedback β = 0.95) for the bytes–loss frontier at the same horizon.
#   model   d_model 64, 4 layers, 4 heads, context 128, the KJV's 4096-token vocabulary, tied: N = the parameter
#           count dloco prints (~0.48M); D = 20 N tokens (~10 passes over the KJV's 0.99M training tokens)
#   batch   a global batch of 32 sequences (4096 tokens) for every mode: M learners of 32/M each; dp 4 workers of 8
#   outer   H = 30, P = 10 fragments (streaming, decoupled: τ = 2; decoupled: K = M, no grace window)
#   inner   warmup 5% of the steps, cosine to 5% of lr, AdamW β2 = 0.99
# The inner lr (dp's best of LR_GRID at 1/10 of the budget, extended by one run past a grid edge) and η (diloco
# M = 4's best of ETA_GRID at 1/4 of the budget, μ = 0.9) are swept on shorter runs and carried to every run.
# Every run uses one frozen copy of the binary (runs/<NAME>/bin/dloco, with the commit it was built from in
# runs/<NAME>/bin/COMMIT), so rebuilding while it runs changes nothing; run it under `nice` beside other work.
# Outer momentum (docs/measurements.md "Quality at the scaling-law horizon": μ = 0.9 cost 0.17–0.41 nats/token at
# 8–77 outer steps): stage "outer" sweeps (η, μ) over ETA_GRID × MU_GRID for decoupled M = 4 at 1/10 of the budget;
# stage "outer1" runs diloco and decoupled M = 4 at the full budget with MU and ETA (default: that sweep's best).
# Data order (the same section): ORDER=shuffled trains every run with data.order = "shuffled" (each stream samples
# the whole text; src/data/stream.h) instead of contiguous; stages "pick10", "pick4" and "pick1" run only the variants
# named in PICK (default "dp diloco-m4 decoupled-m4") at 1/10, 1/4 or all of the budget, with the seed list SEEDS
# (default 1; e.g. SEEDS=2 or 1,2: runs/<NAME>-<stage>-<PICK>-seeds2).
# Usage (repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [NAME=horizon] [STAGES="sweep 10 4 1 seed2"] [LR_GRID="3e-3 6e-3 1.2e-2"] [ETA_GRID="0.4 0.7 1.0"]
#   [MU_GRID="0 0.5 0.7"] [LR=…] [ETA=…] [MU=0.9] [ORDER=contiguous|shuffled] [PICK="…"] [SEEDS=1]
#   nice -n 10 bench/horizon.sh
# Results: runs/<NAME>-<stage>/compare.md and compare.json; bench/horizon_table.py prints the table of
# docs/measurements.md from them.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${NAME:-horizon}
STAGES=${STAGES:-sweep 10 4 1 seed2}
LR_GRID=${LR_GRID:-3e-3 6e-3 1.2e-2}
ETA_GRID=${ETA_GRID:-0.2 0.4 0.7 1.0}
PY=/usr/bin/python3
bin=runs/$NAME/bin
if [ ! -x "$bin/dloco" ]; then
  mkdir -p "$bin"
  cp build/bin/dloco build/bin/dloco-data "$bin/"
  { git rev-parse HEAD; git status --porcelain | grep -v '^??' | sed 's/^/dirty: /' || true; } > "$bin/COMMIT"
fi
DLOCO=$bin/dloco
# N: the model's parameter count, as dloco counts it (the local run's first line).
model=(--set model.d_model=64 --set model.n_layer=4 --set model.n_head=4)
count_dir=$(mktemp -d)
N=$("$DLOCO" train --config configs/demo.toml "${model[@]}" --set diloco.mode=local --set run.name=count \
      --set run.out_dir="$count_dir" --stop-after-steps 1 2>&1 | sed -n 's/.*: \([0-9]*\) parameters.*/\1/p' | head -1 || true)
rm -rf "$count_dir"
[ -n "$N" ] || { echo "could not read the parameter count" >&2; exit 1; }
D=$((20 * N))
echo "[horizon] N = $N parameters, D = 20 N = $D tokens; binary $(head -1 "$bin/COMMIT")"

common() {  # budget_tokens lr eta
  local tokens=$1 steps=$(( $1 / 4096 ))
  local warmup=$(( steps / 20 > 1 ? steps / 20 : 1 ))
  echo "${model[@]}" --set train.total_tokens="$tokens" --set train.lr="$2" --set train.warmup_steps="$warmup" \
       --set train.min_lr_ratio=0.05 --set train.beta2=0.99 --set train.eval_interval=$(( steps / 5 + 1 )) \
       --set diloco.inner_steps=30 --set diloco.fragments=10 --set diloco.overlap=2 --set diloco.outer_lr="$3" \
       --set diloco.outer_momentum="${MU:-0.9}" --set diloco.grace_window=false --set data.order="${ORDER:-contiguous}"
}
variant() {  # name mode M
  local batch=$((32 / $3)) quorum=$3
  [ "$2" = dp ] && batch=8
  echo "--variant=$1:diloco.mode=$2;diloco.learners=$3;diloco.quorum=$quorum;train.batch_size=$batch"
}
all_variants() {
  variant dp dp 4
  for M in 1 2 4 8; do variant "diloco-m$M" diloco "$M"; done
  variant streaming-m4 streaming 4
  variant decoupled-m4 decoupled 4
  # the sparse codec at the same horizon: topk both ways, error feedback at SparseLoCo's β = 0.95
  echo "$(variant decoupled-m4-topk decoupled 4);diloco.wire_up=topk;diloco.wire_down=topk;diloco.error_feedback=true;diloco.error_feedback_decay=0.95"
}
# Variants only stages pick10/pick4/pick1 run (PICK): the sparse codec at other densities (diloco.topk_density: one value of
# 16 or 8 kept per chunk, 6.25% or 12.5%, against 1/64) for the bytes–loss frontier.
extra_variants() {
  for D in 16 8; do
    echo "$(variant "decoupled-m4-topk$D" decoupled 4);diloco.wire_up=topk;diloco.wire_down=topk;diloco.error_feedback=true;diloco.error_feedback_decay=0.95;diloco.topk_density=$D"
  done
  # q4 both ways with error feedback at H = 90 (a third of the merges): the frontier's other way to ~1000x
  echo "$(variant decoupled-m4-q4-h90 decoupled 4);diloco.wire_up=q4;diloco.wire_down=q4;diloco.error_feedback=true;diloco.inner_steps=90"
}
compare() {  # stage seeds tokens lr eta variants…
  local stage=$1 seeds=$2 tokens=$3 lr=$4 eta=$5
  shift 5
  [ -f "runs/$NAME-$stage/compare.json" ] && { echo "[horizon] $stage: done before (runs/$NAME-$stage)"; return; }
  # shellcheck disable=SC2046
  "$DLOCO" compare --config configs/demo.toml $(common "$tokens" "$lr" "$eta") --seeds "$seeds" \
    --name "$NAME-$stage" "$@"
}
best() {  # "stage…" variant-prefix key [edge]: the key's value of the variant with the lowest final loss over the
          # stages' compare.json; with "edge", the value one factor of 2 past the grid's edge if the best is at one
  "$PY" - "$2" "$3" "${4:-}" $(for s in $1; do echo "runs/$NAME-$s/compare.json"; done) <<'PY'
import json, os, sys
prefix, key, edge, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
section, field = key.split(".")
runs = [r for f in files if os.path.exists(f) for r in json.load(open(f))["runs"]
        if r["variant"].startswith(prefix) and r["report"]]
values = sorted({r["config"][section][field] for r in runs})
best = min(runs, key=lambda r: r["report"]["final_val_loss"])["config"][section][field]
if edge:
    print(best / 2 if best == values[0] else best * 2 if best == values[-1] else "")
else:
    print(best)
PY
}
for stage in $STAGES; do
  case $stage in
    sweep)
      lrs=() etas=()
      for lr in $LR_GRID; do lrs+=("--variant=dp-lr$lr:diloco.mode=dp;diloco.learners=4;train.batch_size=8;train.lr=$lr"); done
      compare sweep-lr 1 $((D / 10)) 6e-3 0.7 "${lrs[@]}"
      past=$(best sweep-lr dp-lr train.lr edge)  # a best rate at the grid's edge is not a best rate: one more run
      if [ -n "$past" ]; then
        compare sweep-lr-edge 1 $((D / 10)) 6e-3 0.7 "--variant=dp-lr$past:diloco.mode=dp;diloco.learners=4;train.batch_size=8;train.lr=$past"
      fi
      LR=${LR:-$(best "sweep-lr sweep-lr-edge" dp-lr train.lr)}
      for eta in $ETA_GRID; do
        etas+=("--variant=diloco-m4-eta$eta:diloco.mode=diloco;diloco.learners=4;diloco.quorum=4;train.batch_size=8;diloco.outer_lr=$eta")
      done
      compare sweep-eta 1 $((D / 4)) "$LR" 0.7 "${etas[@]}"
      ;;
    10|4|1)
      LR=${LR:-$(best "sweep-lr sweep-lr-edge" dp-lr train.lr)}
      ETA=${ETA:-$(best sweep-eta diloco-m4-eta diloco.outer_lr)}
      # shellcheck disable=SC2046
      compare "budget-1of$stage" 1 $((D / stage)) "$LR" "$ETA" $(all_variants)
      ;;
    seed2)
      LR=${LR:-$(best "sweep-lr sweep-lr-edge" dp-lr train.lr)}
      ETA=${ETA:-$(best sweep-eta diloco-m4-eta diloco.outer_lr)}
      compare seed2 2 "$D" "$LR" "$ETA" "$(variant dp dp 4)" "$(variant decoupled-m4 decoupled 4)"
      ;;
    outer)
      LR=${LR:-$(best "sweep-lr sweep-lr-edge" dp-lr train.lr)}
      outers=()
      for eta in ${ETA_GRID}; do
        for mu in ${MU_GRID:-0 0.5 0.7}; do
          outers+=("$(variant "decoupled-m4-eta$eta-mu$mu" decoupled 4);diloco.outer_lr=$eta;diloco.outer_momentum=$mu")
        done
      done
      compare outer 1 $((D / 10)) "$LR" 0.7 "${outers[@]}"
      ;;
    outer1)
      LR=${LR:-$(best "sweep-lr sweep-lr-edge" dp-lr train.lr)}
      ETA=${ETA:-$(best outer decoupled-m4-eta diloco.outer_lr)}
      MU=${MU:-$(best outer decoupled-m4-eta diloco.outer_momentum)}
      compare "outer1-eta$ETA-mu$MU" 1 "$D" "$LR" "$ETA" "$(variant diloco-m4 diloco 4)" "$(variant decoupled-m4 decoupled 4)"
      ;;
    pick10|pick4|pick1)  # the variants named in PICK (of all_variants or extra_variants) at 1/10, 1/4 or all of the budget
      LR=${LR:-$(best "sweep-lr sweep-lr-edge" dp-lr train.lr)}
      ETA=${ETA:-$(best sweep-eta diloco-m4-eta diloco.outer_lr)}
      picked=()
      for v in ${PICK:-dp diloco-m4 decoupled-m4}; do
        line=$({ all_variants; extra_variants; } | grep -- "--variant=$v:") ||
          { echo "no variant '$v' in all_variants or extra_variants" >&2; exit 2; }
        picked+=("$line")
      done
      seeds=${SEEDS:-1}  # a folder per seed list: a finished folder is not run again
      [ "$seeds" = 1 ] && tag= || tag=-seeds${seeds//,/_}
      compare "$stage-$(echo "${PICK:-dp diloco-m4 decoupled-m4}" | tr ' ' '+')$tag" "$seeds" $((D / ${stage#pick})) \
        "$LR" "$ETA" "${picked[@]}"
      ;;
    *) echo "unknown stage '$stage' (sweep, 10, 4, 1, seed2, outer, outer1, pick10, pick4, pick1)" >&2; exit 2 ;;
  esac
  echo "[horizon] $stage done: LR=${LR:-?} ETA=${ETA:-?}"
done
