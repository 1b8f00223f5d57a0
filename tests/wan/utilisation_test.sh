#!/usr/bin/env bash
# The short version of bench/wan/utilisation.sh (issue 32): dp and decoupled, M = 2, every worker or learner in its
# own network namespace, the tiny model on a tiny corpus, each method unshaped (three times: the reference is their mean)
# and with every site's link shaped to 5 Mbit/s each way and 20 ms between any two hosts. Asserts what holds on an
# otherwise idle machine of any speed (ctest runs it alone, RUN_SERIAL; another load would move the unshaped references):
#   - unshaped, both methods are at utilisation ≥ 0.9: at least two of the three unshaped runs against the mean of
#     the three (the measurement's own noise; with 40 dp steps six unshaped runs were within ±3.5%, but in a CI run
#     the first dp run after the other process tests was 25% slower than the last);
#   - at RATE (5 Mbit/s), decoupled learners are still at ≥ 0.85: they never wait on their link (a learner that
#     waited for its merges, diloco.blocking = true, measured 0.38 here, 0.90 at 20 Mbit/s);
#   - at RATE the round trip between two hosts, measured, is RTT_MS (20 ms) to 10 ms more: the delay line works;
#   - at RATE, dp's utilisation is at least 0.3 below decoupled's: dp all-reduces the whole gradient (0.53 MB in fp32)
#     every step, ~0.85 s at 5 Mbit/s, many times a step's compute here even on a machine 3× slower.
# Usage: tests/wan/utilisation_test.sh BUILD_DIR (ctest passes it). Exit 77 (skipped) when not root, or when this
# machine cannot make a network namespace or a TBF qdisc (a container without CAP_NET_ADMIN, a kernel without it).
# DLOCO_TEST_SLOWDOWN=F slows every worker and learner F× (run.slowdown).
set -euo pipefail
BUILD=$(cd "${1:?usage: utilisation_test.sh BUILD_DIR}" && pwd)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "skipped: network namespaces and tc need root"; exit 77; }
for tool in ip tc iptables; do command -v "$tool" > /dev/null || { echo "FAILED: $tool missing (scripts/setup.sh installs it)"; exit 1; }; done
RATE=5  # the thresholds are for this rate: learners that wait for their merges still reach 0.90 at 20 Mbit/s
RTT_MS=20  # between any two hosts at RATE (the bench's delay line); the measured round trip must be within 20…30 ms
probe="dwp$(( $$ % 10000 ))"
if ! { ip netns add "$probe" && ip -n "$probe" link add "${probe}a" type veth peer name "${probe}b" &&
       ip netns exec "$probe" tc qdisc add dev "${probe}a" root tbf rate 5mbit burst 131072 latency 200ms &&
       ip netns exec "$probe" iptables -A INPUT -i "${probe}a" -j NFQUEUE --queue-num 0; } 2> /dev/null; then
  ip netns del "$probe" 2> /dev/null || true
  echo "skipped: cannot make a network namespace with a TBF-shaped veth and an NFQUEUE rule here (CAP_NET_ADMIN,"
  echo "  sch_tbf, nfnetlink_queue: the delay line's)"
  exit 77
fi
ip netns del "$probe"
dir=$(mktemp -d /tmp/dloco_wan.XXXXXX)
cleanup() { [ -n "${DLOCO_KEEP_TEST_RUNS:-}" ] || rm -rf "$dir"; }
trap cleanup EXIT
fail() {
  echo "FAILED: $*"
  for f in "$dir"/out/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 20 "$f"; }; done
  exit 1
}

# the tiny corpus of the process tests (tests/support/tiny_corpus.h)
for i in $(seq 0 5999); do echo "And it came to pass on day $((i % 97)) that the word was spoken."; done > "$dir/corpus.txt"
"$BUILD/bin/dloco-data" prepare "$dir/corpus.txt" --out "$dir/data" --vocab-size 400 --threads 1 > "$dir/prepare.log" 2>&1 ||
  fail "dloco-data prepare: $(tail -n 3 "$dir/prepare.log")"

[ -x "$BUILD/bin/bench_wan_delay_line" ] && command -v iptables > /dev/null ||
  fail "no $BUILD/bin/bench_wan_delay_line or no iptables (scripts/setup.sh installs libnetfilter-queue-dev, iptables)"
DLOCO="$BUILD/bin/dloco" OUT="$dir/out" DATA="$dir/data" RATES="0 $RATE 0 0" RTT_MS=$RTT_MS METHODS="dp decoupled" \
  DP_STEPS=40 DEC_STEPS=96 SLOWDOWN="${DLOCO_TEST_SLOWDOWN:-}" \
  SETS="--set model.vocab_size=400 --set model.n_layer=2 --set train.eval_tokens=4096" \
  bash "$SRC/bench/wan/utilisation.sh" > "$dir/bench.log" 2>&1 || { tail -n 30 "$dir/bench.log"; fail "the bench failed"; }
cat "$dir/out/table.md"

/usr/bin/python3 - "$dir/out/results.txt" "$RATE" "$dir/out/rtt.txt" "$RTT_MS" <<'PY' || fail "utilisation checks (table above)"
import collections, sys
try:
    rtt = float(open(sys.argv[3]).read())
except (OSError, ValueError) as e:
    sys.exit(f"the bench measured no round trip ({e}): see its log above")
print(f"round trip at {sys.argv[2]} Mbit/s: {rtt} ms measured, {sys.argv[4]} ms asked")
ok = float(sys.argv[4]) <= rtt <= float(sys.argv[4]) + 10
if not ok:
    print("the measured round trip is not within 0…10 ms above the one asked: the delay line did not hold the packets")
rows = [line.split() for line in open(sys.argv[1])]
util = collections.defaultdict(list)
for method, rate, _, u in rows:
    util[(method, rate)].append(float(u))
for method in ("dp", "decoupled"):
    unshaped = util[(method, "0")]
    if sum(u >= 0.9 for u in unshaped) < 2:
        print(f"{method} unshaped at utilisation {unshaped} of their mean: fewer than 2 of 3 at ≥ 0.9, too noisy")
        ok = False
dp, dec = util[("dp", sys.argv[2])][0], util[("decoupled", sys.argv[2])][0]
print(f"at {sys.argv[2]} Mbit/s: dp {dp:.3f}, decoupled {dec:.3f}")
if dec < 0.85:
    print(f"decoupled learners at utilisation {dec:.3f} < 0.85 at {sys.argv[2]} Mbit/s: they waited on their link")
    ok = False
if not dp + 0.3 <= dec:
    print(f"dp's utilisation is not at least 0.3 below decoupled's at {sys.argv[2]} Mbit/s")
    ok = False
sys.exit(0 if ok else 1)
PY
echo "wan utilisation: ok"
