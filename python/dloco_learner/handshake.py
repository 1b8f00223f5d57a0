"""The handshake's hashes and typed settings, as the C++ computes them (src/transport/handshake.cc,
src/core/hash.h; the recipes are written out in docs/protocol.md §13 "For implementers").

  settings        one dloco.v1.Setting per shared field ("train.lr" = 0.002 as a double): every [model] field,
                  [train] but the 5 role-local keys, all of [diloco], data.streams, data.order; typed as
                  config.py's FIELDS
  tokenizer_hash  FNV-1a 64 of the bytes of data.dir/tokenizer.model
  layout_hash     FNV-1a 64 of the fragment layout's canonical text (layout.py)

The syncer compares the settings as values (doubles within a relative 1e-12), not as text: no float printer to port.
"""
from pathlib import Path

import numpy as np

from . import config as config_mod

PROTOCOL_VERSION = 5  # proto/dloco.proto: 5 = batches of B rows of T + 1 tokens (4: one window; 3: JSON settings)
FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1

# [train] keys each process sets for itself: not part of the shared settings (handshake_settings in the C++).
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


def settings(cfg):
    """The shared settings as (name, kind, value), kind "int" | "double" | "bool" | "string" as the C++ field's type
    (config.py KINDS: "uint" is an integer, a tuple of choices a string), in the order of FIELDS."""
    out = []
    for section, key, kind, _ in config_mod.FIELDS:
        shared = section in ("model", "diloco") or (section == "train" and key not in ROLE_LOCAL_TRAIN_KEYS) or \
            (section, key) in (("data", "streams"), ("data", "order"))
        if not shared:
            continue
        value = cfg[section][key]
        if kind in ("int", "uint"):
            out.append((section + "." + key, "int", int(value)))
        elif kind == "float":
            out.append((section + "." + key, "double", float(value)))
        elif kind == "bool":
            out.append((section + "." + key, "bool", bool(value)))
        else:
            out.append((section + "." + key, "string", str(value)))
    return out


def tokenizer_hash(cfg):
    path = Path(cfg["data"]["dir"]) / "tokenizer.model"
    try:
        return fnv1a64(path.read_bytes())
    except OSError:
        raise config_mod.ConfigError("tokenizer '%s' is missing: prepare the corpus first (`dloco data prepare ... "
                                     "--out %s`), the same as the syncer's" % (path, cfg["data"]["dir"])) from None


def make_handshake(pb, cfg, layout):
    """This learner's dloco.v1.Handshake message (`pb` is the generated dloco_pb2 module)."""
    typed = [pb.Setting(name=name, **{kind + "_value": value}) for name, kind, value in settings(cfg)]
    return pb.Handshake(run_id=cfg["run"]["name"], protocol_version=PROTOCOL_VERSION,
                        secret=config_mod.run_secret(cfg), layout_hash=layout.hash,
                        tokenizer_hash=tokenizer_hash(cfg), settings=typed)
