#!/usr/bin/env bash
# Quick start, part 2: installs what is missing (apt), builds (Release, with tests) and runs the whole test suite,
# then the torch-free tests again under AddressSanitizer + UBSan (scripts/sanitize.sh, build-asan/), then every
# libFuzzer target for FUZZ_SECONDS (default 60) each (scripts/fuzz.sh, build-fuzz/). All three run even if one
# fails; the script fails if any does.
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
echo "[test] fuzzers (clang 14, ASan + UBSan): build-fuzz/"
mkdir -p build-fuzz
fuzzed=0
bash scripts/fuzz.sh 2>&1 | tee build-fuzz/fuzz.out || fuzzed=$?
# The three summaries, last, so none scrolls away behind another's build.
summary() { grep -E 'tests passed|tests failed' "$1" | tail -n1 || echo "no ctest summary (the build failed?)"; }
echo "[test] Release:      $(summary build/ctest.out)"
echo "[test] ASan + UBSan: $(summary build-asan/ctest.out)"
echo "[test] fuzzers:      $(grep -c ': .* inputs in .*no crash' build-fuzz/fuzz.out || true) targets ran their time without a crash$([ "$fuzzed" -eq 0 ] || echo ", FAILED: see above")"
[ "$release" -eq 0 ] && [ "$sanitized" -eq 0 ] && [ "$fuzzed" -eq 0 ]
