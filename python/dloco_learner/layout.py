"""The fragment layout (docs/protocol.md §8; src/core/fragments.cc): LPT bin-packing of the model's tensors into P
fragments, its canonical text and hash, and moving fragments in and out of a model's parameters.

A fragment's flat buffer is its blocks concatenated; a block is rows [row_begin, row_end) of one tensor along
dimension 0, flattened row-major. Sizes are in elements (fp32 values).
"""
from dataclasses import dataclass, field

import numpy as np
import torch

from .handshake import fnv1a64


@dataclass
class Block:
    tensor: int      # index into Layout.tensors (name order)
    row_begin: int
    row_end: int
    offset: int      # elements into the tensor's flat data
    numel: int


@dataclass
class Fragment:
    blocks: list = field(default_factory=list)
    numel: int = 0


@dataclass
class Layout:
    tensors: list    # [(name, shape)] sorted by name
    fragments: list  # P Fragments
    total_numel: int
    hash: int


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _block(tensors, index, row_begin, row_end):
    row_numel = _numel(tensors[index][1][1:])
    return Block(index, row_begin, row_end, row_begin * row_numel, (row_end - row_begin) * row_numel)


def canonical_text(tensors, fragments):
    """The text the layout hash is taken over ("dloco-fragments-v1", then a line per tensor and per fragment)."""
    lines = ["dloco-fragments-v1"]
    lines += ["tensor %s [%s]" % (name, ",".join(map(str, shape))) for name, shape in tensors]
    for p, f in enumerate(fragments):
        lines.append("fragment %d" % p + "".join(" %d:%d-%d" % (b.tensor, b.row_begin, b.row_end) for b in f.blocks))
    return "\n".join(lines) + "\n"


def make_layout(specs, P, split_large_tensors=True):
    """The LPT layout of [(name, shape)] into P fragments (make_fragment_layout in src/core/fragments.cc).
    Raises ValueError if P exceeds the number of blocks."""
    if P < 1:
        raise ValueError("number of fragments P must be >= 1, got %d" % P)
    # 1. Canonical order: by name (bytewise, as std::string's operator<).
    tensors = sorted(((name, tuple(shape)) for name, shape in specs), key=lambda t: t[0].encode("utf-8"))
    total = sum(_numel(shape) for _, shape in tensors)
    # 2. Blocks: a tensor of ≥ 2 rows with numel·P > total is cut into n = min(rows, ⌈numel·P / total⌉) row ranges
    #    of near-equal rows, the first rows % n one row longer.
    blocks = []
    for i, (_, shape) in enumerate(tensors):
        numel, rows = _numel(shape), shape[0]
        if not split_large_tensors or rows < 2 or numel * P <= total:
            blocks.append(_block(tensors, i, 0, rows))
            continue
        n = min(rows, (numel * P + total - 1) // total)
        row = 0
        for k in range(n):
            take = rows // n + (1 if k < rows % n else 0)
            blocks.append(_block(tensors, i, row, row + take))
            row += take
    if P > len(blocks):
        raise ValueError("P = %d fragments but the model splits into only %d blocks" % (P, len(blocks)))
    # 3. LPT: largest block first (ties: tensor, then row_begin) into the lightest fragment (ties: lowest index).
    blocks.sort(key=lambda b: (-b.numel, b.tensor, b.row_begin))
    fragments = [Fragment() for _ in range(P)]
    for b in blocks:
        lightest = min(range(P), key=lambda p: (fragments[p].numel, p))
        fragments[lightest].blocks.append(b)
        fragments[lightest].numel += b.numel
    # 4. Canonical order inside a fragment: by tensor, then rows (the gather/scatter order).
    for f in fragments:
        f.blocks.sort(key=lambda b: (b.tensor, b.row_begin))
    return Layout(tensors, fragments, total, fnv1a64(canonical_text(tensors, fragments).encode("utf-8")))


class FragmentView:
    """A model's parameters seen through a layout: read and write fragment p as a flat fp32 numpy array."""

    def __init__(self, layout, named_parameters):
        params = dict(named_parameters)
        names = [name for name, _ in layout.tensors]
        if sorted(params) != names:
            raise ValueError("the model's parameters %s are not the layout's %s" % (sorted(params), names))
        self.layout = layout
        self.flat = [params[name].data.view(-1) for name in names]  # (numel) views sharing the parameters' storage

    def read(self, p):
        """Fragment p: (numel,) float32, a copy."""
        f = self.layout.fragments[p]
        parts = [self.flat[b.tensor][b.offset:b.offset + b.numel] for b in f.blocks]
        return torch.cat(parts).numpy().astype(np.float32, copy=True)

    def write(self, p, values):
        """Overwrites fragment p in place (the optimizer keeps its moments: the parameter tensors stay the same)."""
        f = self.layout.fragments[p]
        values = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        if values.numel() != f.numel:
            raise ValueError("fragment %d has %d values, the layout says %d" % (p, values.numel(), f.numel))
        with torch.no_grad():
            at = 0
            for b in f.blocks:
                self.flat[b.tensor][b.offset:b.offset + b.numel].copy_(values[at:at + b.numel])
                at += b.numel
