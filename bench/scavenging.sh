#!/usr/bin/env bash
# Scavenging: wall-clock to a fixed validation loss with extra, temporary learners (issue 32 item 3; the paper's
# relative wall-clock to the same loss with +25/50/100/300% extra compute: Decoupled 0.90/0.83/0.75/0.62, DP
# 1.07/1.09/1.02/0.80, ../shared/spec/decoupled-diloco.md).
# A decoupled run of M = 4 learners of the horizon study's model (d_model 64, 4 layers, 0.48M parameters), B = 8 ×
# 128 tokens, configs/demo.toml's H = 12, P = 12, τ = 2, K = 4 with the grace window (without it a merge takes the
# first 4 answers and drops the extras' as late), a shared budget of 4 × STEPS steps over 16 data streams; then the
# same with EXTRA = 1, 2, 4, 12 learners (ids 4 …) that join at global step JOIN (after the warmup) and leave
# gracefully at 9/10 of the global steps left after JOIN. Every learner emulates a chip: its step takes F times its
# own steady compute (run.slowdown "*:F"), so that 16 learners leave the machine's cores partly idle (F = 12: 16
# learners kept ~1.45 of the 2 cores busy computing in session 49's +12 run) and an extra learner adds compute as an
# extra chip would (on these shared cores it also slows the others: docs/measurements.md, "Extra learners").
# EXTRA_TOKENS=1 (default): extra compute is extra tokens — the budget grows by what the extras train while they are
# there (EXTRA × their global steps × B × T) and the lr is constant after the warmup (train.min_lr_ratio = 1), so
# every run sees the same lr at each global step and ends near global step STEPS. EXTRA_TOKENS=0: the extras share
# the 4 learners' budget and its cosine (sessions 43 and 49's first tables): they end the run early, before its lr
# has decayed, and they leave at 9/10 of the global steps that budget leaves with 4 + EXTRA learners.
# The evaluator scores Θ every EVAL global steps on the same 64k validation tokens; each curve is smoothed over 3
# evaluations. The target is the loss the 4-learner run reaches at 3/4 of its time; per run, the wall-clock from the
# learners' start to the first (smoothed) evaluation at or below the target (linear between evaluations), relative
# to the 4-learner run's.
# Usage (repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [STEPS=200] [F=12] [EXTRAS="0 1 2 4 12"] [JOIN=60] [EVAL=10] [SEED=1] [TAU=2] [EXTRA_TOKENS=1] bench/scavenging.sh
#   Writes runs/scavenging-<date>/ (OUT=DIR: there): each run's folder (through `dloco chaos`, so each also has its
#   chaos.md with kept-work goodput and the exact-data and final-copy checks), results.json and table.md.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-200}
F=${F:-12}
EXTRAS=${EXTRAS:-0 1 2 4 12}
JOIN=${JOIN:-60}
EVAL=${EVAL:-10}
SEED=${SEED:-1}
TAU=${TAU:-2}
EXTRA_TOKENS=${EXTRA_TOKENS:-1}
M=4 B=8 T=128 S=16
bad() { echo "bench/scavenging.sh: $*" >&2; exit 2; }
for n in STEPS JOIN EVAL SEED TAU; do [[ ${!n} =~ ^[0-9]+$ ]] || bad "$n must be a whole number"; done
[ "$JOIN" -ge 1 ] && [ "$EVAL" -ge 1 ] || bad "JOIN and EVAL must be ≥ 1"
[[ $EXTRA_TOKENS =~ ^[01]$ ]] || bad "EXTRA_TOKENS must be 0 or 1"
[ "$STEPS" -ge $((2 * JOIN)) ] || bad "STEPS ($STEPS) must be at least 2 × JOIN ($JOIN): the extras join after warm-up"
[[ " $EXTRAS " == *" 0 "* ]] || bad "EXTRAS needs a 0: the 4-learner run is the reference"
for e in $EXTRAS; do
  [[ $e =~ ^[0-9]+$ ]] && [ "$e" -le $((S - M)) ] || bad "EXTRAS: '$e' is not a whole number in [0, $((S - M))]"
done
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$F') >= 1 else 1)" 2> /dev/null || bad "F must be ≥ 1"
DLOCO=${DLOCO:-$PWD/build/bin/dloco}
[ -x "$DLOCO" ] || bad "no $DLOCO: run scripts/build.sh"
[ -n "$(ls data/kjv/train_*.bin 2> /dev/null)" ] || bad "no data/kjv: run \`build/bin/dloco data prepare --kjv --out data/kjv\`"
out=${OUT:-$PWD/runs/scavenging-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
common=(--set model.d_model=64 --set model.n_layer=4 --set model.n_head=4 --set train.batch_size=$B
        --set train.eval_interval=$EVAL --set train.eval_tokens=65536
        --set train.checkpoint_interval=0 --set train.log_interval=1000 --set run.threads=$S
        --set run.report_interval_s=30 --set run.seed=$SEED --set diloco.learners=$M --set diloco.quorum=$M
        --set diloco.grace_window=true --set diloco.overlap=$TAU --set train.shared_budget=true --set data.streams=$S
        --set "run.slowdown=\"*:$F\""
        --set run.out_dir="\"$out\"")
source bench/demo_before_48.sh
common+=("${demo_before_48[@]}")
[ "$EXTRA_TOKENS" = 1 ] && common+=(--set train.min_lr_ratio=1.0)
echo "bench/scavenging.sh: M = $M + EXTRAS ($EXTRAS) joining at global step $JOIN, every learner ${F}× its compute -> $out"
for e in $EXTRAS; do
  plan="$out/plan-$e.toml"
  printf '[plan]\nname = "+%s learners"\n' "$e" > "$plan"
  if [ "$EXTRA_TOKENS" = 1 ]; then
    leave=$(( JOIN + 9 * (STEPS - JOIN) / 10 ))
    budget=$(( (M * STEPS + e * (leave - JOIN)) * B * T ))
  else
    leave=$(( JOIN + 9 * (M * STEPS - M * JOIN) / (M + e) / 10 ))
    budget=$(( M * STEPS * B * T ))
  fi
  for ((i = 0; i < e; ++i)); do
    printf '[[fault]]\nat_step = %d\naction = "add_learner"\nlearner = %d\n' "$JOIN" $((M + i)) >> "$plan"
    printf '[[fault]]\nat_step = %d\naction = "leave_learner"\nlearner = %d\n' "$leave" $((M + i)) >> "$plan"
  done
  echo "== +$e learners$([ "$e" -gt 0 ] && echo " (join at $JOIN, leave at $leave)")"
  "$DLOCO" chaos --config configs/demo.toml --plan "$plan" --no-reference --name "extra-$e" "${common[@]}" \
    --set train.total_tokens=$budget \
    > "$out/extra-$e.log" 2>&1 || { tail -20 "$out/extra-$e.log"; exit 1; }
done
/usr/bin/python3 bench/scavenging_table.py "$out" $EXTRAS | tee "$out/table.md"
