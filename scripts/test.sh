#!/usr/bin/env bash
# Quick start, part 2: installs what is missing (apt), builds (Release, with tests) and runs the whole test suite,
# then the torch-free tests again under AddressSanitizer + UBSan (scripts/sanitize.sh, build-asan/). Both suites
# run even if the first fails; the script fails if either does.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
release=0
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 600 2>&1 | tee build/ctest.out || release=$?
echo "[test] sanitized (ASan + UBSan) torch-free tests: build-asan/"
mkdir -p build-asan
sanitized=0
bash scripts/sanitize.sh 2>&1 | tee build-asan/ctest.out || sanitized=$?
# Both suites' ctest summaries, last, so neither scrolls away behind the other's build.
summary() { grep -E 'tests passed|tests failed' "$1" | tail -n1 || echo "no ctest summary (the build failed?)"; }
echo "[test] Release:      $(summary build/ctest.out)"
echo "[test] ASan + UBSan: $(summary build-asan/ctest.out)"
[ "$release" -eq 0 ] && [ "$sanitized" -eq 0 ]
