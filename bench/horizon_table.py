#!/usr/bin/python3
"""The horizon study's table (bench/horizon.sh): final validation loss per mode and M at 1/10, 1/4 and all of
D = 20 N, the gap to dp at the same budget in %, beside "Scaling Laws for DiLoCo" Table 4's 35M row.
Usage: bench/horizon_table.py [NAME=horizon]   (reads runs/<NAME>-budget-1of{10,4,1}/ and runs/<NAME>-seed2/)"""
import json
import os
import sys

name = sys.argv[1] if len(sys.argv) > 1 else "horizon"
PAPER = {"dp": 0.0, "diloco-m1": -0.1, "diloco-m2": 0.7, "diloco-m4": 2.0, "diloco-m8": 3.9}  # % vs DP, 35M
ORDER = ["dp", "diloco-m1", "diloco-m2", "diloco-m4", "diloco-m8", "streaming-m4", "decoupled-m4",
         "decoupled-m4-topk"]


def losses(folder):
    """variant -> [final validation loss per seed]"""
    path = os.path.join("runs", folder, "compare.json")
    if not os.path.exists(path):
        return {}
    out = {}
    for r in json.load(open(path))["runs"]:
        if r.get("report") and r["report"].get("final_val_loss") is not None:
            out.setdefault(r["variant"], []).append(r["report"]["final_val_loss"])
    return out


budgets = [("1/10", losses(name + "-budget-1of10")), ("1/4", losses(name + "-budget-1of4")),
           ("1", losses(name + "-budget-1of1"))]
for variant, values in losses(name + "-seed2").items():  # the second seed joins the full budget
    budgets[2][1].setdefault(variant, []).extend(values)
header = "| mode | " + " | ".join("D/%s: loss, vs dp" % b if b != "1" else "D = 20 N: loss (seeds), vs dp"
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
