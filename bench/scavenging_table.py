#!/usr/bin/python3
"""The table of bench/scavenging.sh: scavenging_table.py OUT EXTRA… (Markdown on stdout, results.json in OUT).

Per run OUT/extra-<n>/faulted: the evaluator's (wall-clock, validation loss) pairs, t = 0 at the first learner step,
each loss the mean of it and its two neighbours (the evaluations are noisy). The target is the 4-learner run's
smoothed loss at 3/4 of its time (linear between evaluations); each run's time to the target is the first crossing,
linear between the evaluations around it; relative = that time / the 4-learner run's. Beside it: the final loss,
the wall seconds to the end of training, the kept-work goodput (chaos.json) and the median emulated step of learners
0–3 (CPU contention stretches it).
"""
import json
import os
import sys

PAPER = {1: "0.90 / 1.07", 2: "0.83 / 1.09", 4: "0.75 / 1.02", 12: "0.62 / 0.80"}  # +25/50/100/300% compute


def events(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def curve(run):
    """[(seconds since the first learner step, tokens merged, val loss)] of the evaluator, and that first step's t."""
    starts = []
    for name in os.listdir(os.path.join(run, "events")):
        if name.startswith("learner_"):
            steps = [e for e in events(os.path.join(run, "events", name)) if e.get("event") == "step"]
            if steps:
                starts.append(steps[0]["t"] - steps[0].get("step_s", 0) - steps[0].get("sleep_s", 0))
    t0 = min(starts)
    pts = []
    for e in events(os.path.join(run, "events", "evaluator.jsonl")):
        if e.get("event") == "eval" and e.get("val_loss") is not None:
            pts.append((e["t"] - t0, e.get("tokens", e.get("global_step", 0)), e["val_loss"]))
    pts.sort()
    smooth = [(t, k, sum(p[2] for p in pts[max(0, i - 1):i + 2]) / len(pts[max(0, i - 1):i + 2]))
              for i, (t, k, _) in enumerate(pts)]
    return smooth, t0


def median_step_s(run):
    """The median emulated step (compute + the chip's sleep) of learners 0–3: CPU contention stretches it."""
    xs = []
    for i in range(4):
        for e in events(os.path.join(run, "events", f"learner_{i}.jsonl")):
            if e.get("event") == "step":
                xs.append(e.get("step_s", 0) + e.get("sleep_s", 0))
    xs.sort()
    return xs[len(xs) // 2] if xs else None


def first_crossing(pts, target):
    for (ta, _, la), (tb, _, lb) in zip(pts, pts[1:]):
        if lb <= target:
            if la <= target:
                return ta
            return ta + (tb - ta) * (la - target) / (la - lb)
    return pts[0][0] if pts and pts[0][2] <= target else None


def main():
    out, extras = sys.argv[1], [int(x) for x in sys.argv[2:]]
    runs = {e: os.path.join(out, f"extra-{e}", "faulted") for e in extras}
    curves = {e: curve(r)[0] for e, r in runs.items()}
    base = curves[0]
    # the target: the reference's loss at 3/4 of its evaluations' span in time (its tokens grow linearly in time)
    t_target = 0.75 * base[-1][0]
    target = None
    for (ta, _, la), (tb, _, lb) in zip(base, base[1:]):
        if ta <= t_target <= tb:
            target = la + (lb - la) * (t_target - ta) / (tb - ta)
    rows = {}
    for e in extras:
        report = json.load(open(os.path.join(runs[e], "report.json")))
        chaos_path = os.path.join(out, f"extra-{e}", "chaos.json")
        chaos = json.load(open(chaos_path)) if os.path.exists(chaos_path) else {}
        rows[e] = {"time_to_target_s": first_crossing(curves[e], target), "final_val_loss": report.get("final_val_loss"),
                   "wall_s": report.get("wall_seconds"),
                   "goodput": chaos["runs"][0]["analysis"]["goodput"] if chaos else None, "evals": len(curves[e]),
                   "step_s": median_step_s(runs[e])}
    ref = rows[0]["time_to_target_s"]
    for r in rows.values():
        r["relative"] = r["time_to_target_s"] / ref if r["time_to_target_s"] is not None and ref else None
    json.dump({"target": target, "rows": rows}, open(os.path.join(out, "results.json"), "w"), indent=1)
    fmt = lambda x, f: "—" if x is None else f.format(x)
    print(f"Target validation loss {target:.4f} (the 4-learner run's at 3/4 of its time).\n")
    print("| extra learners (compute) | time to target s | relative | paper Decoupled / DP | final val loss | wall s "
          "| kept-work goodput | step s of learners 0–3 |")
    print("|---|---|---|---|---|---|---|---|")
    for e, r in rows.items():
        print(f"| +{e} (+{100 * e // 4}%) | {fmt(r['time_to_target_s'], '{:.1f}')} | {fmt(r['relative'], '{:.2f}')} "
              f"| {PAPER.get(e, '—')} | {fmt(r['final_val_loss'], '{:.4f}')} | {fmt(r['wall_s'], '{:.0f}')} "
              f"| {fmt(r['goodput'], '{:.3f}')} | {fmt(r['step_s'], '{:.3f}')} |")


if __name__ == "__main__":
    main()
