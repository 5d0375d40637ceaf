"""Baseline softmax attention (LLaMA-style MHA/GQA), optionally with a per-head RMSNorm."""

from __future__ import annotations

import torch
from torch import nn

from diffsweep.config import ResolvedModel
from diffsweep.model.attention.backends import AttentionBackend
from diffsweep.model.attention.base import AttentionModule
from diffsweep.model.layers import HEAD_NORMS, Rotary


class StandardAttention(AttentionModule[torch.Tensor, torch.Tensor, torch.Tensor]):
    """Causal multi-head attention with RoPE, h heads of dim d on h_kv K/V heads (GQA).

    Parameter layout (``nn.Linear`` weights are ``(out, in)``):

    - ``wq.weight`` ``(h*d, D)``: rows ``[i*d:(i+1)*d]`` are query head i.
    - ``wk.weight``, ``wv.weight`` ``(h_kv*d, D)``: rows ``[g*d:(g+1)*d]`` are K/V head g;
      query head i uses K/V head ``i // (h / h_kv)``.
    - ``wo.weight`` ``(D, h*d)``: columns ``[i*d:(i+1)*d]`` read head i.
    - ``head_norm.weight`` ``(d,)`` (only with ``head_norm: rmsnorm``, Table 6 "+GroupNorm"):
      one RMSNorm gain over each head's d channels, shared by all heads.
    """

    def __init__(self, cfg: ResolvedModel, layer: int, backend: AttentionBackend) -> None:
        super().__init__()
        a = cfg.attention
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.backend = backend
        D, h, hkv, d = cfg.d_model, a.num_heads, a.num_kv_heads, a.head_dim
        self.wq = nn.Linear(D, h * d, bias=False)
        self.wk = nn.Linear(D, hkv * d, bias=False)
        self.wv = nn.Linear(D, hkv * d, bias=False)
        self.wo = nn.Linear(h * d, D, bias=False)
        self.head_norm = HEAD_NORMS[a.head_norm](d, cfg.norm_eps)

    def project(self, x: torch.Tensor, rope: Rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        q_bhtd = rope.apply(self.wq(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2))
        k_bhtd = rope.apply(self.wk(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2))
        v_bhtd = self.wv(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return q_bhtd, k_bhtd, v_bhtd

    def core(self, q_bhtd: torch.Tensor, k_bhtd: torch.Tensor, v_bhtd: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = q_bhtd.shape
        out_bhtd = self.backend.attend(q_bhtd, k_bhtd, v_bhtd, scale=self.head_dim**-0.5)
        if self.head_norm is not None:
            out_bhtd = self.head_norm(out_bhtd)
        return out_bhtd.transpose(1, 2).reshape(B, T, self.num_heads * self.head_dim)
