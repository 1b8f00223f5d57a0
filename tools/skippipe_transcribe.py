#!/usr/bin/env python3
"""Transcribes the SkipPipe reference setting and its four stored schedules into configs/skippipe/*.json.

An authoring tool, run once by hand; dloco never runs Python. It reads the figures of the public reference
code gensyn-ai/skippipe (commit 7f20d8a67d62bcc959aad57dcd846a5cddcc3fe1) and writes them in dloco's setting
and schedule formats (src/skippipe/setting.h, src/skippipe/schedule.h). It does not simulate anything: the
stored times are copied from schedule.json, and tests/skippipe/reference_replay_test.cc checks that dloco's
simulator reproduces them.

Usage: tools/skippipe_transcribe.py REPO_CHECKOUT_DIR OUT_DIR
  REPO_CHECKOUT_DIR holds schedule.json and schedulers/communication_costs.py of the reference.
"""
import ast
import json
import os
import sys

COMMIT = "7f20d8a67d62bcc959aad57dcd846a5cddcc3fe1"
REPO = "gensyn-ai/skippipe"

# From create_schedule.py and the spec (../shared/spec/skippipe.md): 0.055 s per layer per sample
# (COMPUTATIONAL_COST), 4 layers per stage, 2 samples per micro-batch -> w = 0.44 s. The stored delays matrix
# implies 33,554,648 bytes per hop (checked below against schedule.json's "delays", bit for bit).
FORWARD_S = 0.055 * 4 * 2
BYTES_PER_HOP = 33554648
HOP_OVERHEAD_S = 0.35  # create_schedule.py adds 0.13 + 0.2 + 0.02 ("cpu to gpu communication")
MEMORY = 3
GIB = 1024 ** 3


def read_delay_bandwidths(path):
    """DELAY_BANDWIDTHS from communication_costs.py, read as a literal (nothing of the file is executed)."""
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "DELAY_BANDWIDTHS":
            return ast.literal_eval(node.value)
    raise SystemExit("DELAY_BANDWIDTHS not found in " + path)


def setting(stored, table):
    regions = []
    for loc in stored["locations"]:
        if loc not in regions:
            regions.append(loc)
    links = []
    for pair, (rtt_ms, gib_s) in table.items():
        a, b = pair.split("-")
        links.append({"regions": [a, b], "latency_s": rtt_ms / 1000, "bandwidth_bytes_per_s": gib_s * GIB})
    return {
        "format": "dloco-skippipe-setting",
        "version": 1,
        "source": f"{REPO}@{COMMIT}: schedulers/communication_costs.py (DELAY_BANDWIDTHS: RTT ms -> latency_s = "
                  "RTT/1000, as the reference charges the whole RTT per hop; GB/s with GB = 2^30 B -> bytes/s; "
                  "COMPUTATIONAL_COST 0.055 s/layer/sample), create_schedule.py (4 layers x 2 samples per "
                  "micro-batch, +0.13+0.2+0.02 s per hop, memory 3), schedule.json (node locations)",
        "notes": [
            "A pair of nodes in one region, or a pair missing from the table, uses default_link (the reference's "
            "(1 ms, 2 GB/s)).",
            "NL-London is transcribed verbatim: 0.00023681640625 GB/s (254,279 B/s, a hop of ~132 s), 1000x below "
            "every other European pair, almost certainly a typo in the source. Kept as published so this file is "
            "the reference's table; none of the four stored schedules uses an NL-London hop (nodes 6 and 18 are "
            "NL, node 10 is London), so the four times do not depend on it (a test replays them with the link set "
            "to 0.2425 GB/s). A scheduler must treat the link as forbidden, not as a real figure.",
            "bytes_per_hop 33,554,648 reproduces schedule.json's delays matrix bit for bit; the single "
            "hop_overhead_s 0.35 differs from the reference's 0.13+0.2+0.02 by at most one ulp per hop and "
            "leaves the four stored times unchanged to the last digit.",
        ],
        "regions": regions,
        "nodes": [{"region": loc, "forward_s": FORWARD_S} for loc in stored["locations"]],
        "links": links,
        "default_link": {"latency_s": 1 / 1000, "bandwidth_bytes_per_s": 2.0 * GIB},
        "hop_overhead_s": HOP_OVERHEAD_S,
        "bytes_per_hop": BYTES_PER_HOP,
        "memory_capacity": MEMORY,
        "backward_factor": 1.5,
        "head_factor": 0.25,
    }


def check_delays(s, stored):
    """Our hop costs against the reference's stored delays matrix (create_schedule.py's cost_matrix)."""
    table = {}
    for link in s["links"]:
        a, b = link["regions"]
        table[(a, b)] = table[(b, a)] = link
    locs = stored["locations"]
    worst = 0.0
    for x, lx in enumerate(locs):
        for y, ly in enumerate(locs):
            if x == y:
                continue
            link = table.get((lx, ly), s["default_link"])
            ours = link["latency_s"] + BYTES_PER_HOP / link["bandwidth_bytes_per_s"] + HOP_OVERHEAD_S
            worst = max(worst, abs(ours - stored["delays"][x][y]))
    if worst > 1e-12:
        raise SystemExit(f"hop costs differ from the stored delays matrix by {worst}")


def chain(path_dict):
    """A stored path {from: to, ...} as the list of nodes after the data node, in order."""
    nxt = {int(k): v for k, v in path_dict.items()}
    start = next(k for k in nxt if k not in nxt.values())
    nodes, cur = [], start
    while cur in nxt:
        cur = nxt[cur]
        nodes.append(cur)
    return start, nodes


def schedule(method, description, stored_time, placement, micro_batches):
    return {
        "format": "dloco-skippipe-schedule",
        "version": 1,
        "source": f"{REPO}@{COMMIT}: schedule.json (partitions, paths, stored time) and create_schedule.py "
                  "(micro-batch ids and injection times, in the reference's injection order)",
        "method": method,
        "description": description,
        "reference_iteration_time_s": stored_time,
        "placement": placement,
        "micro_batches": micro_batches,
    }


def dump(obj, path):
    """One key per line; a list of objects or lists one element per line (a diff shows which entry changed)."""
    lines = []
    for i, (key, value) in enumerate(obj.items()):
        comma = "," if i + 1 < len(obj) else ""
        if isinstance(value, list) and value and isinstance(value[0], (dict, list, str)):
            items = [json.dumps(v) for v in value]
            lines.append(f' "{key}": [\n  ' + ",\n  ".join(items) + "\n ]" + comma)
        else:
            lines.append(f' "{key}": {json.dumps(value)}{comma}')
    with open(path, "w") as f:
        f.write("{\n" + "\n".join(lines) + "\n}\n")


def main():
    repo, out = sys.argv[1], sys.argv[2]
    stored = json.load(open(os.path.join(repo, "schedule.json")))
    table = read_delay_bandwidths(os.path.join(repo, "schedulers", "communication_costs.py"))
    s = setting(stored, table)
    check_delays(s, stored)
    parts = stored["partitions"]
    os.makedirs(out, exist_ok=True)
    dump(s, os.path.join(out, "reference_setting.json"))

    # Full pipeline (DT-FM): data nodes 0..2 of stage 0 each drive one pipeline through node `num` of every
    # stage; 3 x 3 micro-batches per data node, id 100d + 3k + 9num, injected at d * 0.1 s.
    mbs = []
    for num, data_node in enumerate(parts[0][:len(parts[1])]):
        path = [parts[p][num] for p in range(1, len(parts))]
        for k in range(3):
            for d in range(3):
                mbs.append({"id": 100 * d + 3 * k + 9 * num, "data_node": data_node, "path": path,
                            "inject_s": d * 0.1})
    files = [("full_pipeline.json", schedule(
        "dtfm", "full pipeline on DT-FM's placement: 27 micro-batches (3 pipelines x 9), two data nodes idle",
        stored["baseline-expected-time"], parts, mbs))]

    # SkipPipe (collision aware, coarsened): 5 agents, one per data node; 3 x 2 micro-batches per agent,
    # id 100d + 10mb + agent, injected at d * 2.5 + mb * 1.
    mbs = []
    for agent, p in stored["ca-paths"].items():
        start, path = chain(p)
        assert start == parts[0][int(agent)]
        for mb_c in range(3):
            for d in range(2):
                mbs.append({"id": d * 100 + mb_c * 10 + int(agent), "data_node": start, "path": path,
                            "inject_s": d * 2.5 + mb_c * 1 + 0})
    files.append(("skippipe.json", schedule(
        "skippipe", "SkipPipe (collision-aware CBS, coarsened: one agent = 3 x 2 micro-batches), 30 micro-batches",
        stored["ca-expected-time"], parts, mbs)))

    # Without collision awareness, and network-oblivious (DT-FM-skip): 15 agents, 3 per data node; 2 micro-batches
    # per agent, id 100d + agent, injected at d * 2.5 + k * w (k = agent's slot at its data node).
    for key, tkey, fname, method, desc in [
            ("non-ca-paths", "nonca-expected-time", "skippipe_no_collision.json", "skippipe-no-ca",
             "SkipPipe without collision awareness (CBS without the overlap constraint), 30 micro-batches"),
            ("random-paths", "random-expected-time", "dtfm_skip.json", "dtfm-skip",
             "network-oblivious skipping on DT-FM's placement (CBS on a unit-cost graph), 30 micro-batches")]:
        mbs = []
        for agent, p in stored[key].items():
            start, path = chain(p)
            assert start == parts[0][int(agent) // 3]
            for d in range(2):
                mbs.append({"id": d * 100 + int(agent), "data_node": start, "path": path,
                            "inject_s": d * 2.5 + (int(agent) % 3) * FORWARD_S})
        files.append((fname, schedule(method, desc, stored[tkey], parts, mbs)))

    for fname, sched in files:
        dump(sched, os.path.join(out, fname))
        print("wrote", os.path.join(out, fname), len(sched["micro_batches"]), "micro-batches")


if __name__ == "__main__":
    main()
