#!/usr/bin/python3
"""Issue 16's value-level probes, measured: a run of the C++ syncer with two honest C++ learners (ids 0, 1) and the
Python learner (id 2) turned hostile from its step 20 on, one probe per run, beside a clean run. Prints, per probe,
whether the run finished, the final validation loss against the clean run's, and what the syncer refused by kind.
A measurement script (docs/measurements.md), not a ctest: each probe is also a unit or protocol test.

  /usr/bin/python3 tests/python/hostile_probes.py --build-dir build

Probes (each on every answer, or every metadata report, of the hostile learner after its step 20):
  norm1000   its Δ × 1000          huge     every value of its Δ = 3e38     tokens   claims 10^15 tokens
  step1e12   reports step 10^12    step1e6  reports step 10^6   (--probes step1e12: every report of the liar is
             refused, so with fixed shares its stream never trains as far as the syncer knows and the run waits for
             it until it is stopped: the script then waits for its 600 s deadline; ProtocolTest checks these probes)
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROBES = ["clean", "norm1000", "huge", "tokens"]  # step1e12 / step1e6: see the docstring
STEPS = 200
TOKENS_PER_STEP = 8 * 32

# The hostile learner: the Python learner whose link alters what it posts once the probe is armed (step ≥ 20).
HOSTILE = r'''
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import dloco_learner.wire as wire, dloco_learner.learner as learner
probe = sys.argv[2]
state = {"step": 0}
original_post = wire.SyncerLink.post
def post(self, body):
    name = type(body).__name__
    if name == "Metadata":
        state["step"] = body.step
        if state["step"] >= 20 and probe == "step1e12":
            body.step = 10**12
        if state["step"] >= 20 and probe == "step1e6":
            body.step = 10**6
    elif name == "PullAnswer" and state["step"] >= 20 and body.base_version >= 0 and body.dtype == "fp32":
        delta = np.frombuffer(body.delta, dtype="<f4").copy()
        if probe == "norm1000":
            delta *= 1000
        elif probe == "huge":
            delta[:] = 3e38
        elif probe == "tokens":
            body.tokens = 10**15
        body.delta = delta.astype("<f4").tobytes()
    return original_post(self, body)
wire.SyncerLink.post = post
sys.exit(learner.main_entry(type("A", (), dict(config=sys.argv[3], syncer=sys.argv[4], id=2, run_dir=sys.argv[5],
                                                 set=[], insecure=False, bootstrap_timeout=120.0))()))
'''


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--root", default="/tmp/dloco_hostile_probes")
    parser.add_argument("--probes", nargs="*", default=PROBES[1:], help="beside the clean run")
    args = parser.parse_args()
    build = Path(args.build_dir).resolve()
    root = Path(args.root)
    subprocess.run(["rm", "-rf", str(root)], check=True)
    root.mkdir(parents=True)
    (root / "corpus.txt").write_text("".join(
        "And it came to pass on day %d that the word was spoken.\n" % (i % 97) for i in range(6000)))
    tool = str(build / "bin" / "dloco-data")
    subprocess.run([tool, "prepare", str(root / "corpus.txt"), "--out", str(root / "data"), "--vocab-size", "400",
                    "--threads", "1"], check=True, capture_output=True, env=dict(os.environ, DLOCO_DATA_BIN=tool))
    (root / "hostile.py").write_text(HOSTILE)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               XDG_CACHE_HOME=str(build / "python-cache"), DLOCO_SECRET="probe-secret")
    rows = []
    for probe in ["clean"] + args.probes:
        cfg = root / (probe + ".toml")
        cfg.write_text(
            '[model]\npreset = "tiny"\nvocab_size = 400\nd_model = 32\n[data]\ndir = "data"\n'
            '[train]\nbatch_size = 8\ntotal_tokens = %d\nlr = 3e-3\nwarmup_steps = 5\neval_interval = 0\n'
            'eval_tokens = 8192\ncheckpoint_interval = 0\n'
            '[diloco]\nmode = "decoupled"\nlearners = 3\ninner_steps = 4\nfragments = 4\noverlap = 1\nquorum = 2\n'
            '[run]\nname = "%s"\nout_dir = "."\nthreads = 1\nreport_interval_s = 5.0\nlearner_monitor = ""\n'
            % (3 * STEPS * TOKENS_PER_STEP, probe))
        run = root / probe
        run.mkdir()
        dloco = str(build / "bin" / "dloco")
        procs = [subprocess.Popen([dloco, "syncer", "--config", str(cfg), "--run-dir", str(run), "--listen",
                                   "127.0.0.1:0", "--address-file", str(run / "addr")],
                                  stdout=open(run / "syncer.log", "w"), stderr=subprocess.STDOUT, env=env)]
        deadline = time.monotonic() + 60
        while not (run / "addr").exists() or not (run / "addr").read_text().strip():
            if time.monotonic() > deadline:
                sys.exit("the syncer did not start: " + (run / "syncer.log").read_text())
            time.sleep(0.1)
        address = (run / "addr").read_text().strip()
        for i in (0, 1):
            procs.append(subprocess.Popen([dloco, "learner", "--config", str(cfg), "--syncer", address, "--id", str(i),
                                           "--run-dir", str(run)], stdout=open(run / ("learner_%d.log" % i), "w"),
                                          stderr=subprocess.STDOUT, env=env))
        procs.append(subprocess.Popen([sys.executable, str(root / "hostile.py"), str(REPO / "python"), probe,
                                       str(cfg), address, str(run)], stdout=open(run / "hostile.log", "w"),
                                      stderr=subprocess.STDOUT, env=env))
        started = time.monotonic()
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=600))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("hang")
        report = json.loads((run / "report.json").read_text()) if (run / "report.json").exists() else {}
        screening = report.get("screening", {})
        final = [json.loads(l) for l in (run / "events" / "syncer.jsonl").read_text().splitlines()
                 if '"final_state"' in l] if (run / "events" / "syncer.jsonl").exists() else []
        rows.append({"probe": probe, "syncer_exit": codes[0], "status": report.get("status"),
                     "final_val_loss": report.get("final_val_loss"), "global_step": report.get("global_step"),
                     "refused": {k: v for k, v in screening.get("answers_refused_by_kind", {}).items() if v},
                     "reports_refused": screening.get("reports_refused"), "merges_dropped": screening.get("merges_dropped"),
                     "wall_s": round(time.monotonic() - started, 1), "exit_codes": codes})
        print(json.dumps(rows[-1]), flush=True)
    clean = rows[0]["final_val_loss"]
    print("\n| probe | syncer | final val loss (clean %.4f) | refused by the syncer |" % clean)
    print("|---|---|---|---|")
    for r in rows:
        refused = ", ".join("%s %d" % kv for kv in r["refused"].items())
        if r["reports_refused"]:
            refused += (", " if refused else "") + "reports %d" % r["reports_refused"]
        print("| %s | %s, exit %s | %s | %s |" % (r["probe"], r["status"], r["syncer_exit"],
                                                 "%.4f" % r["final_val_loss"] if r["final_val_loss"] is not None
                                                 else "-", refused or "nothing"))


if __name__ == "__main__":
    main()
