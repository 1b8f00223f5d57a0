#!/usr/bin/env python3
"""Independent safetensors reader (Python standard library only) used to check dloco's C++ writer.

Written from the format description, not from the C++ code: 8-byte little-endian header length N, N bytes of
JSON header ({name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}}),
then the raw little-endian data, tensors contiguous without holes.

Usage: safetensors_reader.py FILE  -> prints {"metadata": {...}, "header_len": N,
                                              "tensors": {name: {"dtype", "shape", "offsets", "values"}}}
Values are decoded to Python numbers (non-finite floats as the strings "nan", "inf", "-inf").
Exits with status 2 and a message on stderr if the file breaks the format.
"""
import json
import math
import struct
import sys

# dtype -> (struct code, bytes per element)
DTYPES = {
    "F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": (None, 2),
    "I64": ("q", 8), "I32": ("i", 4), "I16": ("h", 2), "I8": ("b", 1), "U8": ("B", 1), "BOOL": ("?", 1),
}


def fail(message):
    print("safetensors_reader: " + message, file=sys.stderr)
    sys.exit(2)


def decode(dtype, raw, count):
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % count, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    code, _ = DTYPES[dtype]
    return list(struct.unpack("<%d%s" % (count, code), raw))


def jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, bool):
        return int(x)
    return x


def main(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        fail("header length %d beyond end of file" % n)
    if (8 + n) % 8 != 0:
        fail("data does not start 8-byte aligned (header length %d)" % n)
    text = blob[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        fail("header does not start with '{'")
    if text.rstrip(" ") != text.rstrip():
        fail("header padding is not spaces")
    header = json.loads(text)
    data = blob[8 + n:]
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("__metadata__ must map strings to strings")
    spans = sorted((entry["data_offsets"][0], entry["data_offsets"][1], name) for name, entry in header.items())
    position = 0
    for begin, end, name in spans:
        if begin != position:
            fail("tensor %s starts at %d, expected %d" % (name, begin, position))
        position = end
    if position != len(data):
        fail("tensors cover %d bytes, data holds %d" % (position, len(data)))
    tensors = {}
    for name, entry in header.items():
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            fail("unknown dtype " + dtype)
        count = 1
        for d in shape:
            count *= d
        if count * DTYPES[dtype][1] != end - begin:
            fail("tensor %s: %d bytes for shape %s of %s" % (name, end - begin, shape, dtype))
        values = decode(dtype, data[begin:end], count)
        tensors[name] = {"dtype": dtype, "shape": shape, "offsets": [begin, end],
                         "values": [jsonable(v) for v in values]}
    # The order of the header's keys is the writer's order; report it too.
    order = [name for name in json.loads(text) if name != "__metadata__"]
    json.dump({"metadata": metadata, "header_len": n, "order": order, "tensors": tensors}, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        fail("usage: safetensors_reader.py FILE")
    main(sys.argv[1])
