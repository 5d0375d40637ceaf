"""The toy kind's module: the model builds it as ``GatedAttention(model_config, layer, backend)``."""

from __future__ import annotations

import torch
from torch import nn

from diffsweep.model.attention.base import AttentionModule


class GatedAttention(AttentionModule):
    """``gate * softmax(QKᵀ/√d) V``, the gate one learned scalar per layer (initialised to 1)."""

    def __init__(self, cfg, layer, backend) -> None:
        super().__init__()
        a = cfg.attention
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.backend = backend
        D, h, hkv, d = cfg.d_model, a.num_heads, a.num_kv_heads, a.head_dim
        self.wq = nn.Linear(D, h * d, bias=False)
        self.wk = nn.Linear(D, hkv * d, bias=False)
        self.wv = nn.Linear(D, hkv * d, bias=False)
        self.wo = nn.Linear(h * d, D, bias=False)
        self.gate = nn.Parameter(torch.empty(1))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.gate)

    def project(self, x, rope):
        B, T, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = rope.apply(self.wq(x).view(B, T, h, d).transpose(1, 2))
        k = rope.apply(self.wk(x).view(B, T, hkv, d).transpose(1, 2))
        v = self.wv(x).view(B, T, hkv, d).transpose(1, 2)
        return q, k, v

    def core(self, q, k, v):
        B, _, T, d = q.shape
        out = self.backend.attend(q, k, v, scale=d**-0.5)
        return (self.gate.to(out.dtype) * out).transpose(1, 2).reshape(B, T, self.num_heads * d)

    def probe(self, x):
        return {"gate": float(self.gate)}
