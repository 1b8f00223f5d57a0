#!/usr/bin/python3
"""The Python learner (python/dloco_learner, issue 16 part 5) in a run of the C++ syncer beside a C++ learner, over
loopback with the run secret as a bearer token. For each scenario it starts `dloco syncer`, the Python learner (id 1)
and `dloco learner` (id 0) on a tiny model and tiny corpus, waits for the run to end, and checks:
  - the Python learner joined (the syncer's learner_joined, its own bootstrapped) and trained its whole share;
  - its answers were merged: the syncer's merges during training name it (quorum K = M = 2, so every merge waits for
    both learners whatever their speeds), and its own log has the matching `kept` events;
  - none of its answers or reports (nor the C++ learner's) was refused;
  - at the end both learners hold the syncer's final Θ: the versions and FNV-1a hashes of their `stopped` events
    equal the syncer's `final_state`, and that Θ beats a unigram model of the corpus on the validation split;
  - (fp32) a Python learner with another train.lr or another secret is refused with the reason and exits 2.
Scenarios: fp32 both ways, and the compressed wire (q4 up, q8 down with base_version/base_hash, error feedback).

Runs are sized in steps (150 per learner), never in seconds: the deadlines below only stop a hang. Under
DLOCO_TEST_SLOWDOWN=F every learner is F times slower (run.slowdown, as tests/support/tiny_corpus.h does).
DLOCO_KEEP_TEST_RUNS=1 keeps the run folders. Usage: python_learner_test.py --build-dir BUILD [unittest args].
"""
import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = None  # set in main
STEPS = 150          # per learner: 150 × B·T = 150 × 256 tokens each
TOKENS_PER_STEP = 8 * 32
SECRET = "python-test-secret"
PY_ID, CPP_ID = 1, 0


def test_slowdown():
    try:
        f = float(os.environ.get("DLOCO_TEST_SLOWDOWN", "1"))
    except ValueError:
        return 1.0
    return f if math.isfinite(f) and f >= 1 else 1.0


def read_events(path):
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Run:
    """One run folder with its processes; every process is killed when the test ends, whatever happened."""

    def __init__(self, root, name):
        self.root, self.name = root, name
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.procs = []

    def spawn(self, args, log, env=None):
        with open(self.dir / log, "w") as out:
            p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def log(self, name):
        path = self.dir / name
        return path.read_text() if path.exists() else ""


def python_env():
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               XDG_CACHE_HOME=str(Path(BUILD) / "python-cache"))  # the generated gRPC stubs
    env.pop("DLOCO_SECRET", None)
    return env


class PythonLearnerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="dloco_python_learner_"))
        (cls.root / "corpus.txt").write_text("".join(
            "And it came to pass on day %d that the word was spoken.\n" % (i % 97) for i in range(6000)))
        tool = str(Path(BUILD) / "bin" / "dloco-data")
        r = subprocess.run([tool, "prepare", str(cls.root / "corpus.txt"), "--out", str(cls.root / "data"),
                            "--vocab-size", "400", "--threads", "1"], capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, DLOCO_DATA_BIN=tool))
        assert r.returncode == 0, "dloco-data prepare failed: " + r.stdout + r.stderr

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("DLOCO_KEEP_TEST_RUNS"):
            shutil.rmtree(cls.root, ignore_errors=True)
        else:
            print("run folders kept in", cls.root)

    def write_config(self, name, diloco_extra=""):
        """A tiny decoupled run: M = 2 learners, K = 2, P = 4 fragments, H = 4, τ = 1, each learner STEPS steps."""
        f = test_slowdown()
        slowdown = 'slowdown = "0:%s,1:%s"\n' % (f, f) if f > 1 else ""
        path = self.root / (name + ".toml")
        path.write_text(
            '[model]\npreset = "tiny"\nvocab_size = 400\nd_model = 32\n'
            '[data]\ndir = "data"\n'
            '[train]\nbatch_size = 8\ntotal_tokens = %d\nlr = 3e-3\nwarmup_steps = 5\neval_interval = 0\n'
            'eval_tokens = 4096\ncheckpoint_interval = 0\n'
            '[diloco]\nmode = "decoupled"\nlearners = 2\ninner_steps = 4\nfragments = 4\noverlap = 1\nquorum = 2\n%s'
            '[run]\nname = "%s"\nout_dir = "."\nthreads = 1\nreport_interval_s = 1.0\nsecret = "%s"\n'
            'learner_monitor = ""\n%s' % (2 * STEPS * TOKENS_PER_STEP, diloco_extra, name, SECRET, slowdown))
        return path

    def start_syncer(self, run, cfg):
        dloco = str(Path(BUILD) / "bin" / "dloco")
        syncer = run.spawn([dloco, "syncer", "--config", str(cfg), "--run-dir", str(run.dir), "--listen",
                            "127.0.0.1:0", "--address-file", str(run.dir / "addr")], "syncer.log")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and syncer.poll() is None:
            address = (run.dir / "addr").read_text().strip() if (run.dir / "addr").exists() else ""
            if address:
                return syncer, address
            time.sleep(0.1)
        self.fail("the syncer did not start: " + run.log("syncer.log"))

    def python_learner(self, run, cfg, address, log, extra=()):
        return run.spawn([sys.executable, "-m", "dloco_learner", "--config", str(cfg), "--syncer", address, "--id",
                          str(PY_ID), "--run-dir", str(run.dir), *extra], log, env=python_env())

    def wait(self, run, proc, what, timeout_s):
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            run.kill_all()
            self.fail("%s did not end within %.0f s (a hang); logs in %s" % (what, timeout_s, run.dir))

    def wait_all(self, run, procs, timeout_s):
        """The exit codes of `procs` once all have ended, or as soon as one fails (the others would wait for it: the
        syncer ends the run only when every stream has trained)."""
        deadline, codes = time.monotonic() + timeout_s, {}
        while len(codes) < len(procs):
            for what, p in procs.items():
                if what not in codes and p.poll() is not None:
                    codes[what] = p.returncode
                    if p.returncode != 0:
                        return codes
            if time.monotonic() > deadline:
                run.kill_all()
                self.fail("%s did not end within %.0f s (a hang); logs in %s"
                          % (", ".join(w for w in procs if w not in codes), timeout_s, run.dir))
            time.sleep(0.05)
        return codes

    def run_scenario(self, name, diloco_extra="", probe_refusals=False):
        cfg = self.write_config(name, diloco_extra)
        run = Run(self.root, name)
        try:
            started = time.monotonic()
            syncer, address = self.start_syncer(run, cfg)
            hang = 300 * test_slowdown()  # a deadline against hangs only: the run takes seconds
            if probe_refusals:
                # Learners that must be refused, before the run starts: another inner lr (the handshake names the
                # field) and another secret (the one answer of docs/protocol.md §12). They lease nothing.
                probes = {what: self.python_learner(run, cfg, address, log, overrides) for what, log, overrides in
                          [("lr", "refused_lr.log", ["--set", "train.lr=0.3"]),
                           ("secret", "refused_secret.log", ["--set", "run.secret=guess"])]}
                # A refusal takes the Python start-up and one call; a probe that was let in would train and wait for
                # the run's end instead, so it gets a deadline of its own (generous: a hang, not a speed, fails it).
                probe_codes = {what: self.wait(run, p, "the learner with another " + what, 60 * test_slowdown())
                               for what, p in probes.items()}
            py = self.python_learner(run, cfg, address, "learner_python.log")
            cpp = run.spawn([str(Path(BUILD) / "bin" / "dloco"), "learner", "--config", str(cfg), "--syncer", address,
                             "--id", str(CPP_ID), "--run-dir", str(run.dir)], "learner_cpp.log",
                            env=dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1"))
            codes = self.wait_all(run, {"the syncer": syncer, "the Python learner": py, "the C++ learner": cpp}, hang)
            wall = time.monotonic() - started
        finally:
            run.kill_all()
        logs = "; logs in %s" % run.dir
        self.assertEqual(codes.get("the Python learner"), 0, run.log("learner_python.log")[-3000:] + logs)
        self.assertEqual(codes.get("the C++ learner"), 0, run.log("learner_cpp.log")[-2000:] + logs)
        self.assertEqual(codes.get("the syncer"), 0, run.log("syncer.log")[-2000:] + logs)
        if probe_refusals:
            self.assertEqual(probe_codes["lr"], 2, run.log("refused_lr.log"))
            self.assertIn("train.lr = 0.3 (expected 0.003)", run.log("refused_lr.log"))
            self.assertEqual(probe_codes["secret"], 2, run.log("refused_secret.log"))
            self.assertIn("not authenticated", run.log("refused_secret.log"))
        return run, wall

    def check_run(self, run, wall):
        syncer = read_events(run.dir / "events" / "syncer.jsonl")
        py = read_events(run.dir / "events" / ("learner_%d.jsonl" % PY_ID))
        cpp = read_events(run.dir / "events" / ("learner_%d.jsonl" % CPP_ID))
        where = " (run folder %s)" % run.dir
        # It joined, bootstrapped and trained its whole share of the budget.
        self.assertTrue(any(e["event"] == "learner_joined" and e["learner"] == PY_ID for e in syncer), where)
        self.assertTrue(any(e["event"] == "bootstrapped" for e in py), where)
        steps = [e for e in py if e["event"] == "step"]
        self.assertEqual(len(steps), STEPS, where)
        self.assertEqual(steps[-1]["tokens"], STEPS * TOKENS_PER_STEP, where)
        # Its answers were merged during training (before the final flush, which merges every live learner).
        flushing, merged_with_it, merges = False, 0, 0
        for e in syncer:
            flushing |= e["event"] == "final_flush"
            if e["event"] == "merged":
                merges += 1
                merged_with_it += not flushing and PY_ID in e["participants"]
        kept = sum(e["event"] == "kept" for e in py)
        self.assertGreaterEqual(merged_with_it, 8, "too few merges took the Python learner's answers" + where)
        self.assertGreaterEqual(kept, merged_with_it, where)
        # Nothing it sent was refused (answers or reports; of either learner). An answer against the version before the
        # syncer's latest (a merge that arrived after s + τ with the next pull) used to be screened rebased onto
        # Θ_latest, carrying the syncer's own outer step, and was refused at 10–916× the median: this test found it,
        # and the syncer now screens a learner's own Δ (docs/protocol.md §10).
        answered = {(e["fragment"], e["round"]): e for e in py if e["event"] == "answered"}
        refused = [e for e in syncer if e["event"] in ("answer_refused", "report_refused")]
        self.assertEqual(refused, [], "an honest learner was refused" + where)
        # Every learner's final copy is the syncer's final Θ.
        final = [e for e in syncer if e["event"] == "final_state"]
        self.assertEqual(len(final), 1, where)
        for who, log in (("Python", py), ("C++", cpp)):
            stopped = [e for e in log if e["event"] == "stopped"]
            self.assertEqual(len(stopped), 1, who + where)
            self.assertFalse(stopped[0]["leaving"], who + where)
            self.assertEqual(stopped[0]["versions"], final[0]["versions"], who + where)
            self.assertEqual(stopped[0]["hashes"], final[0]["hashes"], who + where)
        self.check_config_mirror(run)
        report = json.loads((run.dir / "report.json").read_text())
        self.assertEqual(report["status"], "finished", where)
        # The global model learned more than token frequencies (runs here end near 0.3 against 3.05): a learner
        # whose answers pull the wrong way (a flipped Δ ended at 171 nats/token) fails this.
        unigram = json.loads((self.root / "data" / "meta.json").read_text())["unigram_val_nats_per_token"]
        self.assertLess(report["final_val_loss"], unigram, "the global model is worse than a unigram model" + where)
        print("[%s] %.1f s: %d merges, %d during training took the Python learner's answers (%d kept events, "
              "%d answers, none refused); its final training loss "
              "%.4f; final validation loss %.4f; final versions %s"
              % (run.name, wall, merges, merged_with_it, kept, len(answered),
                 [e for e in py if e["event"] == "stopped"][0]["loss"], report["final_val_loss"], final[0]["versions"]),
              flush=True)

    def check_config_mirror(self, run):
        """The Python learner's copy of the config fields (python/dloco_learner/config.py) is the C++ one: the resolved
        config of the syncer's checkpoint (every field, C++ types) has the same shared settings, with the same types and
        values, as the Python reader's, so a field added on one side fails here with its name (the
        handshake would refuse the learner too, with less to go on)."""
        sys.path.insert(0, str(REPO / "python"))
        from dloco_learner import config as py_config, handshake as py_handshake
        manifest = json.loads(sorted((run.dir / "checkpoints").glob("step_*/manifest.json"))[-1].read_text())
        theirs = manifest["config"]
        ours = py_config.load_config(self.root / (run.name + ".toml"))
        for section in ("model", "data", "train", "diloco", "run"):
            only_cpp = sorted(set(theirs[section]) - set(ours[section]))
            only_python = sorted(set(ours[section]) - set(theirs[section]))
            self.assertEqual((only_cpp, only_python), ([], []), "[%s] fields only in C++ / only in Python" % section)
        # Every shared setting with the C++ field's JSON type (a double prints as 10.0, an integer as 10) and value.
        json_kind = {bool: "bool", int: "int", float: "double", str: "string"}
        cpp = [(name, json_kind[type(theirs[name.split(".")[0]][name.split(".")[1]])],
                theirs[name.split(".")[0]][name.split(".")[1]]) for name, _, _ in py_handshake.settings(ours)]
        self.assertEqual(py_handshake.settings(ours), cpp)
        from dloco_learner.layout import make_layout
        from dloco_learner.model import GPT
        specs = [(n, tuple(p.shape)) for n, p in GPT(ours["model"]).named_parameters()]
        self.assertEqual(manifest["layout_hash"], make_layout(specs, ours["diloco"]["fragments"]).hash)
        self.assertEqual(manifest["tokenizer"]["hash"], py_handshake.tokenizer_hash(ours))

    def test_fp32_wire(self):
        run, wall = self.run_scenario("fp32", probe_refusals=True)
        self.check_run(run, wall)

    def test_compressed_wire(self):
        run, wall = self.run_scenario("compressed", 'wire_up = "q4"\nwire_down = "q8"\nerror_feedback = true\n')
        self.check_run(run, wall)
        applied = [e for e in read_events(run.dir / "events" / ("learner_%d.jsonl" % PY_ID)) if e["event"] == "applied"]
        self.assertTrue(any(e["from"] == "update" for e in applied), "no merge arrived as a q8 update")


def main():
    global BUILD
    parser = argparse.ArgumentParser()
    parser.add_argument("--build-dir", required=True)
    args, rest = parser.parse_known_args()
    BUILD = os.path.abspath(args.build_dir)
    for tool in ("dloco", "dloco-data"):
        if not os.access(os.path.join(BUILD, "bin", tool), os.X_OK):
            sys.exit("python_learner_test: %s/bin/%s is missing: build first (scripts/build.sh)" % (BUILD, tool))
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        sys.exit("python_learner_test: %s lacks %s: install Debian's python3-torch, python3-grpcio and "
                 "python3-protobuf (scripts/setup.sh)" % (sys.executable, e.name))
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
