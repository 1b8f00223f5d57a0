#!/usr/bin/env bash
# Quick start, part 1: installs what is missing (apt), builds (Release), prepares the KJV corpus and runs the
# default training job (configs/demo.toml) to its report. The run folder is runs/demo-<timestamp>.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [ ! -f data/kjv/meta.json ]; then
  ./build/bin/dloco data prepare --kjv --out data/kjv
fi
exec ./build/bin/dloco train --config configs/demo.toml --set "run.name=demo-$(date +%Y%m%d-%H%M%S)" "$@"
