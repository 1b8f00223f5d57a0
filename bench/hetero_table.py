#!/usr/bin/python3
"""The table of bench/hetero.sh: hetero_table.py OUT VARIANT… (Markdown on stdout, results.json in OUT).

Per variant, from its run folder (OUT/<v>/faulted for the decoupled variants run through `dloco chaos`, OUT/<v> for
DiLoCo): the final validation loss and wall seconds (report.json), tokens/s, busy — Σ over learners (workers) of the
time in their steps (compute plus the emulated chip's sleep; a DiLoCo worker's outer all-reduce, its wait_s, comes
after its step_s and is not in it) over Σ of the span from their first step's start to their last step's end —, the kept-work goodput (chaos.json; decoupled only), merges
and mean learners per merge (events/syncer.jsonl "merged"), and the steps of learners 0–3 (fast) and 4–7 (slow).
"""
import json
import os
import sys


def events(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line cut off by a kill
    return out


def busy_of(run, role, ids):
    """Σ step time (compute plus sleep) / Σ span over learners (workers) `ids`, and their steps."""
    in_steps = span = 0.0
    steps = {}
    for i in ids:
        ev = [e for e in events(os.path.join(run, "events", f"{role}_{i}.jsonl")) if e.get("event") == "step"]
        if not ev:
            continue
        steps[i] = len(ev)
        first = ev[0]
        start = first["t"] - first.get("step_s", 0) - first.get("sleep_s", 0)
        span += ev[-1]["t"] - start
        for e in ev:
            in_steps += e.get("step_s", 0) + e.get("sleep_s", 0)
    return (in_steps / span if span > 0 else float("nan")), steps


def main():
    out, variants = sys.argv[1], sys.argv[2:]
    rows = {}
    for v in variants:
        chaos = os.path.join(out, v, "chaos.json")
        run = os.path.join(out, v, "faulted") if os.path.exists(chaos) else os.path.join(out, v)
        report = json.load(open(os.path.join(run, "report.json")))
        role = "learner" if os.path.exists(chaos) else "worker"
        busy, steps = busy_of(run, role, range(8))
        busy_fast, _ = busy_of(run, role, range(4))
        busy_slow, _ = busy_of(run, role, range(4, 8))
        merges = [e for e in events(os.path.join(run, "events", "syncer.jsonl")) if e.get("event") == "merged"]
        row = {
            "val_loss": report.get("final_val_loss"),
            "wall_s": report.get("wall_seconds"),
            "tokens_per_s": report.get("tokens_per_second"),
            "busy": busy,
            "busy_fast": busy_fast,
            "busy_slow": busy_slow,
            "steps_fast": sum(n for i, n in steps.items() if i < 4),
            "steps_slow": sum(n for i, n in steps.items() if 4 <= i < 8),
            "merges": len(merges),
            "learners_per_merge": (sum(len(e["participants"]) for e in merges) / len(merges)) if merges else None,
            "goodput": json.load(open(chaos))["runs"][0]["analysis"]["goodput"] if os.path.exists(chaos) else None,
        }
        rows[v] = row
    json.dump(rows, open(os.path.join(out, "results.json"), "w"), indent=1)
    fmt = lambda x, f: "—" if x is None else f.format(x)
    print("| variant | final val loss | wall s | tokens/s | busy (fast / slow half) | kept-work goodput | merges "
          "| learners per merge | steps fast / slow half |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v, r in rows.items():
        print(f"| {v} | {fmt(r['val_loss'], '{:.4f}')} | {fmt(r['wall_s'], '{:.0f}')} | {fmt(r['tokens_per_s'], '{:.0f}')} "
              f"| {fmt(r['busy'], '{:.3f}')} ({fmt(r['busy_fast'], '{:.3f}')} / {fmt(r['busy_slow'], '{:.3f}')}) "
              f"| {fmt(r['goodput'], '{:.3f}')} | {r['merges'] or '—'} "
              f"| {fmt(r['learners_per_merge'], '{:.2f}')} | {r['steps_fast']} / {r['steps_slow']} |")


if __name__ == "__main__":
    main()
