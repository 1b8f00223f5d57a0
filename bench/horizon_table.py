#!/usr/bin/python3
"""The horizon study's table (bench/horizon.sh): final validation loss per mode and M at 1/10, 1/4 and all of
D = 20 N, the gap to dp at the same budget in %, beside "Scaling Laws for DiLoCo" Table 4's 35M row.
Usage: bench/horizon_table.py [NAME=horizon]   (reads runs/<NAME>-budget-1of{10,4,1}/, runs/<NAME>-seed2/ and the
stages pick10, pick4 and pick1: runs/<NAME>-pick{10,4,1}-*/; a variant and seed found twice counts once)"""
import glob
import json
import os
import sys

name = sys.argv[1] if len(sys.argv) > 1 else "horizon"
PAPER = {"dp": 0.0, "diloco-m1": -0.1, "diloco-m2": 0.7, "diloco-m4": 2.0, "diloco-m8": 3.9}  # % vs DP, 35M
ORDER = ["dp", "diloco-m1", "diloco-m2", "diloco-m4", "diloco-m8", "streaming-m4", "decoupled-m4",
         "decoupled-m4-topk", "decoupled-m4-topk16", "decoupled-m4-topk8", "decoupled-m4-q4-h90"]


def losses(*folders):
    """variant -> [final validation loss per seed] over the folders' compare.json (each variant and seed once)"""
    seen, out = set(), {}
    for folder in folders:
        path = os.path.join("runs", folder, "compare.json")
        if not os.path.exists(path):
            continue
        for r in json.load(open(path))["runs"]:
            if r.get("report") and r["report"].get("final_val_loss") is not None \
                    and (r["variant"], r["seed"]) not in seen:
                seen.add((r["variant"], r["seed"]))
                out.setdefault(r["variant"], []).append((r["seed"], r["report"]["final_val_loss"]))
    return {v: [loss for _, loss in sorted(runs)] for v, runs in out.items()}  # in seed order


def picked(budget):
    return sorted(os.path.basename(f) for f in glob.glob(os.path.join("runs", "%s-pick%s-*" % (name, budget))))


budgets = [("1/10", losses(name + "-budget-1of10", *picked(10))), ("1/4", losses(name + "-budget-1of4", *picked(4))),
           ("1", losses(name + "-budget-1of1", name + "-seed2", *picked(1)))]  # the second seed joins the full budget
header = "| mode | " + " | ".join("D%s: loss, vs dp" % b[1:] if b != "1" else "D = 20 N: loss (seeds), vs dp"
                                      for b, _ in budgets) + " | paper, 35M |"
print(header)
print("|" + "---|" * (len(budgets) + 2))
for v in ORDER:
    cells = []
    for _, table in budgets:
        if v not in table:
            cells.append("—")
            continue
        mean = sum(table[v]) / len(table[v])
        dp = table.get("dp")
        gap = "" if not dp or v == "dp" else ", %+.1f%%" % (100 * (mean / (sum(dp) / len(dp)) - 1))
        seeds = " (%s)" % ", ".join("%.4f" % x for x in table[v]) if len(table[v]) > 1 else ""
        cells.append("%.4f%s%s" % (mean, seeds, gap))
    paper = "—" if v not in PAPER else ("3.485" if v == "dp" else "%+.1f%%" % PAPER[v])
    print("| %s | %s | %s |" % (v, " | ".join(cells), paper))
