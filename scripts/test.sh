#!/usr/bin/env bash
# Quick start, part 2: installs what is missing (apt), builds (Release, with tests) and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 600
