#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang 14, ASan + UBSan, DLOCO_WITH_TORCH=OFF) into build-fuzz/ and runs each
# for FUZZ_SECONDS (default 60) from the committed seed corpus fuzz/corpus/<target>/ (plus the repository's configs
# and fault plans as seeds of those two), FUZZ_JOBS targets at a time (default: nproc). New inputs the fuzzer keeps
# go to build-fuzz/corpus/<target>/ (not committed); a crash, a leak, UB, an invariant broken or a timeout (> 10 s on
# one input) fails the script, its input saved as build-fuzz/artifacts/<target>/crash-… (reproduce:
# build-fuzz/bin/fuzz_<target> FILE). scripts/test.sh (so CI) runs this after the sanitized tests.
# Usage: scripts/fuzz.sh [TARGET…]   (default: every target in fuzz/CMakeLists.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
cxx=${FUZZ_CXX:-clang++-14}
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" \
  -DCMAKE_CXX_COMPILER="$cxx" -DDLOCO_WITH_TORCH=OFF -DDLOCO_FUZZ=ON -DDLOCO_BUILD_TESTS=OFF -DDLOCO_BUILD_BENCH=OFF \
  "${launcher[@]}" >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  read -r -a targets <<<"$(sed -n 's/^set(dloco_fuzz_targets \(.*\))$/\1/p' fuzz/CMakeLists.txt)"
fi
cmake --build build-fuzz -j"$jobs" --target "${targets[@]/#/fuzz_}"

run_one() {  # target -> exit status of its run; its log in build-fuzz/logs/<target>.log
  local t=$1 corpus=build-fuzz/corpus/$1 artifacts=build-fuzz/artifacts/$1
  mkdir -p "$corpus" "$artifacts" build-fuzz/logs
  local seeds=(fuzz/corpus/"$t")
  case $t in
    config) seeds+=(configs) ;;
    fault_plan) seeds+=(plans) ;;
  esac
  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    build-fuzz/bin/fuzz_"$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "${seeds[@]}" >build-fuzz/logs/"$t".log 2>&1
}
export -f run_one
export seconds
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {} && echo "[fuzz] {}: ok" || { echo "[fuzz] {}: FAILED (build-fuzz/logs/{}.log)"; exit 1; }' \
  | tee build-fuzz/summary.txt || true
failed=0
for t in "${targets[@]}"; do
  log=build-fuzz/logs/$t.log
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n1 || true)
  if grep -q "^\[fuzz\] $t: ok" build-fuzz/summary.txt; then
    echo "[fuzz] $t: ${runs:-?} inputs in ${seconds} s, ${cov:-cov: ?}, no crash"
  else
    failed=1
    echo "[fuzz] $t: FAILED after ${runs:-?} inputs; the end of build-fuzz/logs/$t.log:"
    tail -n 40 "$log" | sed 's/^/    /'
  fi
done
exit $failed
