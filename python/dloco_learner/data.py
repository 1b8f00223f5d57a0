"""Token shards, data streams with exact cursors, and the stream log (src/data/shards.h, stream.h, stream_log.h).

Shard file (little-endian): "DLOCOTOK", uint32 version 1, uint32 bytes per token (2 or 4), uint32 vocabulary,
uint32 header bytes (64), uint64 token count, zeros to byte 64, the tokens. A split (train) is its shards
train_*.bin in name order, concatenated. A batch is B rows of T + 1 tokens (inputs a row's first T, targets its last
T). Contiguous: stream s of S covers tokens [s·L, (s+1)·L), L = size // S, row r of a batch is tokens [p + r·T,
p + r·T + T] at the cursor's position p, which then moves B·T and wraps (epoch + 1) when the next batch would not fit.
Shuffled: every row from its own slot of T tokens, as src/data/stream.h lays them out.
The stream log (run_dir/streams/stream_<s>.jsonl, locked with flock while held) records each batch's cursor before
it is trained, so a restart resumes one batch after the last record: no batch trained twice, none skipped.
"""
import fcntl
import json
import os
from pathlib import Path

import numpy as np

from .config import ConfigError

MAGIC = b"DLOCOTOK"
HEADER_BYTES = 64


class StreamBusy(ConfigError):
    """Another live process holds the stream's log."""


def read_shard(path):
    """The tokens of one shard as a read-only memory map (uint16 or uint32). ConfigError naming what is wrong."""
    with open(path, "rb") as f:
        header = f.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or header[:8] != MAGIC:
        raise ConfigError("%s: wrong magic: not a dloco token shard" % path)
    version, width, vocab, header_size = np.frombuffer(header[8:24], dtype="<u4")
    count = int(np.frombuffer(header[24:32], dtype="<u8")[0])
    if version != 1 or width not in (2, 4) or header_size != HEADER_BYTES:
        raise ConfigError("%s: shard version %d, %d bytes per token, header %d: this reader takes version 1, 2 or 4 "
                          "bytes, 64" % (path, version, width, header_size))
    if os.path.getsize(path) != HEADER_BYTES + count * int(width):
        raise ConfigError("%s: the file's size does not match its %d tokens (truncated?)" % (path, count))
    tokens = np.memmap(path, dtype="<u2" if width == 2 else "<u4", mode="r", offset=HEADER_BYTES, shape=(count,))
    return tokens, int(vocab)


class TokenSplit:
    """One split's shards, concatenated."""

    def __init__(self, data_dir, split="train"):
        paths = sorted(p for p in Path(data_dir).glob(split + "_*.bin"))
        if not paths:
            raise ConfigError("no %s shards in '%s': prepare the corpus first, e.g. `dloco data prepare --kjv --out "
                              "%s`" % (split, data_dir, data_dir))
        read = [read_shard(p) for p in paths]
        self.shards = [tokens for tokens, _ in read]
        self.vocab = min(vocab for _, vocab in read)
        self.starts = np.cumsum([0] + [s.size for s in self.shards])
        self.size = int(self.starts[-1])

    def copy(self, begin, count):
        """Tokens [begin, begin + count) as int64."""
        out = np.empty(count, dtype=np.int64)
        at, i = 0, int(np.searchsorted(self.starts, begin, side="right")) - 1
        while at < count:
            shard, lo = self.shards[i], begin + at - int(self.starts[i])
            take = min(count - at, shard.size - lo)
            out[at:at + take] = shard[lo:lo + take]
            at, i = at + take, i + 1
        if count and int(out.max()) >= self.vocab:  # a corrupt shard must not reach the embedding lookup
            raise ConfigError("token shards hold token id %d near position %d, outside their vocabulary of %d: a "
                              "shard is corrupt (re-run `dloco data prepare`)" % (int(out.max()), begin, self.vocab))
        return out


_M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class DataStream:
    """Stream `index` of `count` over a split, read through a cursor {stream, position, epoch, tokens_served}; laid out
    as data.order says (src/data/stream.h): "contiguous" (the index-th of count ranges, in order) or "shuffled" (each
    row of a batch from its own slot of T tokens, the count-th slots of the whole split in a seeded pseudo-random
    permutation per epoch)."""

    def __init__(self, split, index, count, batch_size, seq_len, cursor, order="contiguous"):
        self.split, self.step_tokens = split, batch_size * seq_len
        self.batch_size, self.seq_len = batch_size, seq_len
        self.index, self.count, self.order = index, count, order
        self.cursor = dict(cursor)
        if order == "shuffled":
            n = (split.size - 1) // seq_len
            self.slots = (n - index + count - 1) // count if n > index else 0
            self.length, self.begin = self.slots // batch_size * self.step_tokens + 1, 0
            self.half_bits = 1  # π works on 2·half_bits bits, the fewest with 2^bits ≥ n_s
            while (1 << (2 * self.half_bits)) < self.slots:
                self.half_bits += 1
            if self.slots < batch_size:
                raise ConfigError('data stream %d of %d (data.order = "shuffled") gets %d row slots, fewer than one '
                                  "batch of B = %d: the split's %d tokens hold %d slots of T = %d tokens; use fewer "
                                  "streams, a smaller batch, or more data"
                                  % (index, count, self.slots, batch_size, split.size, n, seq_len))
        else:
            self.length = split.size // count
            self.begin = index * self.length
            if self.length < self.step_tokens + 1:
                raise ConfigError("data stream %d of %d holds %d tokens, fewer than one batch window of %d: use fewer "
                                  "streams, a smaller batch, or more data" % (index, count, self.length,
                                                                              self.step_tokens + 1))
        if self.cursor["stream"] != index or self.cursor["position"] + self.step_tokens + 1 > self.length or \
                (order == "shuffled" and self.cursor["position"] % self.step_tokens):
            raise ConfigError("data stream cursor %s does not belong to stream %d of length %d (batch windows of %d "
                              "tokens)" % (json.dumps(self.cursor), index, self.length, self.step_tokens))
        self._draw_permutation()

    def _draw_permutation(self):
        if self.order != "shuffled":
            return
        self.key = _splitmix64(_splitmix64(self.index) ^ self.cursor["epoch"])

    def _permuted(self, k):
        """π(k): a 4-round Feistel network keyed by the epoch's key, cycle-walked below n_s (as the C++)."""
        mask, x = (1 << self.half_bits) - 1, k
        while True:
            left, right = x >> self.half_bits, x & mask
            for r in range(4):
                left, right = right, left ^ (_splitmix64(right ^ _splitmix64((self.key + r) & _M64)) & mask)
            x = (left << self.half_bits) | right
            if x < self.slots:
                return x

    def row_begin(self, r):
        """The first token of row r of the batch the cursor points at, in the split."""
        if self.order != "shuffled":
            return self.begin + self.cursor["position"] + r * self.seq_len
        k = self.cursor["position"] // self.step_tokens
        return (self.index + self.count * self._permuted(k * self.batch_size + r)) * self.seq_len

    def next(self):
        """The next batch, B rows of T + 1 tokens flat ((B·(T + 1)) int64); moves the cursor."""
        B, T = self.batch_size, self.seq_len
        if self.order != "shuffled":
            span = self.split.copy(self.row_begin(0), B * T + 1)
            window = np.concatenate([np.asarray(span[r * T:r * T + T + 1], dtype=np.int64) for r in range(B)])
        else:
            window = np.concatenate([np.asarray(self.split.copy(self.row_begin(r), T + 1), dtype=np.int64)
                                     for r in range(B)])
        self.skip()
        return window

    def skip(self):
        c = self.cursor
        c["position"] += self.step_tokens
        c["tokens_served"] += self.step_tokens
        if c["position"] + self.step_tokens + 1 > self.length:  # the next window would not fit: wrap
            c["position"], c["epoch"] = 0, c["epoch"] + 1
            self._draw_permutation()


def parse_cursor(text, stream):
    """A cursor from the syncer's JSON ("" = the stream's start). ConfigError when malformed."""
    if not text:
        return {"stream": stream, "position": 0, "epoch": 0, "tokens_served": 0}
    try:
        j = json.loads(text)
        c = {k: int(j[k]) for k in ("stream", "position", "epoch", "tokens_served")}
    except (ValueError, KeyError, TypeError, OverflowError) as e:
        raise ConfigError("malformed data stream cursor %r: %s" % (text[:200], e)) from None
    if min(c.values()) < 0:
        raise ConfigError("malformed data stream cursor: negative field in %s" % text[:200])
    return c


class StreamLog:
    """The stream's log, held (flock) while this object lives. Format "dloco.stream_log" version 1."""

    def __init__(self, run_dir, stream):
        self.path = Path(run_dir) / "streams" / ("stream_%d.jsonl" % stream)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a+b")
        try:
            fcntl.flock(self.file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.close()
            raise StreamBusy("stream log %s is held by another live process" % self.path) from None
        self.file.seek(0)
        raw = self.file.read()
        complete = raw.rfind(b"\n") + 1
        if complete != len(raw):
            self.file.truncate(complete)  # a torn last line: that batch was never trained
        lines = [line for line in raw[:complete].decode("utf-8", "replace").split("\n") if line]
        self.last = None
        if not lines:
            self._append({"format": "dloco.stream_log", "version": 1})
            return
        try:
            first = json.loads(lines[0])
        except ValueError:
            first = None  # not JSON: parse_cursor below names the line
        if isinstance(first, dict) and "format" in first:
            if first.get("format") != "dloco.stream_log" or first.get("version") != 1:
                raise ConfigError("stream log %s, line 1: %s, expected \"dloco.stream_log\" version 1"
                                  % (self.path, lines[0][:200]))
            lines = lines[1:]
        if lines:
            self.last = parse_cursor(lines[-1], -1)

    def _append(self, record):
        self.file.write((json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n").encode())
        self.file.flush()

    def take(self, cursor, learner, step):
        """Records that the batch at `cursor` is about to be trained by `learner` at its step `step`."""
        self._append(dict(cursor, learner=learner, step=step))
        self.last = dict(cursor)

    def close(self):
        self.file.close()  # drops the lock
