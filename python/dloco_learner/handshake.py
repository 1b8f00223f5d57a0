"""The handshake's hashes and settings, byte for byte as the C++ computes them (src/transport/handshake.cc,
src/core/hash.h; the recipes are written out in docs/protocol.md §13 "For implementers").

  model_hash      FNV-1a 64 of the canonical JSON of [model] (all 11 fields, defaults included)
  training        canonical JSON of {"data": {"streams"}, "diloco": {all}, "train": {all but 5 role-local keys}}
  tokenizer_hash  FNV-1a 64 of the bytes of data.dir/tokenizer.model
  layout_hash     FNV-1a 64 of the fragment layout's canonical text (layout.py)

Canonical JSON is what nlohmann::json::dump() prints: no spaces, object keys sorted bytewise, integers as integers,
doubles with nlohmann's Grisu2 digits and layout (nlohmann_double.py), strings JSON-escaped as UTF-8.
"""
import json
from pathlib import Path

import numpy as np

from . import config as config_mod
from . import nlohmann_double

PROTOCOL_VERSION = 3  # proto/dloco.proto: 3 = bearer token on every call + the settings in the handshake
FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1

# [train] keys each process sets for itself: not part of the shared settings (training_settings_json).
ROLE_LOCAL_TRAIN_KEYS = ("eval_interval", "eval_tokens", "checkpoint_interval", "learner_state_interval",
                         "log_interval")


def fnv1a64(data, seed=FNV_OFFSET):
    """FNV-1a 64 of `data` (bytes-like): h ^= byte; h *= 1099511628211 (mod 2^64), from the offset basis.
    Pure Python, about 10–15 MB/s: the end-of-run hashes and an update's base check of a small model cost
    milliseconds; of a 124M-parameter model, tens of seconds (the C++ learner hashes at memory speed)."""
    h = seed
    for b in memoryview(data).cast("B"):
        h = ((h ^ b) * FNV_PRIME) & _MASK
    return h


def fnv1a64_floats(values):
    """FNV-1a 64 of the little-endian fp32 bytes of `values` (a fragment: the base named by an update)."""
    return fnv1a64(np.ascontiguousarray(values, dtype="<f4").tobytes())


def fnv1a64_hex(values):
    """The same as 16 lowercase hex digits: the form of `stopped` and `final_state` events."""
    return "%016x" % fnv1a64_floats(values)


def canonical_json(value):
    """nlohmann::json::dump() of a value built from dicts, lists, str, int, float and bool."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return nlohmann_double.text(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-8"))
        return "{" + ",".join(canonical_json(k) + ":" + canonical_json(v) for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise TypeError("no canonical JSON for %r" % (value,))


def model_json(cfg):
    """The [model] section as canonical JSON: every field of ModelConfig, the preset's name included."""
    return canonical_json(cfg["model"])


def model_hash(cfg):
    return fnv1a64(model_json(cfg).encode("utf-8"))


def training_settings_json(cfg):
    """The settings every process of a run shares (training_settings_json in src/transport/handshake.cc)."""
    train = {k: v for k, v in cfg["train"].items() if k not in ROLE_LOCAL_TRAIN_KEYS}
    return canonical_json({"train": train, "diloco": cfg["diloco"], "data": {"streams": cfg["data"]["streams"]}})


def tokenizer_hash(cfg):
    path = Path(cfg["data"]["dir"]) / "tokenizer.model"
    try:
        return fnv1a64(path.read_bytes())
    except OSError:
        raise config_mod.ConfigError("tokenizer '%s' is missing: prepare the corpus first (`dloco data prepare ... "
                                     "--out %s`), the same as the syncer's" % (path, cfg["data"]["dir"])) from None


def make_handshake(pb, cfg, layout):
    """This learner's dloco.v1.Handshake message (`pb` is the generated dloco_pb2 module)."""
    return pb.Handshake(run_id=cfg["run"]["name"], protocol_version=PROTOCOL_VERSION,
                        secret=config_mod.run_secret(cfg), layout_hash=layout.hash, model_hash=model_hash(cfg),
                        tokenizer_hash=tokenizer_hash(cfg), training=training_settings_json(cfg))
