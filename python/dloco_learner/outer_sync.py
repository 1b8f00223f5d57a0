"""The learner's outer sync (docs/protocol.md §3 steps 3, 5, 6 and §9; the C++ counterpart is
src/learner/outer_sync.cc): per-fragment counters, answers to pull requests, merged fragments held until τ steps
after the capture of this learner's answer, whole copies and compressed updates (checked against base_version and
base_hash), α-mixing, re-anchoring and the goodput events (kept, answer_not_merged, work_lost).

It runs on the training thread at step boundaries and never waits: it polls the link and posts to it.
"""
from dataclasses import dataclass

import numpy as np

from . import codec
from .handshake import fnv1a64_floats, fnv1a64_hex


@dataclass
class Pending:
    """A merged fragment waiting for its apply step."""
    fragment: int
    version: int
    apply_at: int
    theta: np.ndarray
    whole: bool
    participated: bool = False
    replaces: bool = False  # a whole copy asked for after a gap: applied even at a version not above this one


@dataclass
class Answered:
    """The last pull of a fragment this learner answered."""
    round: int
    captured_step: int
    steps: int
    open: bool = True  # no merge of that round seen yet


class OuterSync:
    def __init__(self, cfg, learner_id, view, link, pb, events):
        d = cfg["diloco"]
        self.id, self.view, self.link, self.pb, self.events = learner_id, view, link, pb, events
        self.P = len(view.layout.fragments)
        self.overlap, self.alpha = d["overlap"], d["alpha"]
        self.reanchor = d["stale_policy"] == "reanchor"
        self.codec = d["wire_up"]
        self.error_feedback = d["error_feedback"]
        P = self.P
        self.base = [None] * P             # Θ_p^base: the version last applied
        self.version = [0] * P
        self.newest = [None] * P           # the newest Θ_p received (applied or pending): what an update is against
        self.newest_version = [0] * P
        self.newest_hash = [None] * P      # FNV-1a of newest, computed when an update first needs it
        self.resync_asked = [False] * P
        self.steps_since = [0] * P         # steps[m][p]: since p was last applied
        self.tokens_since = [0] * P
        self.answered = {}
        self.pending = []
        self.density = d["topk_density"]
        self.feedback = [codec.ErrorFeedback(d["error_feedback_decay"], self.density) for _ in range(P)]
        self.lost_steps = 0
        self.merges_applied = 0

    def adopt(self, p, version, theta):
        """Bootstrap: fragment p is Θ_p at `version`."""
        self.view.write(p, theta)
        self.version[p] = self.newest_version[p] = version
        self.base[p] = self.newest[p] = theta
        self.newest_hash[p] = None

    def count_step(self, tokens):
        """Step 3: the counters after an inner step of `tokens` tokens."""
        for p in range(self.P):
            self.steps_since[p] += 1
            self.tokens_since[p] += tokens

    def fill_counters(self, metadata):
        """Step 4's counters, and the newest version of each fragment held (−1: it wants p whole)."""
        metadata.steps.extend(self.steps_since)
        metadata.tokens.extend(self.tokens_since)
        metadata.versions.extend(-1 if self.resync_asked[p] else self.newest_version[p] for p in range(self.P))

    def boundary(self, step, finished):
        """Steps 5–6 after step `step`: answers pulls, queues merges, applies those due (all once `finished`).
        Returns (stop, budget_spent)."""
        stop = budget_spent = False
        for message in self.link.poll():
            body = message.WhichOneof("body")
            if body == "stop":
                stop = True
            elif body == "budget_spent":
                budget_spent = True
            elif body == "pull":
                self._answer(message.pull, step)
            elif body == "merged":
                self._receive(message.merged, step)
        finished = finished or budget_spent
        due = [m for m in self.pending if m.apply_at <= step or finished]
        self.pending = [m for m in self.pending if not (m.apply_at <= step or finished)]
        for m in due:
            self._apply(m, step)
        return stop, budget_spent

    def _answer(self, pull, step):
        """5) Δ_p = Θ_p^base − θ_p against the version last applied; raw θ_p in fp32 when the syncer no longer holds
        that base (older than oldest_anchor) or never held it (this copy is ahead of the syncer's version)."""
        p = pull.fragment
        if not 0 <= p < self.P:
            return
        theta = self.view.read(p)
        ahead = pull.HasField("version") and self.version[p] > pull.version
        answer = self.pb.PullAnswer(fragment=p, round_step=pull.round_step, captured_step=step,
                                    base_version=self.version[p], steps=self.steps_since[p],
                                    tokens=self.tokens_since[p])
        if (self.version[p] < pull.oldest_anchor or ahead) and self.reanchor:
            answer.base_version = -1
            answer.dtype, answer.delta = codec.encode(theta, "fp32")
            self.feedback[p].reset()  # what it held was relative to the old base
        else:
            delta = self.base[p] - theta  # (numel) fp32
            answer.dtype, answer.delta = self._encode_delta(p, delta)
        self.answered[p] = Answered(pull.round_step, step, self.steps_since[p])
        self.events.emit("answered", fragment=p, round=pull.round_step, step=step, base_version=answer.base_version,
                         steps=answer.steps)
        self.link.post(answer)

    def _encode_delta(self, p, delta):
        try:
            if self.error_feedback and self.codec != "fp32":
                return self.feedback[p].encode(delta, self.codec)
            return codec.encode(delta, self.codec, 0, self.density)
        except codec.CodecError as e:  # a non-finite Δ: the integer codecs cannot carry it; the syncer refuses it
            self.events.emit("delta_not_finite", fragment=p, codec=self.codec, reason=str(e))
            return codec.encode(delta, "fp32")

    def _newest_hash(self, p):
        if self.newest_hash[p] is None:
            self.newest_hash[p] = fnv1a64_floats(self.newest[p])
        return self.newest_hash[p]

    def _receive(self, merged, step):
        """A merged fragment: whole (Θ_p) or an update U against base_version (Θ_p = Θ_p^base + Û in fp32). Held until
        s + τ when this learner's answer at s is in it, else applied at the next boundary."""
        frag = merged.fragment
        p = frag.fragment
        if not 0 <= p < self.P:
            return
        base_version = merged.base_version if merged.HasField("base_version") else -1
        whole = base_version == -1
        # A whole copy replaces this copy even at a lower or equal version when it was asked for (after a gap), when
        # the syncer's history went back, or on a re-fetch (this learner's answers were refused
        # diloco.refetch_after times in a row: its parameters of p may be what went bad, §10).
        refetch = getattr(merged, "refetch", False)  # (absent from a proto before the re-fetch)
        if refetch and any(q.fragment == p and q.version >= frag.version for q in self.pending):
            # A merge of p at that version or later waits to be applied: it writes Θ_p anyway (maybe our own).
            self.events.emit("refetch_skipped", fragment=p, version=frag.version,
                             reason="a merge of the fragment at that version or later waits to be applied")
            return
        replaces = whole and (refetch or self.resync_asked[p] or frag.version < self.newest_version[p])
        if frag.version <= self.newest_version[p] and not replaces:
            return  # stale or a duplicate
        numel = self.view.layout.fragments[p].numel
        bad = ""
        theta = None
        if whole:
            if frag.dtype != "fp32":
                bad = "a whole fragment as '%s' (whole copies are fp32)" % frag.dtype[:32]
            else:
                try:
                    theta = codec.decode(frag.dtype, frag.data, numel)
                except codec.CodecError as e:
                    bad = str(e)
        elif base_version < 0 or frag.version != base_version + 1:
            bad = "an update from version %d to %d: an update moves one version from a version ≥ 0" % (
                base_version, frag.version)
        elif base_version != self.newest_version[p] or merged.base_hash != self._newest_hash(p):
            # An update against a copy this learner does not hold: refuse to guess, ask for a whole copy.
            reason = "same version, other contents" if base_version == self.newest_version[p] \
                else "a version it lacks"
            self.events.emit("merged_gap", fragment=p, version=frag.version, base_version=base_version,
                             holds=self.newest_version[p],
                             reason=reason + (": waiting for the whole copy asked for" if self.resync_asked[p]
                                              else ": asking for a whole copy (re-opening the session)"))
            if not self.resync_asked[p]:
                self.link.resync()
            self.resync_asked[p] = True
            return
        else:
            try:
                theta = codec.apply_update(self.newest[p], frag.dtype, frag.data)
            except codec.CodecError as e:
                bad = str(e)
        if bad:
            self.events.emit("merged_refused", fragment=p, version=frag.version, reason=bad)
            if not self.resync_asked[p]:
                self.link.resync()
            self.resync_asked[p] = True
            return
        if whole:
            self.resync_asked[p] = False
        if refetch:
            self.feedback[p].reset()  # what it held belongs to answers that were refused
            self.events.emit("refetch", fragment=p, version=frag.version,
                             reason="the syncer refused this learner's answers diloco.refetch_after times in a row: "
                                    "its parameters of the fragment are replaced by Θ_p")
        self.newest[p], self.newest_version[p], self.newest_hash[p] = theta, frag.version, None
        m = Pending(p, frag.version, step, theta, whole, replaces=replaces)
        if replaces:  # nothing older may be applied after it
            self.pending = [q for q in self.pending if q.fragment != p]
        a = self.answered.get(p)
        if a is not None and a.round == merged.round_step:
            m.participated = self.id in merged.participants
            if m.participated:
                m.apply_at = a.captured_step + self.overlap
            if a.open:  # goodput: the work that answer carried was kept, or not
                self.events.emit("kept" if m.participated else "answer_not_merged", fragment=p,
                                 round=merged.round_step, steps=a.steps, version=m.version,
                                 captured_step=a.captured_step)
                a.open = False
        self.pending.append(m)

    def _apply(self, m, step):
        """6) θ_p ← Θ_p (or α·θ_p + (1 − α)·Θ_p); Θ_p becomes the base of the next Δ_p; counters of p ← 0."""
        p = m.fragment
        if m.version <= self.version[p] and not m.replaces:
            return
        if not m.participated and self.steps_since[p] > 0:
            self.lost_steps += self.steps_since[p]
            self.events.emit("work_lost", fragment=p, steps=self.steps_since[p], version=m.version,
                             reason="merged without this learner's answer")
        if self.alpha > 0:  # in double, then rounded to fp32, as the C++
            local = self.view.read(p).astype(np.float64)
            self.view.write(p, (self.alpha * local + (1 - self.alpha) * m.theta.astype(np.float64)).astype(np.float32))
        else:
            self.view.write(p, m.theta)
        self.base[p], self.version[p] = m.theta, m.version
        self.steps_since[p] = self.tokens_since[p] = 0
        self.merges_applied += 1
        self.events.emit("applied", step=step, fragment=p, version=m.version,
                         **{"from": "whole" if m.whole else "update"})

    def unmerged_steps(self):
        return max(self.steps_since)

    def parameter_hashes(self):
        """FNV-1a hashes (16 hex digits) of this replica's own fragments now: the end-of-run check."""
        return [fnv1a64_hex(self.view.read(p)) for p in range(self.P)]
