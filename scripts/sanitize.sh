#!/usr/bin/env bash
# Builds the torch-free targets (core, data, chaos, sim, the syncer's state machine and their tests; the test
# folders are listed in tests/CMakeLists.txt) with AddressSanitizer + UBSan into build-asan/ and runs their ctest.
# Any sanitizer report fails: ASan and LeakSanitizer exit non-zero, UB aborts (-fno-sanitize-recover), and a test
# that spawns a sanitized tool (dloco-data) sees it fail. scripts/test.sh (so CI) runs this after the Release suite.
# Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# -O1: ASan's recommended level, and quicker to compile than -O3; -g1: line tables for the reports' stacks.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DDLOCO_WITH_TORCH=OFF -DDLOCO_SANITIZE=ON -DDLOCO_BUILD_BENCH=OFF "${launcher[@]}" "$@"
cmake --build build-asan -j"$jobs"
asan=(halt_on_error=1 detect_leaks=1 detect_stack_use_after_return=1 check_initialization_order=1 strict_init_order=1)
export ASAN_OPTIONS=$(IFS=:; echo "${asan[*]}")
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
ctest --test-dir build-asan -j"$jobs" --output-on-failure --timeout 600
