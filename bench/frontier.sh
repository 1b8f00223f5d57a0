#!/usr/bin/env bash
# The bandwidth–quality frontier (issue 14): Decoupled DiLoCo on configs/demo.toml (M = 4, equal tokens) with
# the outer gradients (up) and the merged fragments (down) in fp32, bf16, q8, q4 and q4 + error feedback, at
# H = 12 and at larger H with P = 12 kept; the dp baseline beside them. One `dloco compare`, so the table gives
# each variant's final validation loss, MB up / down per learner, bytes per learner-step and "fewer bytes
# than dp" (dp's bytes per learner-step / the row's).
# Usage (from the repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [SEEDS=1,2] [NAME=frontier] [POINTS="h12 large"] bench/frontier.sh
# POINTS: h12 = dp and every codec at H = 12 (6 runs per seed); large = fp32, q4 and q4 + error feedback at
# H = 24 and 48 (6 runs); h96 = q4 and q4 + error feedback at H = 96 (2 runs). ~3.5 min a run on 2 cores.
# Results: runs/<NAME>/compare.md.
set -euo pipefail
cd "$(dirname "$0")/.."
DLOCO=${DLOCO:-build/bin/dloco}
SEEDS=${SEEDS:-1}
NAME=${NAME:-frontier}
POINTS=${POINTS:-h12 large h96}
variant() {  # name codec error_feedback H
  echo "--variant=$1:diloco.wire_up=$2;diloco.wire_down=$2;diloco.error_feedback=$3;diloco.inner_steps=$4"
}
args=()
for point in $POINTS; do
  case $point in
    h12)
      args+=(--modes dp)
      args+=("$(variant fp32-h12 fp32 false 12)" "$(variant bf16-h12 bf16 false 12)" "$(variant q8-h12 q8 false 12)")
      args+=("$(variant q4-h12 q4 false 12)" "$(variant q4ef-h12 q4 true 12)")
      ;;
    large)
      for H in 24 48; do
        args+=("$(variant fp32-h$H fp32 false $H)" "$(variant q4-h$H q4 false $H)" "$(variant q4ef-h$H q4 true $H)")
      done
      ;;
    h96) args+=("$(variant q4-h96 q4 false 96)" "$(variant q4ef-h96 q4 true 96)") ;;
    *) echo "unknown point '$point' (h12, large, h96)" >&2; exit 2 ;;
  esac
done
# the demo config of the time its table was measured with (docs/measurements.md "Bandwidth and quality"), pinned
source bench/demo_before_48.sh
exec "$DLOCO" compare --config configs/demo.toml --set train.lr=3e-3 "${demo_before_48[@]}" --seeds "$SEEDS" \
  --name "$NAME" "${args[@]}"
