"""The run's config.toml, read the way `dloco` reads it (src/core/config.{h,cc}): every field with its type and
default, presets, `--set section.key=value` overrides, paths relative to the config file, unknown keys refused.

The fields below are a copy of the C++ table (for_each_field in src/core/config.cc). They must stay in step with it:
the handshake sends [model] and the shared [train]/[diloco] settings typed by this table, so a field missing here or
of another type is refused by the syncer ("settings differ ...", docs/protocol.md §7), never silently ignored.

Deliberately not here: the checks of modes and sections the Python learner does not run (baselines, [parallel]
groups, SkipPipe); a config that needs them is refused with a clear error (check_supported).
"""
import os
import tomllib
from pathlib import Path

# (section, key, kind, default). kind: "str" | "int" | "uint" | "float" | "bool" | a tuple of choices (a string).
# Floats are written with a decimal point even when whole (screen_ratio = 10.0): the C++ field is a double, and the
# handshake sends it as a double (handshake.settings), not as the integer 10.
FIELDS = [
    ("model", "preset", "str", "small"),
    ("model", "vocab_size", "int", 4096),
    ("model", "seq_len", "int", 128),
    ("model", "n_layer", "int", 4),
    ("model", "n_head", "int", 4),
    ("model", "d_model", "int", 128),
    ("model", "d_ff", "int", 0),
    ("model", "tie_embeddings", "bool", True),
    ("model", "rope_theta", "float", 10000.0),
    ("model", "norm_eps", "float", 1e-5),
    ("model", "init_std", "float", 0.02),
    ("data", "dir", "str", "data/kjv"),
    ("data", "streams", "int", 0),
    ("data", "order", ("contiguous", "shuffled"), "contiguous"),
    ("train", "batch_size", "int", 16),
    ("train", "grad_accum", "int", 1),
    ("train", "total_tokens", "int", 2000000),
    ("train", "shared_budget", "bool", False),
    ("train", "lr", "float", 2e-3),
    ("train", "warmup_steps", "int", 50),
    ("train", "min_lr_ratio", "float", 0.1),
    ("train", "weight_decay", "float", 0.1),
    ("train", "beta1", "float", 0.9),
    ("train", "beta2", "float", 0.95),
    ("train", "adam_eps", "float", 1e-8),
    ("train", "grad_clip", "float", 1.0),
    ("train", "eval_interval", "int", 100),
    ("train", "eval_tokens", "int", 0),
    ("train", "checkpoint_interval", "int", 200),
    ("train", "learner_state_interval", "int", 100),
    ("train", "log_interval", "int", 10),
    ("diloco", "mode", ("local", "decoupled", "dp", "diloco", "streaming"), "decoupled"),
    ("diloco", "learners", "int", 4),
    ("diloco", "inner_steps", "int", 24),
    ("diloco", "fragments", "int", 24),
    ("diloco", "overlap", "int", 2),
    ("diloco", "quorum", "int", 1),
    ("diloco", "grace_window", "bool", True),
    ("diloco", "gamma", "float", 0.5),
    ("diloco", "outer_lr", "float", 0.7),
    ("diloco", "outer_momentum", "float", 0.9),
    ("diloco", "merge", ("rda", "mean"), "rda"),
    ("diloco", "weights", ("tokens", "uniform"), "tokens"),
    ("diloco", "split_large_tensors", "bool", True),
    ("diloco", "alpha", "float", 0.0),
    ("diloco", "stale_policy", ("reanchor", "skip"), "reanchor"),
    ("diloco", "anchor_versions", "int", 2),
    ("diloco", "wire_up", ("fp32", "bf16", "q8", "q4", "topk"), "fp32"),
    ("diloco", "wire_down", ("fp32", "bf16", "q8", "q4", "topk"), "fp32"),
    ("diloco", "error_feedback", "bool", False),
    ("diloco", "error_feedback_decay", "float", 1.0),
    ("diloco", "topk_density", "int", 64),
    ("diloco", "screen_ratio", "float", 10.0),
    ("diloco", "clip_ratio", "float", 0.0),
    ("diloco", "refetch_after", "int", 3),
    ("diloco", "blocking", "bool", False),
    ("diloco", "bootstrap", ("syncer", "peers"), "syncer"),
    ("run", "name", "str", "run"),
    ("run", "out_dir", "str", "runs"),
    ("run", "seed", "uint", 1234),
    ("run", "device", "str", "cpu"),
    ("run", "threads", "int", 0),
    ("run", "secret", "str", ""),
    ("run", "tls_cert", "str", ""),
    ("run", "tls_key", "str", ""),
    ("run", "tls_ca", "str", ""),
    ("run", "tls_mutual", "bool", False),
    ("run", "insecure", "bool", False),
    ("run", "trusted_network", "bool", False),  # Gloo groups only: read for the mirror, unused here
    ("run", "syncer_address", "str", "127.0.0.1:0"),
    ("run", "peer_host", "str", ""),
    ("run", "peer_advertise", "str", ""),
    ("run", "monitor", "str", "127.0.0.1:0"),
    ("run", "learner_monitor", "str", "127.0.0.1:0"),
    ("run", "restart_delay_s", "float", 2.0),
    ("run", "report_interval_s", "float", 5.0),
    ("run", "slowdown", "str", ""),
    ("run", "collective_timeout_s", "float", 120.0),
    ("run", "recovery", ("stop", "restart", "elastic"), "stop"),
    ("skippipe", "stages", "int", 0),
    ("skippipe", "skip", "float", 0.0),
    ("skippipe", "full_depth_every", "int", 0),
    ("parallel", "tensor", "int", 1),
    ("parallel", "pipeline", "int", 1),
    ("parallel", "data", "int", 1),
    ("parallel", "zero", "int", 0),
    ("parallel", "micro_batches", "int", 1),
    ("parallel", "schedule", ("gpipe", "1f1b", "interleaved"), "1f1b"),
    ("parallel", "chunks", "int", 1),
    ("parallel", "precision", ("fp32", "bf16"), "fp32"),
    ("parallel", "checkpoint_activations", "bool", False),
    ("parallel", "offload", "bool", False),
    ("parallel", "timeout_s", "float", 60.0),
    ("parallel", "skippipe_setting", "str", ""),
    ("parallel", "skippipe_schedule", "str", ""),
    ("parallel", "skippipe_link_scale", "float", 0.0),
    ("parallel", "skippipe_compute_scale", "float", 0.0),
    ("parallel", "skippipe_nodes", "int", 0),
]
KINDS = {(s, k): kind for s, k, kind, _ in FIELDS}
SECTIONS = list(dict.fromkeys(s for s, _, _, _ in FIELDS))

# model_preset() in src/core/config.cc: a preset replaces these fields, the file's other [model] keys then override.
PRESETS = {
    "tiny": dict(vocab_size=512, seq_len=32, n_layer=2, n_head=2, d_model=32),
    "small": dict(vocab_size=4096, seq_len=128, n_layer=4, n_head=4, d_model=128),
    "base-124m": dict(vocab_size=16384, seq_len=1024, n_layer=12, n_head=12, d_model=768, d_ff=3072),
}
# Set by a preset from the defaults above (a preset starts from ModelConfig{}; these are its defaults).
MODEL_DEFAULTS = {k: d for s, k, _, d in FIELDS if s == "model"}

# Every path of the config: relative to the config file when the file sets it, else to the working directory.
PATHS = [("data", "dir"), ("run", "out_dir"), ("run", "tls_cert"), ("run", "tls_key"), ("run", "tls_ca")]


class ConfigError(Exception):
    """Bad input: a clear message naming the file, the key and what to do (tier 3 of the style's error policy)."""


def _coerce(source, section, key, value):
    """The value of `section.key` as the C++ field type (toml++ rules: an integer is accepted for a float, a whole
    float for an integer)."""
    kind = KINDS[(section, key)]
    name = "%s: '%s.%s'" % (source, section, key)
    if kind == "str" or isinstance(kind, tuple):
        if not isinstance(value, str):
            raise ConfigError(name + " must be a string")
        if isinstance(kind, tuple) and value not in kind:
            raise ConfigError("%s must be %s (got \"%s\")" % (name, ", ".join('"%s"' % c for c in kind), value))
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(name + " must be true or false")
        return value
    if kind in ("int", "uint"):
        if isinstance(value, float) and value == int(value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name + " must be an integer")
        if kind == "uint" and value < 0:
            raise ConfigError(name + " must be ≥ 0")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name + " must be a number")
    return float(value)


def _apply_table(cfg, table, source):
    """Applies one parsed TOML table: [model] preset first, then every other key; unknown sections and keys are
    errors (as apply_table in src/core/config.cc)."""
    for section, body in table.items():
        if section not in SECTIONS:
            raise ConfigError("%s: unknown section [%s] (known: %s)" % (source, section, ", ".join(SECTIONS)))
        if not isinstance(body, dict):
            raise ConfigError("%s: '%s' must be a table" % (source, section))
    preset = table.get("model", {}).get("preset")
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ConfigError("unknown model preset '%s' (known: tiny, small, base-124m)" % preset)
        cfg["model"] = dict(MODEL_DEFAULTS, preset=preset, **PRESETS[preset])
    for section, body in table.items():
        for key, value in body.items():
            if section == "parallel" and key == "learner":
                cfg["parallel_learners"].extend(value if isinstance(value, list) else [value])
                continue
            if (section, key) not in KINDS:
                known = ", ".join(k for s, k, _, _ in FIELDS if s == section)
                raise ConfigError("%s: unknown key '%s' in [%s] (known keys: %s)" % (source, key, section, known))
            cfg[section][key] = _coerce(source, section, key, value)


def load_config(path, overrides=()):
    """Reads the run's config file and applies `overrides` ("section.key=value", as `dloco --set`). Returns a dict of
    sections (cfg["train"]["lr"], ...) with every field resolved, plus cfg["parallel_learners"] (raw tables).
    Raises ConfigError with the file and key on a missing file, a TOML error, an unknown key or a wrong type."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError("config '%s' is a folder: give the run's TOML file" % path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError("cannot read config file '%s': %s" % (path, e.strerror)) from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("%s: TOML syntax error: %s" % (path, e)) from None
    cfg = {s: {} for s in SECTIONS}
    for s, k, _, d in FIELDS:
        cfg[s][k] = d
    cfg["parallel_learners"] = []
    _apply_table(cfg, table, str(path))
    base = path.resolve().parent
    for section, key in PATHS:  # the file's own paths: relative to the file
        value = cfg[section][key]
        if key in table.get(section, {}) and value and not os.path.isabs(value):
            cfg[section][key] = os.path.normpath(str(base / value))
    for ov in overrides:
        eq, dot = ov.find("="), ov.find(".")
        if eq < 0 or dot < 0 or dot > eq:
            raise ConfigError("override '%s' must look like section.key=value (e.g. train.lr=1e-3)" % ov)
        section, key, value = ov[:dot], ov[dot + 1:eq], ov[eq + 1:]
        try:
            parsed = tomllib.loads("v = " + value)["v"]
        except tomllib.TOMLDecodeError:
            parsed = value  # a bare word (run.name=demo) is a string, as in C++
        _apply_table(cfg, {section: {key: parsed}}, "override '%s'" % ov)
    for section, key in PATHS:  # defaults and overrides: relative to the working directory
        value = cfg[section][key]
        if value and not os.path.isabs(value):
            cfg[section][key] = os.path.abspath(value)
    if cfg["diloco"]["mode"] == "diloco":  # parse_config's baseline rules, so the settings hash agrees
        cfg["diloco"]["fragments"], cfg["diloco"]["overlap"] = 1, 0
    if cfg["diloco"]["mode"] in ("dp", "diloco", "streaming"):
        cfg["diloco"].update(quorum=cfg["diloco"]["learners"], grace_window=False, merge="mean")
    return cfg


def ff_dim(model):
    """SwiGLU width F: d_ff, or round_up(8/3·C, 64) when d_ff = 0 (ModelConfig::ff_dim)."""
    if model["d_ff"] > 0:
        return model["d_ff"]
    raw = (8 * model["d_model"] + 2) // 3
    return (raw + 63) // 64 * 64


def tokens_per_step(cfg):
    """B·T·grad_accum: tokens in one optimizer step of one learner."""
    return cfg["train"]["batch_size"] * cfg["model"]["seq_len"] * cfg["train"]["grad_accum"]


def run_secret(cfg):
    """DLOCO_SECRET when set (it wins), else run.secret; printable ASCII without spaces, ≤ 256 bytes."""
    secret = os.environ.get("DLOCO_SECRET") or cfg["run"]["secret"]
    if len(secret) > 256 or any(not (" " < ch < "\x7f") for ch in secret):
        raise ConfigError("the run secret (DLOCO_SECRET or run.secret) must be printable ASCII without spaces, at "
                          "most 256 bytes (it travels as a bearer token)")
    return secret


def slowdown_factor(cfg, learner_id):
    """run.slowdown's factor for this learner ("ID:FACTOR,…"; 1 when not listed), as slowdown_factor() in C++."""
    factor = 1.0
    for entry in cfg["run"]["slowdown"].split(","):
        if not entry.strip():
            continue
        who, _, f = entry.partition(":")
        try:
            who, f = int(who), float(f)
        except ValueError:
            raise ConfigError("run.slowdown: entry '%s' must look like ID:FACTOR (e.g. \"3:1.18\")" % entry) from None
        if f < 1.0:
            raise ConfigError("run.slowdown: factor of learner %d must be ≥ 1 (got %s)" % (who, f))
        if who == learner_id:
            factor = f
    return factor


def check_supported(cfg, learner_id):
    """Refuses, with what to do instead, a config this learner cannot run (ConfigError)."""
    d, t, m = cfg["diloco"], cfg["train"], cfg["model"]
    if d["mode"] != "decoupled":
        raise ConfigError("diloco.mode = \"%s\": the Python learner joins decoupled runs only" % d["mode"])
    if d["blocking"]:
        raise ConfigError("diloco.blocking = true (the synchronous configuration) is not implemented by the Python "
                          "learner: use the C++ learner (dloco learner)")
    if cfg["skippipe"]["stages"] > 0:
        raise ConfigError("skippipe.stages > 0: the Python learner trains the full depth only")
    parallel = dict(cfg["parallel"])
    for entry in cfg["parallel_learners"]:
        if entry.get("id") == learner_id:
            parallel.update({k: v for k, v in entry.items() if k != "id"})
    if parallel["tensor"] * parallel["pipeline"] * parallel["data"] != 1 or parallel["precision"] != "fp32" \
            or parallel["skippipe_schedule"]:
        raise ConfigError("[parallel] makes learner %d a group of ranks or bf16: the Python learner is one fp32 "
                          "process" % learner_id)
    for key, ok in [("train.batch_size", t["batch_size"] >= 1), ("train.grad_accum", t["grad_accum"] >= 1),
                    ("diloco.fragments", d["fragments"] >= 1),
                    ("diloco.inner_steps", d["inner_steps"] >= 1 and d["inner_steps"] % d["fragments"] == 0),
                    ("model.n_head", m["n_head"] >= 1 and m["d_model"] % m["n_head"] == 0
                     and (m["d_model"] // m["n_head"]) % 2 == 0)]:
        if not ok:
            raise ConfigError("config: %s is out of range (see src/core/config.h)" % key)


class SteadyCompute:
    """The compute time a slowdown stretches, as SteadyCompute in src/core/slowdown.h: the median of the previous
    `window` steps' compute and never more than this step's own; 0 for an incarnation's first step (a cold start or
    another process's burst is not stretched F times)."""

    def __init__(self, window=9):
        self.window, self.recent = window, []

    def __call__(self, step_s):
        out = min(step_s, sorted(self.recent)[len(self.recent) // 2]) if self.recent else 0.0
        self.recent = (self.recent + [step_s])[-self.window:]
        return out
