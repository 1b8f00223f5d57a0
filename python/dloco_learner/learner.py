"""One learner of a decoupled run, in Python (docs/protocol.md §3 "Learner loop"; the C++ counterpart is
src/learner/run_learner.cc):

  bootstrap: join (handshake, stream lease) -> lock the stream's log -> every fragment of Θ from the syncer ->
             adopt the global step and the stream's cursor
  loop:      1) batch  2) inner AdamW step  3) counters  4) metadata  5) answer pulls  6) apply merges
  end:       budget spent -> keep answering (the final flush) until Stop -> a `stopped` event with the versions and
             FNV-1a hashes of its own fragments (they must equal the syncer's `final_state`)

Events go to run_dir/events/learner_<id>.jsonl in the C++ learner's schema, so `dloco chaos`-style analysis and the
tests read both alike. Deliberately not here: the peer server (diloco.bootstrap = "peers": this learner takes Θ from
the syncer and serves nobody), /metrics, learner groups, the blocking mode, saving AdamW moments across restarts.
"""
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from . import config as config_mod
from . import handshake as hs
from .data import DataStream, StreamBusy, StreamLog, TokenSplit, parse_cursor
from .layout import FragmentView, make_layout
from .model import GPT, InnerTrainer
from .outer_sync import OuterSync
from .wire import LinkRefused, SyncerLink, load_stubs


def _json_safe(value):
    """NaN and infinities as null (nlohmann's output; the C++ readers parse these logs)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class EventLog:
    """One JSON object per line: {"t", "role", "id", "event", ...fields}, appended and flushed (process/events.h)."""

    def __init__(self, path, learner_id):
        self.file = open(path, "a")
        self.id = learner_id
        self.lock = threading.Lock()

    def emit(self, event, **fields):
        line = dict(t=time.time(), role="learner", id=self.id, event=event, **fields)
        text = json.dumps(_json_safe(line), separators=(",", ":"), ensure_ascii=False) + "\n"
        with self.lock:
            self.file.write(text)
            self.file.flush()


class Ema:
    def __init__(self, decay=0.9):
        self.decay, self.value, self.has_value = decay, 0.0, False

    def update(self, x):
        self.value = self.decay * self.value + (1 - self.decay) * x if self.has_value else x
        self.has_value = True


_signal = [0]


def _on_signal(sig, _frame):
    _signal[0] = sig


def bootstrap(link, run_dir, P, timeout_s, events, who):
    """Joins, locks the leased stream's log and fetches every fragment, retrying a syncer that is not there yet (or
    died halfway) up to `timeout_s`. Returns (JoinReply, StreamLog, [Fragment]), or None when a signal asked it to
    leave first. Raises ConfigError on a refusal (LinkRefused) or at the deadline."""
    started = time.monotonic()
    said = -1e9
    last = "no attempt"
    held = None  # (stream, StreamLog) locked by an earlier attempt
    while _signal[0] == 0:
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise config_mod.ConfigError("cannot bootstrap from the syncer at %s within %.0f s (last error: %s)"
                                         % (link.address, timeout_s, last))
        reply, why = link.try_join(max(1.0, min(5.0, left)))
        if reply is None:
            last = why
            if time.monotonic() - said >= 10:  # said at once, then every 10 s: never silent
                said = time.monotonic()
                print("%s no answer from the syncer at %s (%s); retrying for %.0f s more" % (who, link.address, last,
                                                                                           left), flush=True)
            continue
        if held is None or held[0] != reply.stream_index:
            if held is not None:
                held[1].close()
            try:
                held = (reply.stream_index, StreamLog(run_dir, reply.stream_index))
            except StreamBusy as e:  # its previous holder still lives: tell the syncer, lease another
                link.busy_streams[reply.stream_index] = time.monotonic()
                last, held = str(e), None
                events.emit("bootstrap_retry", reason=last)
                time.sleep(0.5)
                continue
        try:
            fragments = [link.fetch_fragment(p) for p in range(P)]
        except link.grpc.RpcError as e:  # the syncer died halfway: join again
            last = "%s: %s" % (e.code().name, e.details())
            events.emit("bootstrap_retry", reason=last)
            time.sleep(0.5)
            continue
        return reply, held[1], fragments
    return None


def open_stream(cfg, joined, log):
    """The leased stream at its cursor: the syncer's, or the log's when newer (then one step's batches after it, which
    were trained or lost, never retrained). Returns (DataStream, from_log)."""
    cursor = parse_cursor(joined.stream_cursor_json, joined.stream_index)
    from_log = log.last is not None and log.last["stream"] == joined.stream_index \
        and log.last["tokens_served"] >= cursor["tokens_served"]
    if from_log:
        cursor = dict(log.last)
    S = joined.streams or cfg["data"]["streams"] or cfg["diloco"]["learners"]  # the syncer's S decides
    if not 0 <= joined.stream_index < S:
        raise config_mod.ConfigError("the syncer leased stream %d of S = %d streams" % (joined.stream_index, S))
    stream = DataStream(TokenSplit(cfg["data"]["dir"]), joined.stream_index, S, cfg["train"]["batch_size"],
                        cfg["model"]["seq_len"], cursor, cfg["data"]["order"])
    for _ in range(cfg["train"]["grad_accum"] if from_log else 0):
        stream.skip()
    return stream, from_log


class Learner:
    """The loop and what it keeps between steps (LearnerLoop in run_learner.cc)."""

    def __init__(self, cfg, learner_id, run_dir, joined, trainer, stream, sync, link, log, events):
        self.cfg, self.id, self.run_dir = cfg, learner_id, run_dir
        self.step = joined.global_step  # adopt the global step: the lr schedule is global (re-warmed when fresh)
        self.stream_index, self.budget = joined.stream_index, joined.tokens_budget
        self.trainer, self.stream, self.sync, self.link, self.log, self.events = \
            trainer, stream, sync, link, log, events
        self.tokens_per_step = config_mod.tokens_per_step(cfg)
        self.slowdown = config_mod.slowdown_factor(cfg, learner_id)
        self.steady_compute = config_mod.SteadyCompute()
        self.phase = "training"  # -> "finished" (budget spent) -> "stopped" (the syncer's Stop, or a signal)
        self.leaving = False
        self.step_time, self.loss = Ema(), Ema()
        self.max_boundary_s = 0.0
        self.last_metadata = 0.0

    def run(self):
        report_every = self.cfg["run"]["report_interval_s"]
        last_row, row_tokens = time.monotonic(), self.stream.cursor["tokens_served"]
        while self.phase != "stopped" and _signal[0] == 0:
            fatal = self.link.fatal_error()
            if fatal:
                raise config_mod.ConfigError(fatal)
            if self.stream.cursor["tokens_served"] + self.tokens_per_step > self.budget:
                self.finish("its token budget is spent")
            if self.phase == "finished":
                self.boundary()
                if time.monotonic() - self.last_metadata > 0.2:
                    self.send_metadata()
                time.sleep(0.005)
                continue
            self.log.take(self.stream.cursor, self.id, self.step)  # exact data: recorded before the step trains it
            t0 = time.monotonic()
            loss, tokens, skipped = self.trainer.step(self.stream, self.step)  # 1) batch, 2) inner step
            t1 = time.monotonic()
            self.step += 1
            self.sync.count_step(tokens)  # 3) counters
            if math.isfinite(loss):
                self.loss.update(loss)
            sleep_s = 0.0
            steady_s = self.steady_compute(t1 - t0)
            if self.slowdown > 1.0:  # run.slowdown: this learner emulates slower hardware
                sleep_s = (self.slowdown - 1.0) * steady_s
                time.sleep(sleep_s)
            # The emulated chip's step time (compute + sleep): the syncer sizes its lease and grace window by it
            # (docs/protocol.md §5), as the C++ learner reports it.
            self.step_time.update(t1 - t0 + sleep_s)
            self.send_metadata()  # 4)
            self.boundary()       # 5), 6)
            boundary_s = time.monotonic() - t1
            self.max_boundary_s = max(self.max_boundary_s, boundary_s)
            self.events.emit("step", step=self.step, loss=loss, step_s=t1 - t0, boundary_s=boundary_s, sleep_s=sleep_s,
                             skipped=skipped, tokens=self.stream.cursor["tokens_served"])
            if time.monotonic() - last_row >= report_every:
                tokens_now = self.stream.cursor["tokens_served"]
                print("[learner %d step %d] loss %.4f | %.0f tokens/s | merges applied %d | %.0f%% of its stream's "
                      "budget" % (self.id, self.step, self.loss.value, (tokens_now - row_tokens) /
                                  (time.monotonic() - last_row), self.sync.merges_applied,
                                  100.0 * tokens_now / max(1, self.budget)), flush=True)
                last_row, row_tokens = time.monotonic(), tokens_now
        self.boundary()  # merges that came with the Stop (the final flush) are applied before the copies are reported
        self.leaving = self.phase != "stopped"  # a signal, not the end of the run: a graceful leave
        self.phase = "stopped"

    def finish(self, reason):
        if self.phase != "training":
            return
        self.phase = "finished"
        self.events.emit("budget_spent", step=self.step, tokens=self.stream.cursor["tokens_served"], reason=reason)

    def boundary(self):
        stop, budget_spent = self.sync.boundary(self.step, self.phase != "training")
        if budget_spent:
            self.finish("the learners' tokens reached the shared budget")
        if stop:
            self.phase = "stopped"

    def send_metadata(self):
        pb = self.link.pb
        m = pb.Metadata(step=self.step, step_time_s=self.step_time.value,
                        tokens_trained=self.stream.cursor["tokens_served"],
                        cursor_json=json.dumps(self.stream.cursor, separators=(",", ":"), sort_keys=True),
                        tokens_per_s=self.tokens_per_step / self.step_time.value if self.step_time.value > 0 else 0,
                        loss=self.loss.value, finished=self.phase == "finished", stream=self.stream_index,
                        leaving=self.leaving)
        self.sync.fill_counters(m)
        self.link.post(m)
        self.last_metadata = time.monotonic()

    def finish_run(self):
        """Last words: metadata (a leave frees the stream at once), then the `stopped` event with the final copies."""
        self.log.close()  # unlock the stream's log before the syncer hands the stream to a joiner
        self.send_metadata()
        versions, hashes = list(self.sync.version), self.sync.parameter_hashes()
        self.events.emit("stopped", step=self.step, signal=_signal[0], lost_steps=self.sync.lost_steps,
                         leaving=self.leaving, unmerged_steps=self.sync.unmerged_steps(), peer_fragments_served=0,
                         reconnects=self.link.reconnects, max_boundary_s=self.max_boundary_s, versions=versions,
                         hashes=hashes, loss=self.loss.value)
        print("[learner %d step %d] stopped%s: loss %.4f, merges applied %d, versions %s, hashes %s"
              % (self.id, self.step, " (leaving)" if self.leaving else "", self.loss.value, self.sync.merges_applied,
                 versions, hashes), flush=True)
        self.link.drain(2.0 if self.leaving else 0.5)
        time.sleep(0.1)
        self.link.stop()


def run(config_path, syncer, learner_id, run_dir=None, overrides=(), bootstrap_timeout_s=120.0):
    """Runs learner `learner_id` of the run in `config_path` against the syncer at `syncer` (host:port).
    Returns 0; raises ConfigError (bad input, a refusal) with a message for the user."""
    if not 0 <= learner_id < 65536:
        raise config_mod.ConfigError("learner id %d is outside [0, 65536)" % learner_id)
    cfg = config_mod.load_config(config_path, overrides)
    config_mod.check_supported(cfg, learner_id)
    if cfg["run"]["device"] != "cpu":
        raise config_mod.ConfigError("run.device = \"%s\": the Python learner runs on the CPU" % cfg["run"]["device"])
    threads = cfg["run"]["threads"] or os.cpu_count() or 1
    torch.set_num_threads(threads)
    run_dir = Path(run_dir or Path(cfg["run"]["out_dir"]) / cfg["run"]["name"])
    (run_dir / "events").mkdir(parents=True, exist_ok=True)
    events = EventLog(run_dir / "events" / ("learner_%d.jsonl" % learner_id), learner_id)
    who = "[learner %d]" % learner_id
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    torch.manual_seed(cfg["run"]["seed"] + 1 + learner_id)
    model = GPT(cfg["model"])
    layout = make_layout([(n, tuple(p.shape)) for n, p in model.named_parameters()], cfg["diloco"]["fragments"],
                         cfg["diloco"]["split_large_tensors"])
    view = FragmentView(layout, model.named_parameters())
    pb, pb_grpc = load_stubs()
    handshake = hs.make_handshake(pb, cfg, layout)
    link = SyncerLink(pb, pb_grpc, syncer, handshake, learner_id, socket.gethostname(),
                      cfg["run"]["seed"] * 1000003 + learner_id + 1, cfg)
    print("%s model %d parameters in %d fragments (layout %016x), %d shared settings, threads %d" % (
        who, layout.total_numel, len(layout.fragments), layout.hash, len(handshake.settings), threads), flush=True)
    try:
        boot = bootstrap(link, run_dir, len(layout.fragments), bootstrap_timeout_s, events, who)
    except LinkRefused:
        link.channel.close()
        raise
    if boot is None:  # asked to leave before it trained
        events.emit("stopped", step=0, signal=_signal[0], leaving=True, reason="signal during bootstrap")
        link.channel.close()
        return 0
    joined, log, fragments = boot
    link.held_stream = joined.stream_index  # re-joins (after a syncer restart) keep this stream
    stream, from_log = open_stream(cfg, joined, log)
    sync = OuterSync(cfg, learner_id, view, link, pb, events)
    for p, f in enumerate(fragments):
        numel = layout.fragments[p].numel
        if f.fragment != p or f.dtype != "fp32" or len(f.data) != 4 * numel or f.version < 0:
            raise config_mod.ConfigError("fragment %d arrived as fragment %d, '%s', %d bytes, version %d: expected "
                                         "fp32 of %d values" % (p, f.fragment, f.dtype[:32], len(f.data), f.version,
                                                                numel))
        sync.adopt(p, f.version, np.frombuffer(f.data, dtype="<f4").astype(np.float32))
    events.emit("bootstrapped", pid=os.getpid(), global_step=joined.global_step, versions=sync.version,
                cursor=stream.cursor, cursor_from_stream_log=from_log, syncer_generation=joined.syncer_generation,
                stream=joined.stream_index, sources={"syncer": len(fragments)}, source_failures=0, peer_address="",
                implementation="python")
    print("[learner %d step %d] joined %s: stream %d, %d/%d tokens done" % (
        learner_id, joined.global_step, syncer, joined.stream_index, stream.cursor["tokens_served"],
        joined.tokens_budget), flush=True)
    link.start()
    # Its AdamW moments are always fresh (no saved state): joining a warm run, it repeats the warmup (lr_rewarmed).
    rewarm_from = joined.global_step if joined.global_step > 0 and cfg["train"]["warmup_steps"] > 0 else -1
    if rewarm_from > 0:
        events.emit("lr_rewarmed", from_step=rewarm_from, steps=cfg["train"]["warmup_steps"])
    learner = Learner(cfg, learner_id, run_dir, joined, InnerTrainer(model, cfg, rewarm_from), stream, sync, link,
                      log, events)
    learner.run()
    learner.finish_run()
    return 0


def main_entry(args):
    try:
        return run(args.config, args.syncer, args.id, args.run_dir, args.set, args.bootstrap_timeout)
    except config_mod.ConfigError as e:
        print("[learner %d] error: %s" % (args.id, e), file=sys.stderr, flush=True)
        return 2
