"""dloco's GPT in PyTorch (src/model/gpt.{h,cc}): RMSNorm, rotary positions (halves layout), SwiGLU, no biases,
optional tied embeddings; the inner AdamW (weight decay on matrices only), the warmup + cosine schedule, and one
inner step with gradient accumulation, global-norm clipping and the non-finite guard (src/train/trainer.cc).

Parameter names and shapes are the C++ model's ("wte.weight" (V, C), "h.<i>.attn.qkv.weight" (3C, C), …): they
key the fragment layout, whose hash the syncer checks at the join. Dimension letters: B batch, T sequence, C
d_model, NH heads, hs = C/NH, F SwiGLU width, V vocabulary, L layers.

Deliberately not here: generation, bf16, activation checkpointing (the C++ learner has them).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ff_dim


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · g (Zhang & Sennrich 2019)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))  # (C) gain
        self.eps = eps

    def forward(self, x):  # (..., C) -> (..., C)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x, cos, sin):
    """x: (..., T, hs); cos, sin: (T, hs/2). Pairs (x[i], x[i + hs/2]) rotated by t · theta^(−2i/hs)."""
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.n_head = NH
        self.qkv = nn.Linear(C, 3 * C, bias=False)   # C -> 3C
        self.proj = nn.Linear(C, C, bias=False)      # C -> C (residual projection)

    def forward(self, x, cos, sin, causal):  # x: (B, T, C); causal: (T, T) additive, −inf above the diagonal
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, hs).permute(2, 0, 3, 1, 4)  # 3 × (B, NH, T, hs)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs) + causal                     # (B, NH, T, T)
        y = torch.softmax(att, dim=-1) @ v                                           # (B, NH, T, hs)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) · up(x))."""

    def __init__(self, C, Fw):
        super().__init__()
        self.gate = nn.Linear(C, Fw, bias=False)
        self.up = nn.Linear(C, Fw, bias=False)
        self.down = nn.Linear(Fw, C, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.ln_1 = RMSNorm(m["d_model"], m["norm_eps"])
        self.attn = CausalSelfAttention(m["d_model"], m["n_head"])
        self.ln_2 = RMSNorm(m["d_model"], m["norm_eps"])
        self.mlp = MLP(m["d_model"], ff_dim(m))

    def forward(self, x, cos, sin, causal):
        x = x + self.attn(self.ln_1(x), cos, sin, causal)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, m):
        """`m`: the [model] section. Initialised as the C++ model (normal(0, init_std), residual projections scaled
        by 1/sqrt(2L), gains 1); a learner overwrites every value with Θ at its bootstrap anyway."""
        super().__init__()
        V, C, L, T = m["vocab_size"], m["d_model"], m["n_layer"], m["seq_len"]
        hs = C // m["n_head"]
        self.tied = m["tie_embeddings"]
        self.wte = nn.Embedding(V, C)
        self.h = nn.ModuleList([Block(m) for _ in range(L)])
        self.ln_f = RMSNorm(C, m["norm_eps"])
        if not self.tied:
            self.lm_head = nn.Linear(C, V, bias=False)
        inv_freq = m["rope_theta"] ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)     # (hs/2)
        angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq).float()        # (T, hs/2)
        self.register_buffer("rope_cos", angles.cos(), persistent=False)
        self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.register_buffer("causal", torch.full((T, T), float("-inf")).triu(1), persistent=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    residual = "attn.proj" in name or "mlp.down" in name
                    p.normal_(0.0, m["init_std"] / math.sqrt(2 * L) if residual else m["init_std"])

    def forward(self, idx):  # idx: (B, T) int64 -> logits (B, T, V)
        T = idx.size(1)
        cos, sin, causal = self.rope_cos[:T], self.rope_sin[:T], self.causal[:T, :T]
        x = self.wte(idx)  # (B, T, C)
        for block in self.h:
            x = block(x, cos, sin, causal)
        x = self.ln_f(x)
        return x @ self.wte.weight.t() if self.tied else self.lm_head(x)

    def loss(self, idx, targets):
        """Mean next-token cross-entropy, nats/token."""
        logits = self.forward(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def lr_at(cfg, step, rewarm_from=-1):
    """The inner learning rate at global step `step` (LrSchedule in src/core/lr_schedule.h): linear warmup, then cosine
    from train.lr to lr·min_lr_ratio at the budget's global steps (total_tokens over M learners' B·T·accum). With
    fresh AdamW moments from global step `rewarm_from` > 0 (a joiner amid warm learners) the warmup is repeated on
    its own steps: × min(1, (step − rewarm_from + 1)/warmup_steps)."""
    lr = _global_lr_at(cfg, step)
    warmup = cfg["train"]["warmup_steps"]
    if rewarm_from > 0 and warmup > 0 and rewarm_from <= step < rewarm_from + warmup:
        return lr * (step - rewarm_from + 1) / warmup
    return lr


def _global_lr_at(cfg, step):
    t = cfg["train"]
    peak, warmup, floor = t["lr"], t["warmup_steps"], t["min_lr_ratio"]
    per_step = t["batch_size"] * cfg["model"]["seq_len"] * t["grad_accum"] * max(1, cfg["diloco"]["learners"])
    total = max(1, t["total_tokens"] // per_step)
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    if step >= total:
        return peak * floor
    span = total - warmup
    progress = (step - warmup) / span if span > 0 else 1.0
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_adamw(model, train):
    """AdamW with train.lr, betas, eps; weight decay on tensors of dim ≥ 2 only (make_inner_adamw)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": train["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=train["lr"], betas=(train["beta1"], train["beta2"]), eps=train["adam_eps"])


class InnerTrainer:
    """One replica's inner optimisation (docs/protocol.md §3 steps 1–2)."""

    def __init__(self, model, cfg, rewarm_from=-1):
        """`rewarm_from`: the global step its fresh AdamW starts at when the run's are warm (> 0), else −1."""
        self.model, self.cfg, self.rewarm_from = model, cfg, rewarm_from
        self.optimizer = make_adamw(model, cfg["train"])

    def step(self, stream, step):
        """One optimizer step at global step `step` on grad_accum batches of `stream`. Returns (loss, tokens,
        skipped): a step whose loss or gradient norm is not finite leaves parameters and moments alone."""
        t = self.cfg["train"]
        B, T = t["batch_size"], self.cfg["model"]["seq_len"]
        lr = lr_at(self.cfg, step, self.rewarm_from)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        loss_sum, tokens = 0.0, 0
        for _ in range(t["grad_accum"]):
            rows = torch.from_numpy(stream.next()).view(B, T + 1)  # B rows of T + 1 tokens (src/data/stream.h)
            x, y = rows[:, :T].contiguous(), rows[:, 1:].contiguous()
            loss = self.model.loss(x, y)
            (loss / t["grad_accum"]).backward()
            loss_sum += loss.item()
            tokens += B * T
        loss = loss_sum / t["grad_accum"]
        max_norm = t["grad_clip"] if t["grad_clip"] > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        if not (math.isfinite(loss) and math.isfinite(norm)):
            self.optimizer.zero_grad(set_to_none=False)
            return loss, tokens, True
        self.optimizer.step()
        return loss, tokens, False
