#!/usr/bin/env bash
# Configures and builds dloco (Release) into build/. Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
launcher=()
# ccache (scripts/setup.sh installs it) makes a rebuild of unchanged translation units, e.g. CI's fresh clone on a
# machine that built the same commit before, take seconds instead of minutes.
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(cd .. && pwd)}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build build -j"$jobs"
