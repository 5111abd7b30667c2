"""A tiny GPT-like decoder used to record traceprof's sample traces.

Attention is written out by hand (``baddbmm`` for the masked, scaled ``q @ k^T``, softmax,
``bmm`` with ``v``) rather than with ``F.scaled_dot_product_attention`` so that every matmul of the
model is an ``aten::mm`` / ``aten::bmm`` / ``aten::baddbmm`` that torch.profiler's ``with_flops``
counts; the CPU SDPA kernel has no FLOP formula and would hide the attention FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    """Model shape.

    Attributes:
        vocab: Vocabulary size (tokens).
        seq: Context length (tokens).
        d_model: Residual width (features).
        n_heads: Attention heads; ``d_model`` must be divisible by it.
        n_layers: Transformer blocks.
        extra_matmul: Add one parameter-free ``(B*T, d_model) @ (d_model, 4*d_model)`` matmul
            per block, added to the MLP's hidden activation (a fixed buffer, not a parameter, so
            gradients and collectives are unchanged): a pure compute regression for diff tests,
            +2*B*T*d*4d FLOPs forward and the same again backward (grad of its input) per block.
        extra_cols: Width of that extra matmul's output (0: ``4*d_model`` when ``extra_matmul``);
            another (``(B*T, d) @ (d, cols)``, zero-padded or cut to ``4*d_model`` before the
            add) scales the added FLOPs: +17.8 % * cols / (4*d_model) with the default shape.
    """

    vocab: int = 512
    seq: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    extra_matmul: bool = False
    extra_cols: int = 0


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention then a 4x GELU MLP.

    No biases (as in LLaMA and nanoGPT's ``bias=False``) and non-parametric LayerNorms (as in
    OLMo): fewer parameter tensors means fewer per-parameter DDP/autograd events, which keeps
    the sample traces small.
    """

    mask_add: torch.Tensor
    extra_w: torch.Tensor | None

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(d, elementwise_affine=False)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d, elementwise_affine=False)
        self.fc = nn.Linear(d, 4 * d, bias=False)
        self.out = nn.Linear(4 * d, d, bias=False)
        # Additive causal mask (0 on and below the diagonal, -inf above), fed to baddbmm.
        mask = torch.full((cfg.seq, cfg.seq), float("-inf")).triu(diagonal=1)
        self.register_buffer("mask_add", mask, persistent=False)
        cols = cfg.extra_cols or 4 * d
        # A plain attribute, not a buffer: DDP broadcasts buffers at start-up, and with the extra
        # matmul on one rank only (a compute straggler) the ranks' buffer sets would differ. The
        # same seed gives every rank the same values.
        self.extra_w = torch.randn(d, cols) * d**-0.5 if cfg.extra_matmul else None
        self.pad_cols = 4 * d - cols

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h, hd = self.n_heads, d // self.n_heads
        # (b, t, 3d) -> (3, b*h, t, hd); then scores = mask + q @ k^T / sqrt(hd) in one baddbmm
        # (as GPT-NeoX/Bloom do), which keeps the op count (and the trace) small.
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, b * h, t, hd).unbind(0)
        att = torch.baddbmm(self.mask_add[:t, :t], q, k.transpose(1, 2), alpha=hd**-0.5)
        y = torch.bmm(att.softmax(dim=-1), v).view(b, h, t, hd).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        u = self.ln2(x)
        hidden = self.fc(u)
        if self.extra_w is not None:
            more = u @ self.extra_w
            if self.pad_cols > 0:
                more = F.pad(more, (0, self.pad_cols))
            elif self.pad_cols < 0:
                more = more[..., : hidden.shape[-1]]
            hidden = hidden + more
        return x + self.out(F.gelu(hidden))


class TinyGPT(nn.Module):
    """Token + position embeddings, ``n_layers`` blocks, final LayerNorm, untied LM head.

    Parameters: 2 embeddings, 4 weight matrices per block, the head (no biases, no LayerNorm
    weights): 11 tensors, 532,480 values with the default config.
    """

    pos_ids: torch.Tensor

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, elementwise_affine=False)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        self.register_buffer("pos_ids", torch.arange(cfg.seq), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Return logits of shape ``(batch, seq, vocab)`` for token ids ``idx`` ``(batch, seq)``."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(self.pos_ids[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
