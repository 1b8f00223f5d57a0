#!/usr/bin/env bash
# The short version of bench/wan/utilisation.sh (issue 32): dp and decoupled, M = 2, every worker or learner in its
# own network namespace, the tiny model on a tiny corpus, each method unshaped (three times: the reference is their mean)
# and with every site's link shaped to 5 Mbit/s each way and 20 ms between any two hosts. Asserts what holds on an
# otherwise idle machine of any speed (ctest runs it alone, RUN_SERIAL; another load would move the unshaped references):
#   - unshaped, both methods are at utilisation ≥ 0.9: at least two of the three unshaped runs against the mean of
#     the three (the measurement's own noise; with 40 dp steps six unshaped runs were within ±3.5%, but in a CI run
#     the first dp run after the other process tests was 25% slower than the last);
#   - at RATE (5 Mbit/s), decoupled learners never wait on their link: per learner, the time between its step events
#     outside the step's own compute (step_s, sleep_s) is ≤ 5% of its step window (measured 0.2–1.2%; a learner that
#     waits for its merges, diloco.blocking = true, spends most of it there). Their utilisation is printed, not
#     asserted: on 2 cores the delay lines' and the syncer's CPU is taken from the learners' (0.82–1.0 seen at RATE);
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

/usr/bin/python3 - "$dir/out/results.txt" "$RATE" "$dir/out/rtt.txt" "$RTT_MS" "$dir/out" <<'PY' || fail "utilisation checks (table above)"
import collections, glob, json, sys
waited = 0
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
# waiting: per decoupled learner at RATE, Σ (gap between two step events − the later step's step_s − sleep_s) over Σ gap
for path in sorted(glob.glob(f"{sys.argv[5]}/decoupled-r{sys.argv[2]}-*/events/learner_*.jsonl")):
    steps = [e for e in map(json.loads, open(path)) if e.get("event") == "step"]
    gaps = [(b["t"] - a["t"], b["step_s"] + b.get("sleep_s", 0)) for a, b in zip(steps, steps[1:])]
    window = sum(g for g, _ in gaps)
    share = sum(g - c for g, c in gaps) / window if window > 0 else 1.0
    print(f"{path.split('/')[-3]} {path.split('/')[-1]}: {len(steps)} steps, {share:.3f} of {window:.1f} s outside the steps")
    if len(steps) < 3 or share > 0.05:
        print(f"  a decoupled learner waited on its link at {sys.argv[2]} Mbit/s (> 5% of its time outside its steps)")
        ok = False
    waited += 1
if waited != 2:
    print(f"{waited} decoupled learners' step events at {sys.argv[2]} Mbit/s, 2 expected")
    ok = False
if not dp + 0.3 <= dec:
    print(f"dp's utilisation is not at least 0.3 below decoupled's at {sys.argv[2]} Mbit/s")
    ok = False
sys.exit(0 if ok else 1)
PY
echo "wan utilisation: ok"
