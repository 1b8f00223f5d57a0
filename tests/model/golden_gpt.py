#!/usr/bin/python3
"""Golden reference of dloco's GPT: the same model written again from scratch in PyTorch (Debian's python3-torch).

Reads IN (safetensors written by tests/model/golden_test.cc): every model parameter under its dloco name, the batch
"idx" and "targets" (B, T) int64, and the model shape in "__metadata__". Computes, in float64 from those fp32
parameters, the logits, the mean next-token cross-entropy and the gradient of that loss with respect to every
parameter, and writes them to OUT (safetensors, F64): "logits" (B, T, V), "loss" (), "grad.<name>" per parameter.
Also prints one line with this script's own fp32 error (the same computation in float32 against float64), the
yardstick for the C++ side's fp32 error.

The model, from the paper's definitions (not from dloco's code, which this script must not import):
  x = wte[idx]                                   token embedding, no position embedding
  per block: x = x + attn(rmsnorm_1(x)); x = x + mlp(rmsnorm_2(x))   pre-norm residual blocks
  rmsnorm(x) = x / sqrt(mean(x^2) + eps) * g     (Zhang & Sennrich 2019), gain after the normalisation
  attn: q, k, v = split(x @ Wqkv^T, C), heads of hs = C / NH; RoPE on q and k; softmax(q k^T / sqrt(hs) + causal) v
  RoPE (Su et al. 2021), "halves" layout (GPT-NeoX): pair (x[i], x[i + hs/2]) rotated by t * theta^(-2i/hs)
  mlp: SwiGLU (Shazeer 2020) down(silu(gate(x)) * up(x)), width F = d_ff or round_up(8C/3, 64)
  logits = rmsnorm_f(x) @ wte^T (tied) or @ lm_head^T; loss = mean cross-entropy over B*T
No biases, no dropout.

The safetensors reader and writer here are numpy-only and written from the format (8-byte little-endian header
length, JSON header, raw little-endian data), independent of dloco's C++ ones.

Usage: /usr/bin/python3 golden_gpt.py IN OUT. Exit status 3 if torch or numpy cannot be imported (run
scripts/setup.sh), 2 on a malformed input, 0 on success.
"""
import json
import math
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("golden_gpt.py: %s cannot import torch/numpy (%s); install Debian's python3-torch and python3-numpy "
          "with scripts/setup.sh" % (sys.executable, e), file=sys.stderr)
    sys.exit(3)

NP_DTYPES = {"F64": np.float64, "F32": np.float32, "I64": np.int64, "I32": np.int32}
ST_DTYPES = {np.dtype(v): k for k, v in NP_DTYPES.items()}


def fail(message):
    print("golden_gpt.py: " + message, file=sys.stderr)
    sys.exit(2)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, entry in header.items():
        if entry["dtype"] not in NP_DTYPES:
            fail("tensor %s has dtype %s, expected one of %s" % (name, entry["dtype"], sorted(NP_DTYPES)))
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=np.dtype(NP_DTYPES[entry["dtype"]]).newbyteorder("<"))
        tensors[name] = array.reshape(entry["shape"]).copy()
    return tensors, metadata


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.array(array, order="C")  # not ascontiguousarray: it turns a 0-d scalar into shape (1,)
        raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": ST_DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((-len(text)) % 8)  # data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


class Shape:
    """The model shape from the input's metadata; missing keys are errors."""

    def __init__(self, meta):
        try:
            self.V = int(meta["vocab_size"])
            self.L = int(meta["n_layer"])
            self.NH = int(meta["n_head"])
            self.C = int(meta["d_model"])
            d_ff = int(meta["d_ff"])
            self.F = d_ff if d_ff > 0 else math.ceil(math.ceil(8 * self.C / 3) / 64) * 64  # round_up(8C/3, 64)
            self.tied = meta["tie_embeddings"] == "true"
            self.theta = float(meta["rope_theta"])
            self.eps = float(meta["norm_eps"])
        except KeyError as e:
            fail("metadata lacks %s" % e)
        self.hs = self.C // self.NH


def rmsnorm(x, g, eps):
    # x: (B, T, C), g: (C)
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps) * g


def rope(x, theta):
    # x: (B, NH, T, hs); the pair of dimension i < hs/2 is (i, i + hs/2), rotated by angle t * theta^(-2i/hs).
    T, hs = x.shape[-2], x.shape[-1]
    i = torch.arange(hs // 2, dtype=torch.float64)
    freq = 1.0 / (theta ** (2.0 * i / hs))                                        # (hs/2)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]       # (T, hs/2)
    cos = torch.cat([angle.cos(), angle.cos()], dim=-1).to(x.dtype)              # (T, hs)
    sin = torch.cat([angle.sin(), angle.sin()], dim=-1).to(x.dtype)
    rotated = torch.cat([-x[..., hs // 2:], x[..., :hs // 2]], dim=-1)          # (-x2, x1)
    return x * cos + rotated * sin


def attention(x, w_qkv, w_proj, s):
    B, T, C = x.shape
    q, k, v = (x @ w_qkv.t()).split(C, dim=-1)                                  # 3 x (B, T, C)
    q, k, v = (t.reshape(B, T, s.NH, s.hs).transpose(1, 2) for t in (q, k, v))  # (B, NH, T, hs)
    q, k = rope(q, s.theta), rope(k, s.theta)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(s.hs)                         # (B, NH, T, T)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()                          # key position <= query position
    scores = scores.masked_fill(~allowed, float("-inf"))
    y = F.softmax(scores, dim=-1) @ v                                            # (B, NH, T, hs)
    return y.transpose(1, 2).reshape(B, T, C) @ w_proj.t()


def forward(p, idx, s):
    x = p["wte.weight"][idx]                                                     # (B, T, C)
    for l in range(s.L):
        h = "h.%d." % l
        x = x + attention(rmsnorm(x, p[h + "ln_1.weight"], s.eps), p[h + "attn.qkv.weight"],
                          p[h + "attn.proj.weight"], s)
        n = rmsnorm(x, p[h + "ln_2.weight"], s.eps)
        x = x + (F.silu(n @ p[h + "mlp.gate.weight"].t()) * (n @ p[h + "mlp.up.weight"].t())) @ p[h + "mlp.down.weight"].t()
    x = rmsnorm(x, p["ln_f.weight"], s.eps)
    head = p["wte.weight"] if s.tied else p["lm_head.weight"]
    return x @ head.t()                                                          # (B, T, V)


def expected_names(s):
    names = ["wte.weight", "ln_f.weight"] + ([] if s.tied else ["lm_head.weight"])
    for l in range(s.L):
        names += ["h.%d.%s.weight" % (l, m) for m in
                  ("ln_1", "attn.qkv", "attn.proj", "ln_2", "mlp.gate", "mlp.up", "mlp.down")]
    return names


def expected_shapes(s):
    shapes = {"wte.weight": (s.V, s.C), "ln_f.weight": (s.C,), "lm_head.weight": (s.V, s.C)}
    for l in range(s.L):
        h = "h.%d." % l
        shapes.update({h + "ln_1.weight": (s.C,), h + "attn.qkv.weight": (3 * s.C, s.C),
                       h + "attn.proj.weight": (s.C, s.C), h + "ln_2.weight": (s.C,),
                       h + "mlp.gate.weight": (s.F, s.C), h + "mlp.up.weight": (s.F, s.C),
                       h + "mlp.down.weight": (s.C, s.F)})
    return shapes


def run(params, idx, targets, s, dtype):
    p = {name: torch.tensor(a, dtype=dtype, requires_grad=True) for name, a in params.items()}
    logits = forward(p, idx, s)
    loss = F.cross_entropy(logits.reshape(-1, s.V), targets.reshape(-1))  # mean over B*T
    loss.backward()
    return logits.detach(), loss.detach(), {name: t.grad for name, t in p.items()}


def main(in_path, out_path):
    torch.set_num_threads(1)
    tensors, meta = read_safetensors(in_path)
    s = Shape(meta)
    idx = torch.from_numpy(tensors.pop("idx")).long()
    targets = torch.from_numpy(tensors.pop("targets")).long()
    names, shapes = expected_names(s), expected_shapes(s)
    if sorted(tensors) != sorted(names):
        fail("parameters %s, expected %s" % (sorted(tensors), sorted(names)))
    for name in names:
        if tuple(tensors[name].shape) != shapes[name]:
            fail("%s has shape %s, expected %s" % (name, tensors[name].shape, shapes[name]))

    logits, loss, grads = run(tensors, idx, targets, s, torch.float64)
    logits32, loss32, grads32 = run(tensors, idx, targets, s, torch.float32)
    out = {"logits": logits.numpy(), "loss": loss.numpy()}
    out.update({"grad." + name: grads[name].numpy() for name in names})
    write_safetensors(out_path, out)

    grad_err = max(((grads32[n].double() - grads[n]).abs().max() / grads[n].abs().max()).item() for n in names)
    print("golden_gpt.py: PyTorch's own fp32 error vs fp64: loss %.3g, logits max abs %.3g, "
          "grads max abs / tensor max %.3g" % (abs(loss32.item() - loss.item()),
                                              (logits32.double() - logits).abs().max().item(), grad_err))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail("usage: golden_gpt.py IN OUT")
    main(sys.argv[1], sys.argv[2])
