"""Tensor payloads on the wire (docs/protocol.md §9; src/transport/codec.cc): fp32, bf16, q8/<B> and q4/<B>, encoded
and decoded bit for bit as the C++ does, the compressed downlink's apply_update, and error feedback.

  fp32    raw little-endian floats
  bf16    the upper 16 bits of each float, rounded to nearest even (NaN kept quiet)
  q8/<B>  n (uint64 LE), ⌈n/B⌉ fp32 scales s = max|x| over the block / 127, n int8 q = round-half-even(x / s)
  q4/<B>  the same with int4 in [−7, 7], s = max|x| / 7, two values a byte (value 2i in the low nibble of byte i)
  topk/<C>[/<D>] of each chunk of C values the ⌈L/D⌉ largest |x| (D = 64 without "/<D>") as uint16 indices and
          2-bit codes (sign, which of two levels in the kept range [t, m]): src/transport/sparse_codec.h

Every operation is one fp32 operation per element in numpy (x / s, q · s, base + Û), so the results are the C++
ones bit for bit: the final-copy check (every learner's Θ_p hashes equal to the syncer's) depends on it.
"""
import numpy as np

DEFAULT_BLOCK = {"q8": 256, "q4": 64}
Q_MAX = {"q8": 127, "q4": 7}
MAX_BLOCK = 1 << 16


class CodecError(ValueError):
    """A payload that does not decode, or values an integer codec cannot carry (NaN, infinity)."""


def _parse(name):
    """("q8", 256) for "q8/256"; (name, 0) for fp32 and bf16; None for anything else."""
    if name in ("fp32", "bf16"):
        return name, 0
    if len(name) >= 4 and name[:2] in ("q8", "q4") and name[2] == "/" and name[3:].isascii() and name[3:].isdigit() and len(name) <= 9:
        block = int(name[3:])
        if 1 <= block <= MAX_BLOCK:
            return name[:2], block
    return None


def encoded_bytes(codec, n, block=0):
    block = block or DEFAULT_BLOCK.get(codec, 0)
    if codec == "fp32":
        return 4 * n
    if codec == "bf16":
        return 2 * n
    values = n if codec == "q8" else (n + 1) // 2
    return 8 + 4 * ((n + block - 1) // block) + values


SPARSE_CHUNK = 4096   # "topk": chunks of C values (src/transport/sparse_codec.h)
SPARSE_DENSITY = 64   # D by default: one value kept in D of a chunk, k = ⌈L / D⌉ (diloco.topk_density)
SPARSE_MIN_CHUNK, SPARSE_MAX_CHUNK = 64, 1 << 16
SPARSE_MIN_DENSITY, SPARSE_MAX_DENSITY = 2, 1024


def _bounded(digits, lo, hi):
    """A whole number in [lo, hi] written without sign or leading zeros; None otherwise."""
    if not digits or len(digits) > 6 or not (digits.isascii() and digits.isdigit()) or digits[0] == "0":
        return None
    v = int(digits)
    return v if lo <= v <= hi else None


def _sparse_layout(name):
    """(4096, 64) for "topk/4096", (4096, 16) for "topk/4096/16"; None for anything else."""
    if len(name) > 16 or not name.startswith("topk/"):
        return None
    parts = name[5:].split("/")
    if len(parts) > 2:
        return None
    chunk = _bounded(parts[0], SPARSE_MIN_CHUNK, SPARSE_MAX_CHUNK)
    density = SPARSE_DENSITY if len(parts) == 1 else _bounded(parts[1], SPARSE_MIN_DENSITY, SPARSE_MAX_DENSITY)
    if len(parts) == 2 and density == SPARSE_DENSITY:
        return None  # one spelling per layout: the default density is never written out
    return None if chunk is None or density is None else (chunk, density)


def _kept(length, density):
    return (length + density - 1) // density


def _kept_total(n, chunk, density):
    full, rest = divmod(n, chunk)
    return full * _kept(chunk, density) + _kept(rest, density)


def sparse_bytes(n, chunk=SPARSE_CHUNK, density=SPARSE_DENSITY):
    k = _kept_total(n, chunk, density)
    return 8 + 8 * ((n + chunk - 1) // chunk) + 2 * k + (k + 3) // 4


def _levels(t, m):
    """The two magnitude levels of a chunk whose kept magnitudes span [t, m], in fp32 as the C++ computes them."""
    t, m = np.float32(t), np.float32(m)
    quarter = (m - t) * np.float32(0.25)  # exact: a power of two
    return np.float32(t + quarter), np.float32(m - quarter)


def sparse_encode(x, chunk=SPARSE_CHUNK, density=SPARSE_DENSITY):
    """("topk/<C>[/<D>]", bytes): per chunk the ⌈L/D⌉ largest |x| (ties: the lower index), as indices and 2-bit codes
    ("/<D>" only when D is not 64)."""
    n = x.size
    nc = (n + chunk - 1) // chunk
    ranges, indices, codes = np.zeros(2 * nc, "<f4"), [], []
    for c in range(nc):
        seg = x[c * chunk:(c + 1) * chunk]
        k = _kept(seg.size, density)
        mag = np.abs(seg)
        order = np.sort(np.argsort(-mag, kind="stable")[:k])
        kept = mag[order]
        t, m = np.float32(kept.min()), np.float32(kept.max())
        middle = np.float32(t + (m - t) * np.float32(0.5))
        ranges[2 * c], ranges[2 * c + 1] = t, m
        indices.append(order.astype("<u2"))
        codes.append((kept >= middle).astype(np.uint8) | (np.signbit(seg[order]).astype(np.uint8) << 1))
    idx = np.concatenate(indices) if indices else np.zeros(0, "<u2")
    code = np.concatenate(codes) if codes else np.zeros(0, np.uint8)
    padded = np.zeros((code.size + 3) // 4 * 4, np.uint8)
    padded[:code.size] = code
    packed = padded[0::4] | (padded[1::4] << 2) | (padded[2::4] << 4) | (padded[3::4] << 6)
    header = np.array([n], dtype="<u8").tobytes()
    name = "topk/%d" % chunk + ("" if density == SPARSE_DENSITY else "/%d" % density)
    return name, header + ranges.tobytes() + idx.astype("<u2").tobytes() + packed.astype(np.uint8).tobytes()


def sparse_decode(name, chunk, density, data, expected_numel=-1):
    if len(data) < 8:
        raise CodecError("a %s payload shorter than its 8-byte header" % name)
    n = int(np.frombuffer(data[:8], dtype="<u8")[0])
    if n > 2**31 - 1:
        raise CodecError("a %s payload claiming %d values" % (name, n))
    if expected_numel >= 0 and n != expected_numel:
        raise CodecError("%d %s values where %d were expected" % (n, name, expected_numel))
    want = sparse_bytes(n, chunk, density)
    if len(data) != want:
        raise CodecError("%d bytes where %d %s values take %d" % (len(data), n, name, want))
    nc, K = (n + chunk - 1) // chunk, _kept_total(n, chunk, density)
    ranges = np.frombuffer(data[8:8 + 8 * nc], dtype="<f4").astype(np.float32)
    idx = np.frombuffer(data[8 + 8 * nc:8 + 8 * nc + 2 * K], dtype="<u2").astype(np.int64)
    packed = np.frombuffer(data[8 + 8 * nc + 2 * K:], dtype=np.uint8)
    if K % 4 and packed[K // 4] >> (2 * (K % 4)):
        raise CodecError("the unused bits of a %s payload's last byte are not zero" % name)
    code = np.stack([(packed >> s) & 3 for s in (0, 2, 4, 6)], axis=1).reshape(-1)[:K]
    out = np.zeros(n, np.float32)
    at = 0
    for c in range(nc):
        t, m = ranges[2 * c], ranges[2 * c + 1]
        if not (np.isfinite(t) and np.isfinite(m) and t >= 0 and t <= m):
            raise CodecError("chunk %d of a %s payload has the range [%s, %s] (must be finite with 0 ≤ t ≤ m)"
                             % (c, name, t, m))
        length = min(n, (c + 1) * chunk) - c * chunk
        k = _kept(length, density)
        ix, cd = idx[at:at + k], code[at:at + k]
        if k and (ix.max() >= length or np.any(np.diff(ix) <= 0)):
            raise CodecError("an index of chunk %d of a %s payload is outside the chunk or not after the one before"
                             % (c, name))
        lo, hi = _levels(t, m)
        mag = np.where(cd & 1, hi, lo).astype(np.float32)
        out[c * chunk + ix] = np.where(cd & 2, -mag, mag)
        at += k
    return out


def float_to_bf16(x):
    """(n,) float32 -> (n,) uint16: round to nearest even; NaN stays a quiet NaN with its sign."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
    return np.where(nan, (bits >> 16) | 0x0040, rounded).astype("<u2")


def bf16_to_float(h):
    return (np.asarray(h, dtype="<u2").astype(np.uint32) << 16).view("<f4")


def encode(values, codec, block=0, density=0):
    """(codec name on the wire, bytes) for (n,) float32 `values`. `codec`: "fp32" | "bf16" | "q8" | "q4" | "topk" (block
    0 = the default; topk keeps one value in `density`, 0 = 64). Raises CodecError for q8/q4/topk when a value is not
    finite (it would poison its block's scale)."""
    x = np.ascontiguousarray(values, dtype="<f4")
    if codec == "fp32":
        return "fp32", x.tobytes()
    if codec == "bf16":
        return "bf16", float_to_bf16(x).tobytes()
    if codec not in Q_MAX and codec != "topk":
        raise CodecError("unknown wire codec '%s' (expected \"fp32\", \"bf16\", \"q8\", \"q4\" or \"topk\")" % codec)
    if not np.all(np.isfinite(x)):
        i = int(np.argmin(np.isfinite(x)))
        raise CodecError("cannot encode value %d (%s) as %s: a NaN or an infinity would poison its block's scale"
                         % (i, x[i], codec))
    if codec == "topk":
        chunk = block or SPARSE_CHUNK
        if not SPARSE_MIN_CHUNK <= chunk <= SPARSE_MAX_CHUNK:
            raise CodecError("chunk of %d values for topk: must be in [%d, %d]" % (chunk, SPARSE_MIN_CHUNK, SPARSE_MAX_CHUNK))
        density = density or SPARSE_DENSITY
        if not SPARSE_MIN_DENSITY <= density <= SPARSE_MAX_DENSITY:
            raise CodecError("topk density of one in %d: must be in [%d, %d]" % (density, SPARSE_MIN_DENSITY,
                                                                                SPARSE_MAX_DENSITY))
        return sparse_encode(x, chunk, density)
    block = block or DEFAULT_BLOCK[codec]
    if not 1 <= block <= MAX_BLOCK:
        raise CodecError("block of %d values for %s: must be in [1, %d]" % (block, codec, MAX_BLOCK))
    n, qm = x.size, np.float32(Q_MAX[codec])
    nb = (n + block - 1) // block
    padded = np.zeros(nb * block, dtype=np.float32)  # zeros change no block's max|x|
    padded[:n] = x
    blocks = padded.reshape(nb, block)                                # (nb, B)
    scales = (np.abs(blocks).max(axis=1) if nb else np.zeros(0, np.float32)) / qm  # (nb) fp32
    safe = np.where(scales > 0, scales, np.float32(1))
    q = np.rint(np.clip(blocks / safe[:, None], -qm, qm))             # round half to even
    q = np.where(scales[:, None] > 0, q, 0).astype(np.int8).reshape(-1)[:n]
    if codec == "q8":
        body = q.tobytes()
    else:
        nibbles = (q.astype(np.uint8) & 0x0F)
        if n % 2:
            nibbles = np.append(nibbles, np.uint8(0))
        body = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8).tobytes()
    header = np.array([n], dtype="<u8").tobytes()
    return "%s/%d" % (codec, block), header + scales.astype("<f4").tobytes() + body


def decode(name, data, expected_numel=-1):
    """(n,) float32 from a payload. Raises CodecError naming what is wrong: an unknown codec or block, a size other
    than the codec's for its values, a count other than `expected_numel` (≥ 0), a negative or non-finite scale (or
    one that would decode to infinity), an integer outside [−q_max, q_max], a non-zero unused nibble. Finiteness of
    fp32 and bf16 values is the caller's check."""
    layout = _sparse_layout(name)
    if layout is not None:
        return sparse_decode(name, layout[0], layout[1], data, expected_numel)
    parsed = _parse(name)
    if parsed is None:
        raise CodecError("unknown codec '%s'" % name[:32])
    codec, block = parsed
    if codec in ("fp32", "bf16"):
        width = 4 if codec == "fp32" else 2
        if len(data) % width:
            raise CodecError("%d bytes are not a whole number of %s values" % (len(data), codec))
        n = len(data) // width
        if expected_numel >= 0 and n != expected_numel:
            raise CodecError("%d %s values where %d were expected" % (n, codec, expected_numel))
        if codec == "fp32":
            return np.frombuffer(data, dtype="<f4").astype(np.float32)
        return bf16_to_float(np.frombuffer(data, dtype="<u2"))
    if len(data) < 8:
        raise CodecError("a %s payload shorter than its 8-byte header" % name)
    n = int(np.frombuffer(data[:8], dtype="<u8")[0])
    if n > 2**31 - 1:
        raise CodecError("a %s payload claiming %d values" % (name, n))
    if expected_numel >= 0 and n != expected_numel:
        raise CodecError("%d %s values where %d were expected" % (n, name, expected_numel))
    want = encoded_bytes(codec, n, block)
    if len(data) != want:
        raise CodecError("%d bytes where %d %s values take %d" % (len(data), n, name, want))
    nb = (n + block - 1) // block
    qm = Q_MAX[codec]
    scales = np.frombuffer(data[8:8 + 4 * nb], dtype="<f4").astype(np.float32)
    bad = ~np.isfinite(scales) | (scales < 0) | (scales > np.float32(np.finfo(np.float32).max / np.float32(qm)))
    if bad.any():
        b = int(np.argmax(bad))
        raise CodecError("block %d of a %s payload has scale %s (must be finite, ≥ 0 and decode to finite values)"
                         % (b, name, scales[b]))
    body = np.frombuffer(data[8 + 4 * nb:], dtype=np.uint8)
    if codec == "q8":
        q = body.view(np.int8)
        outside = q == -128
    else:
        if n % 2 and body[n // 2] >> 4:
            raise CodecError("the unused half of a %s payload's last byte is not zero" % name)
        nibbles = np.empty(2 * body.size, dtype=np.uint8)
        nibbles[0::2], nibbles[1::2] = body & 0x0F, body >> 4
        nibbles = nibbles[:n]
        outside = nibbles == 8
        q = ((nibbles ^ 8).astype(np.int8) - 8).astype(np.int8)
    if outside.any():
        raise CodecError("value %d of a %s payload is %d, outside [−%d, %d]"
                         % (int(np.argmax(outside)), name, -128 if codec == "q8" else -8, qm, qm))
    per_value = np.repeat(scales, block)[:n]
    return q.astype(np.float32) * per_value  # fp32 product, as the C++'s static_cast<float>(q) * scale


def apply_update(base, name, data):
    """Θ_p at the next version = base + decode(update), in fp32 (the one formula of the compressed downlink).
    Raises CodecError as decode() does, or when a sum is not finite."""
    update = decode(name, data, expected_numel=len(base))
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused just below
        out = np.asarray(base, dtype=np.float32) + update
    if not np.all(np.isfinite(out)):
        raise CodecError("value %d of the updated fragment is not finite" % int(np.argmin(np.isfinite(out))))
    return out


class ErrorFeedback:
    """What the codec dropped from the last vector is added to the next (wire::ErrorFeedback): one per fragment."""

    def __init__(self, decay=1.0, density=0):
        self.residual = None
        self.decay = np.float32(decay)  # β (diloco.error_feedback_decay): the carried error is β·e
        self.density = density          # topk: one value kept in D (diloco.topk_density; 0 = 64)

    def encode(self, values, codec):
        x = np.asarray(values, dtype=np.float32)
        if self.residual is not None and self.residual.size == x.size:
            x = x + (self.residual if self.decay == 1 else self.decay * self.residual)
        try:
            name, data = encode(x, codec, 0, self.density)
        except CodecError:
            self.residual = None
            raise
        self.residual = x - decode(name, data, x.size)
        return name, data

    def reset(self):
        self.residual = None
