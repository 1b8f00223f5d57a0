#!/usr/bin/env bash
# Utilisation over constrained links, on real processes (issue 32 items 1–2): every learner (decoupled) or worker
# (dp, diloco, streaming) sits in its own network namespace — a "site" — whose link to the others is shaped: RATE
# Mbit/s each way (tc TBF on both ends of the site's veth; the syncer's link has no rate limit) and RTT_MS ms between
# any two hosts (a delay line on every host's ingress, bench/wan/delay_line.cc: the kernel here has no sch_netem).
# For each rate, each method trains a fixed number of steps and its utilisation is its training throughput over
# the same processes' throughput with every link unshaped:
#   throughput = Σ over learners (or workers) of (steps − 1) · B · T / (last step's time − first step's time)
# from the step events (start-up, bootstrap and the final evaluation are outside the window). Beside it, each run's
# syncs (dp: gradient all-reduces; diloco, streaming: outer all-reduces; decoupled: the syncer's merges of fragments)
# and final validation loss: a decoupled learner never waits on its link, so a link too slow for its fragments shows
# as fewer or staler merges and a worse loss, not as lower throughput.
# Model: the horizon study's (d_model 64, 4 layers, 0.48M parameters, 1.9 MB in fp32), B = 8 sequences of 128
# tokens, M = 2, one BLAS thread each; decoupled with configs/demo.toml's H = 12, P = 12, τ = 2, K = M, fp32 both ways.
# Usage (root; repository root, after scripts/build.sh and `dloco data prepare --kjv --out data/kjv`):
#   [RATES="0 300 100 30 10 0"] [RTT_MS=10] [METHODS="dp decoupled"] [DP_STEPS=40] [DEC_STEPS=96] \
#     [OUTER_STEPS=96] bench/wan/utilisation.sh
#   METHODS: any of dp, diloco (H = 12), diloco-hH (H = 30, say), streaming (H = P = 12, τ = 2) — the baselines, each
#   worker at a site, OUTER_STEPS steps (diloco and streaming) — and decoupled (fp32 both ways), decoupled-bf16 and
#   decoupled-q4 (that codec both ways, with error feedback).
#   RATES: Mbit/s, 0 = unshaped (the reference: the mean of a method's unshaped runs). RTT_MS: the round trip between
#   any two hosts at every shaped rate (0: none); the bench measures it (a TCP connect, site 1 to the syncer's host)
#   at the first shaped rate, prints it and writes it to rtt.txt. Prints a table (Markdown) and
#   writes it with every run's folder under runs/wan-<date>/ (OUT=DIR: there instead), and the raw rows as
#   results.txt ("method rate tokens/s utilisation"). DATA=DIR trains on another prepared corpus, SETS="--set K=V …"
#   adds config overrides after the bench's own (a smaller model; not train.batch_size or model.seq_len: B = 8 and
#   T = 128 are the bench's), SLOWDOWN=F slows every learner/worker F× (run.slowdown).
#   Also there: runs.txt (method, rate, tokens/s per run), utilisation.png and its plot-*.dat and utilisation.gp
#   (gnuplot). tests/wan/utilisation_test.sh is the short version ctest runs.
# Tears every namespace down on any exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" -eq 0 ] || { echo "bench/wan/utilisation.sh: network namespaces and tc need root" >&2; exit 2; }
RATES=${RATES:-0 300 100 30 10 0}
RTT_MS=${RTT_MS:-10}
METHODS=${METHODS:-dp decoupled}
DP_STEPS=${DP_STEPS:-40}
DEC_STEPS=${DEC_STEPS:-96}
OUTER_STEPS=${OUTER_STEPS:-96}
M=2 B=8 T=128
# The inputs, checked before anything is set up: rates are whole Mbit/s ≥ 0 with at least one 0 (the reference),
# methods are known, step counts are whole numbers ≥ 3.
bad() { echo "bench/wan/utilisation.sh: $*" >&2; exit 2; }
[ -n "${RATES// }" ] || bad "RATES is empty (give Mbit/s values, 0 = unshaped)"
for r in $RATES; do [[ $r =~ ^[0-9]+$ ]] || bad "RATES: '$r' is not a whole number of Mbit/s ≥ 0"; done
[[ " $RATES " == *" 0 "* ]] || bad "RATES needs a 0: each method's unshaped run is its reference"
[ -n "${METHODS// }" ] || bad "METHODS is empty (dp, diloco, diloco-hH, streaming, decoupled[-bf16|-q4])"
for m in $METHODS; do
  [[ $m =~ ^(dp|diloco|diloco-h[1-9][0-9]*|streaming|decoupled|decoupled-bf16|decoupled-q4)$ ]] ||
    bad "unknown method '$m' (dp, diloco, diloco-hH, streaming, decoupled, decoupled-bf16, decoupled-q4)"
done
[[ $RTT_MS =~ ^[0-9]+$ ]] && [ "$RTT_MS" -le 10000 ] || bad "RTT_MS: '$RTT_MS' is not a whole number of ms in 0…10000"
for n in DP_STEPS DEC_STEPS OUTER_STEPS; do [[ ${!n} =~ ^[0-9]+$ ]] && [ "${!n}" -ge 3 ] || bad "$n must be ≥ 3"; done
DLOCO=${DLOCO:-$PWD/build/bin/dloco}
PY=/usr/bin/python3
out=${OUT:-$PWD/runs/wan-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
p="dw$(( $$ % 10000 ))"
net="10.76.$(( $$ % 250 + 1 ))"
hosts=(s $(seq 1 $M))  # s: the syncer (and nothing for dp); 1 … M: the sites
delay_lines=()
cleanup() {
  # the delay lines first, so each writes its counts (packets, most held, lateness) to its log
  [ ${#delay_lines[@]} -eq 0 ] || { kill -TERM "${delay_lines[@]}" 2> /dev/null || true; sleep 0.3; }
  for h in "${hosts[@]}" w; do
    ip netns pids "$p$h" 2> /dev/null | xargs -r kill -9 2> /dev/null || true
    ip netns del "$p$h" 2> /dev/null || true
  done
}
trap cleanup EXIT
source scripts/netns.sh
bridge_hosts "$p" "$net" "${hosts[@]}"
addr() { [ "$1" = s ] && echo "$net.1" || echo "$net.$(($1 + 1))"; }

# Links: TBF for the rate (this machine's kernel, 6.18, has no sch_netem: "Specified qdisc kind is unknown"; TBF's
# bucket holds 128 KiB, above a veth's largest GSO packet, a smaller one drops them) on both ends of each site's veth;
# the latency from a delay line per host (bench/wan/delay_line.cc: netfilter queues every packet arriving on the
# host's veth, the line holds it RTT/2 and lets it in), so any two hosts — syncer and learner, or two dp workers — are
# RTT apart. On ingress, not egress: a packet held on its way out still counts against its socket's TCP small-queue
# budget (~1 ms of data), which caps a delayed sender far below the link (5 of 100 Mbit/s at 40 ms, measured).
# Unshaped (rate 0) means no rate limit and no added delay. Without the delay line (no libnetfilter_queue at build
# time) or iptables, RTT is 0 and the bench says so.
DELAY_LINE=${DELAY_LINE:-$(dirname "$DLOCO")/bench_wan_delay_line}
if [ "$RTT_MS" != 0 ] && { [ ! -x "$DELAY_LINE" ] || ! command -v iptables > /dev/null; }; then
  echo "[wan] no $DELAY_LINE or no iptables (scripts/setup.sh, scripts/build.sh): no added delay, RTT 0" >&2
  RTT_MS=0
fi
if [ "$RTT_MS" != 0 ]; then
  # real-time priority keeps a release on time on a loaded machine; without the privilege (a container), plain
  rt=(chrt -f 10)
  "${rt[@]}" true 2> /dev/null || { rt=(); echo "[wan] chrt -f refused here: delay lines at normal priority" >&2; }
  for h in "${hosts[@]}"; do
    ip netns exec "$p$h" "${rt[@]}" "$DELAY_LINE" --queue 0 --delay-us $((RTT_MS * 500)) \
      > "$out/delay_line.$h.log" 2>&1 &
    delay_lines+=($!)
  done
  for h in "${hosts[@]}"; do  # bound before any packet is queued to it (a queue with no reader drops)
    for _ in $(seq 50); do grep -q ready "$out/delay_line.$h.log" 2> /dev/null && break; sleep 0.1; done
    grep -q ready "$out/delay_line.$h.log" ||
      bad "the delay line of host $h did not start: $(cat "$out/delay_line.$h.log")"
  done
fi

# shape RATE: every site's link RATE Mbit/s each way (both ends of its veth) and every host's incoming packets held
# RTT/2; 0 = unshaped (no limit, no delay)
shape() {
  for pid in "${delay_lines[@]}"; do  # a dead line drops every packet to its host: fail now, not on a deadline
    kill -0 "$pid" 2> /dev/null || bad "a delay line died: $(tail -n 3 "$out"/delay_line.*.log)"
  done
  if [ "$RTT_MS" != 0 ]; then
    for h in "${hosts[@]}"; do
      ip netns exec "$p$h" iptables -F INPUT
      [ "$RATE" = 0 ] || ip netns exec "$p$h" iptables -A INPUT -i "$p${h}a" -j NFQUEUE --queue-num 0
    done
  fi
  for h in $(seq 1 $M); do
    for end in "$p$h ${p}${h}a" "${p}w ${p}${h}b"; do
      set -- $end
      ip netns exec "$1" tc qdisc del dev "$2" root 2> /dev/null || true
      [ "$RATE" = 0 ] && continue
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${RATE}mbit" burst 131072 latency 200ms
    done
  done
}

# rtt: the measured round trip between site 1 and the syncer's host (a TCP connect's median over 10), ms
rtt() {
  ip netns exec "${p}s" "$PY" -c "
import socket, time
s = socket.socket(); s.bind(('$(addr s)', 7199)); s.listen(64); time.sleep(30)" &
  local listener=$!
  ip netns exec "${p}1" "$PY" -c "
import socket, statistics, time
for _ in range(100):  # until the listener is up (Python's start on a loaded machine)
    try:
        socket.create_connection(('$(addr s)', 7199), timeout=5).close()
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
ts = []
for _ in range(10):
    t0 = time.perf_counter(); socket.create_connection(('$(addr s)', 7199), timeout=5).close()
    ts.append(time.perf_counter() - t0)
print(f'{statistics.median(ts) * 1e3:.1f}')" || echo "?"
  kill "$listener" 2> /dev/null || true
}

common=(--set model.d_model=64 --set model.n_layer=4 --set model.n_head=4 --set train.batch_size=$B
        --set train.eval_interval=0 --set train.checkpoint_interval=0 --set train.log_interval=1000
        --set run.threads=1 --set run.report_interval_s=5 --set run.out_dir="\"$out\"" --set diloco.learners=$M
        --set diloco.quorum=$M --set 'run.secret="wan-bench"')
source bench/demo_before_48.sh
common+=("${demo_before_48[@]}")
[ -n "${DATA:-}" ] && common+=(--set "data.dir=\"$DATA\"")
if [ -n "${SLOWDOWN:-}" ]; then
  slow=$(seq -s, 0 $((M - 1)) | sed "s/\([0-9]*\)/\1:$SLOWDOWN/g")
  common+=(--set "run.slowdown=\"$slow\"")
fi
read -ra extra <<< "${SETS:-}"  # words, as the shell splits them, without globbing
common+=("${extra[@]}")

# throughput RUN_DIR PREFIX: tokens/s of the step events of RUN_DIR/events/PREFIX*.jsonl (see the header)
throughput() {
  "$PY" - "$1" "$2" $((B * T)) <<'PY'
import glob, json, sys
run, prefix, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
total = 0.0
for path in sorted(glob.glob(f"{run}/events/{prefix}*.jsonl")):
    if "_rank_" in path:
        continue
    t = [json.loads(l)["t"] for l in open(path) if '"event":"step"' in l]
    if len(t) < 3:
        sys.exit(f"{path}: only {len(t)} steps")
    total += (len(t) - 1) * tokens / (t[-1] - t[0])
print(f"{total:.1f}")
PY
}

# run_workers NAME MODE STEPS [--set …]: a baseline's M workers, one per site, meeting over worker 0's TCP store
run_workers() {
  local name=$1 mode=$2 steps=$3 pids=()
  shift 3
  for r in $(seq 0 $((M - 1))); do
    ip netns exec "$p$((r + 1))" "$DLOCO" worker --config configs/demo.toml "${common[@]}" --set "diloco.mode=\"$mode\"" \
      --set run.trusted_network=true --set "run.name=\"$name\"" --set train.total_tokens=$((M * steps * B * T)) "$@" \
      --rank "$r" --store "tcp://$(addr 1):29461" > "$out/$name.worker_$r.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "$mode worker failed: see $out/$name.worker_*.log" >&2; exit 1; }; done
}
run_dp() { run_workers "$1" dp "$DP_STEPS"; }
# diloco-hH: DiLoCo syncing the whole model every H steps, blocking (H = 12 unless named)
run_diloco() { run_workers "$1" diloco "$OUTER_STEPS" --set "diloco.inner_steps=${2:-12}"; }
# streaming: Streaming DiLoCo with the demo's H = 12, P = 12, τ = 2 (each worker waits for each fragment's
# all-reduce at u + τ)
run_streaming() { run_workers "$1" streaming "$OUTER_STEPS"; }

run_decoupled() {  # name [codec] → its folder; the syncer on its unshaped link, the learners at the sites
  local name=$1 codec=${2:-fp32} pids=()
  local sets=("${common[@]}" --set 'diloco.mode="decoupled"' --set "run.name=\"$name\""
              --set train.total_tokens=$((M * DEC_STEPS * B * T)) --insecure
              --set "diloco.wire_up=\"$codec\"" --set "diloco.wire_down=\"$codec\"")
  [ "$codec" = fp32 ] || sets+=(--set diloco.error_feedback=true)
  ip netns exec "${p}s" "$DLOCO" syncer --config configs/demo.toml "${sets[@]}" --listen "$(addr s):7070" \
    > "$out/$name.syncer.log" 2>&1 &
  local syncer=$!
  for id in $(seq 0 $((M - 1))); do
    ip netns exec "$p$((id + 1))" "$DLOCO" learner --config configs/demo.toml "${sets[@]}" --id "$id" \
      --syncer "$(addr s):7070" > "$out/$name.learner_$id.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "a learner failed: see $out/$name.learner_*.log" >&2; exit 1; }; done
  wait "$syncer" || { echo "the syncer failed: see $out/$name.syncer.log" >&2; exit 1; }
}

# Every run's throughput, then the table: utilisation against the mean of the method's unshaped runs (RATES starts
# and ends with 0 by default, so a drift of the machine over the sweep shows as two different references).
results=()
for RATE in $RATES; do
  shape
  if [ "$RATE" != 0 ] && [ -z "${measured_rtt:-}" ]; then
    measured_rtt=$(rtt)
    echo "$measured_rtt" > "$out/rtt.txt"
    echo "[wan] RTT between site 1 and the syncer's host: $measured_rtt ms measured (RTT_MS=$RTT_MS)"
  fi
  for method in $METHODS; do
    name="$method-r$RATE-$(( ${#results[@]} ))"
    echo "[wan] $method at $([ "$RATE" = 0 ] && echo "unshaped links" || echo "$RATE Mbit/s, RTT $RTT_MS ms")"
    case $method in
      diloco-h*) run_diloco "$name" "${method#diloco-h}" ;;
      decoupled-*) run_decoupled "$name" "${method#decoupled-}" ;;
      dp | diloco | streaming | decoupled) "run_$method" "$name" ;;
      *) echo "unknown method '$method' (dp, diloco, diloco-hH, streaming, decoupled[-bf16|-q4])" >&2; exit 2 ;;
    esac
    tps=$(throughput "$out/$name" "$([[ $method == decoupled* ]] && echo learner_ || echo worker_)")
    echo "[wan] $method at $RATE: $tps tokens/s"
    results+=("$method $RATE $tps")
  done
done
printf '%s\n' "${results[@]}" > "$out/runs.txt"
: > "$out/results.txt"
layers=$("$DLOCO" config --config configs/demo.toml "${common[@]}" model.n_layer)
"$PY" - "$out/runs.txt" "$RTT_MS" "$out" "$DLOCO" "$M" $((B * T)) "$layers" <<'PY' | tee "$out/table.md"
# The table, each shaped point beside `dloco sim bandwidth` for the same model (N from a log), step time (the
# method's unshaped mean: M·B·T / tokens/s), M, H, P, τ and fp32; and the plot (gnuplot), if gnuplot is there.
# The simulator's dp all-reduces bf16 gradients layer by layer behind the backward (the paper's model), dloco's dp
# fp32 after it: expect the measured dp well under the "sim" column (docs/measurements.md). Without a decoupled
# run in METHODS no log names N and the column stays empty (said on stderr).
import collections, glob, json, re, shutil, subprocess, sys
runs_txt, rtt, out, dloco, M, tokens_per_step, layers = sys.argv[1:8]
rows = [line.split() for line in open(runs_txt)]
base = collections.defaultdict(list)
for method, rate, tps in rows:
    if rate == "0":
        base[method].append(float(tps))
if any(not base[m] for m, _, _ in rows):
    sys.exit("RATES needs a 0 (unshaped) run of each method: the reference")

def parameters():  # N, as a syncer or learner log prints it (every run trains the same model; none without decoupled)
    for log in sorted(glob.glob(f"{out}/*.log")):
        found = re.search(r"(\d+) parameters", open(log, errors="replace").read())
        if found:
            return int(found.group(1))
    return None

def predicted(method, rate, step_s, n):  # the simulator's compute utilisation, or "" where it has no model
    if rate == "0" or method.startswith("decoupled") or n is None:
        return ""  # decoupled: a learner never waits, the simulator's "streaming" is the blocking bound
    if method.startswith("diloco"):
        how = ["--method", "diloco", "--inner-steps", method[len("diloco-h"):] if "-h" in method else "12",
               "--fragments", "1", "--overlap-steps", "0"]
    elif method == "streaming":
        how = ["--method", "streaming", "--inner-steps", "12", "--fragments", "12", "--overlap-steps", "2"]
    else:
        how = ["--method", "dp", "--layers", layers]  # bf16 gradients whatever --precision says
    r = subprocess.run([dloco, "sim", "bandwidth", *how, "--params", str(n), "--step-s", f"{step_s:.5f}", "--workers",
                        M, "--precision", "fp32", "--link-gbps", str(float(rate) / 1000)], capture_output=True, text=True)
    try:
        return f"{json.loads(r.stdout.strip().splitlines()[-1])['cu']:.3f}"
    except (ValueError, IndexError, KeyError):
        return "?"

N = parameters()
if N is None:
    print("[wan] no log names the parameter count (it takes a decoupled run): no sim column", file=sys.stderr)
print(f"| method | link, Mbit/s each way (RTT {rtt} ms) | tokens/s | utilisation | sim | syncs | MB sent a learner "
      "| final val loss |")
print("|---|---|---|---|---|---|---|---|")
series = collections.defaultdict(list)
for i, (method, rate, tps) in enumerate(rows):
    ref = sum(base[method]) / len(base[method])
    run = f"{method}-r{rate}-{i}"
    report = json.load(open(f"{out}/{run}/report.json"))
    syncs = report.get("merges", report.get("syncs", ""))  # decoupled: merges of fragments; else all-reduces
    sent = [b["sent"] for who, b in report.get("bytes", {}).items() if who.startswith("learner_")]
    mb = f"{sum(sent) / len(sent) / 1e6:.2f}" if sent else ""  # decoupled: to the syncer (the baselines: not counted)
    util = float(tps) / ref
    sim = predicted(method, rate, int(M) * int(tokens_per_step) / ref, N)
    print(f"| {method} | {'unshaped' if rate == '0' else rate} | {float(tps):.0f} | {util:.3f} | {sim} | {syncs} | "
          f"{mb} | {report['final_val_loss']:.4f} |")
    with open(f"{out}/results.txt", "a") as f:
        f.write(f"{method} {rate} {float(tps):.1f} {util:.4f}\n")
    if rate != "0":
        series[method].append((float(rate), util, sim))

if shutil.which("gnuplot") and series:
    plots = []
    for k, (method, points) in enumerate(sorted(series.items())):
        with open(f"{out}/plot-{method}.dat", "w") as f:
            for rate, util, sim in sorted(points):
                f.write(f"{rate} {util} {sim if sim not in ('', '?') else 'NaN'}\n")
        plots.append(f"'{out}/plot-{method}.dat' using 1:2 with linespoints lw 2 lc {k + 1} title '{method}'")
        if any(sim not in ("", "?") for _, _, sim in points):
            plots.append(f"'{out}/plot-{method}.dat' using 1:3 with lines dt 2 lc {k + 1} title '{method} (sim)'")
    with open(f"{out}/utilisation.gp", "w") as g:
        g.write(f"set terminal pngcairo size 960,600 font 'Sans,11'\nset output '{out}/utilisation.png'\n"
                f"set title 'Utilisation vs link rate, M = {M} sites, RTT {rtt} ms on shaped links (unshaped = 1)'\n"
                "set xlabel 'link, Mbit/s each way'\nset ylabel 'tokens/s over unshaped'\nset logscale x\n"
                "set yrange [0:1.15]\nset grid\nset key outside right\nplot " + ", \\\n  ".join(plots) + "\n")
    subprocess.run(["gnuplot", f"{out}/utilisation.gp"], check=False)
PY
echo "[wan] runs and table in $out ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
