#!/usr/bin/env bash
# SkipPipe on real processes against the simulator (issue 13, docs/skippipe.md "Measured: real processes against the
# simulator"): the reference setting (20 nodes in 12 regions, 6 stages of [5, 3, 3, 3, 3, 3] nodes, C = 3) as 20
# `dloco skippipe node` processes on this machine, its links and compute emulated at SCALE of their setting times
# (--link-scale = --compute-scale = SCALE: every hop held at its receiver for SCALE x latency + bytes/bandwidth +
# overhead, every forward/head/backward padded to SCALE x its setting time), for three schedules:
#   full       configs/skippipe/full_pipeline.json: the reference's full pipeline, 27 micro-batches through 6 stages
#   oblivious  `dloco skippipe schedule --method oblivious` on the same placement (seed OBLIVIOUS_SEED): 30
#              micro-batches on 4 of 6 stages, paths drawn without looking at the network
#   skippipe   configs/skippipe/dloco_schedule.json: our collision-aware schedule (one adjacent swap allowed)
# Each runs K iterations; the measured iteration time is the slowest node's run_iteration wall time, averaged over
# iterations 1 … K−1 (iteration 0 includes the processes' first allocations). Prints, from this one run, measured
# vs the exact simulator x SCALE per schedule and the ratios full / oblivious / skippipe both ways.
# Usage (from the repository root, after scripts/build.sh):
#   bench/skippipe/processes.sh [SCALE=0.1] [K=4] [OUT=runs/bench-skippipe-nodes]
set -euo pipefail
cd "$(dirname "$0")/../.."
DLOCO=${DLOCO:-build/bin/dloco}
DATA_TOOL=${DATA_TOOL:-build/bin/dloco-data}
SCALE=${SCALE:-0.1}
K=${K:-4}
OUT=${OUT:-runs/bench-skippipe-nodes}
OBLIVIOUS_SEED=${OBLIVIOUS_SEED:-1}
SETTING=configs/skippipe/reference_setting.json
mkdir -p "$OUT"

# A small corpus of its own (the benchmark times the pipeline, not what it learns): 3000 lines through dloco-data.
if [[ ! -f "$OUT/data/tokenizer.model" ]]; then
  for i in $(seq 1 3000); do echo "And it came to pass on day $((i % 97)) that the word was spoken unto them."; done \
    > "$OUT/corpus.txt"
  "$DATA_TOOL" prepare "$OUT/corpus.txt" --out "$OUT/data" --vocab-size 400 --threads 1 > "$OUT/data.log" 2>&1
fi
cat > "$OUT/nodes.toml" <<TOML
# 6 blocks, one per stage of the reference placement; tiny so real compute stays far below the padded times.
[model]
preset = "tiny"
vocab_size = 400
n_layer = 6
[data]
dir = "$OUT/data"
[train]
batch_size = 2
lr = 1e-3
warmup_steps = 2
[run]
seed = 7
TOML

"$DLOCO" skippipe schedule --setting "$SETTING" --placement configs/skippipe/skippipe.json --method oblivious \
  --seed "$OBLIVIOUS_SEED" --out "$OUT/oblivious.json" > "$OUT/oblivious.log"

declare -A SCHEDULE=([full]=configs/skippipe/full_pipeline.json [oblivious]=$OUT/oblivious.json
                     [skippipe]=configs/skippipe/dloco_schedule.json)
for name in full oblivious skippipe; do
  echo "running $name: 20 processes, $K iterations at scale $SCALE (log: $OUT/$name.log)" >&2
  "$DLOCO" skippipe train --config "$OUT/nodes.toml" --setting "$SETTING" --schedule "${SCHEDULE[$name]}" \
    --iterations "$K" --link-scale "$SCALE" --compute-scale "$SCALE" --out "$OUT/$name" --timeout-s 120 \
    > "$OUT/$name.log" 2>&1
  "$DLOCO" skippipe simulate --setting "$SETTING" --schedule "${SCHEDULE[$name]}" --format json \
    > "$OUT/$name.sim.json"
done

/usr/bin/python3 - "$OUT" "$SCALE" "$K" <<'PY'
import glob, json, sys
out, scale, K = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rows = {}
for name in ("full", "oblivious", "skippipe"):
    nodes = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{name}/node_*.json"))]
    assert len(nodes) == 20, f"{name}: {len(nodes)} node files"
    walls = [max(n["iterations"][k]["wall_s"] for n in nodes) for k in range(K)]
    measured = sum(walls[1:]) / (K - 1)
    sim = json.load(open(f"{out}/{name}.sim.json"))["iteration_time_s"] * scale
    pad = max(it["compute_pad_s"] for n in nodes for it in n["iterations"])
    rows[name] = (measured, sim, walls, pad)
print(f"reference setting, 20 processes on {open('/proc/cpuinfo').read().count('processor')} cores, links and compute "
      f"emulated at scale {scale}, {K} iterations (iteration 0 left out)")
print("| schedule | measured s / iteration | simulated s x scale | measured / simulated | iterations (s) |")
print("|---|---|---|---|---|")
for name, (m, s, walls, pad) in rows.items():
    print(f"| {name} | {m:.3f} | {s:.3f} | {m / s:.3f} | {', '.join(f'{w:.3f}' for w in walls)} |")
print("| ratio | measured | simulated |")
print("|---|---|---|")
for a, b in (("full", "skippipe"), ("oblivious", "skippipe"), ("full", "oblivious")):
    print(f"| {a} / {b} | {rows[a][0] / rows[b][0]:.3f} | {rows[a][1] / rows[b][1]:.3f} |")
worst = max(abs(m / s - 1) for m, s, _, _ in rows.values())
print(f"largest |measured / simulated - 1|: {worst:.1%} (goal: within 15%)")
PY
