"""DIFF V1: multi-head differential attention (paper eq. 1-3, Fig. 2)."""

from __future__ import annotations

import torch
from torch import nn

from diffsweep.config import ResolvedModel
from diffsweep.model.attention.backends import AttentionBackend
from diffsweep.model.attention.base import AttentionModule
from diffsweep.model.layers import HEAD_NORMS, Rotary, upcast

LAMBDA_STD = 0.1  # paper §2.1 / official code: λ vectors initialised N(0, 0.1)


class DiffAttentionV1(AttentionModule[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]):
    """Differential attention: ``(softmax(Q1 K1ᵀ/√d) − λ softmax(Q2 K2ᵀ/√d)) V`` per head.

    h heads (half the baseline's); each head has sub-heads Q1, Q2 of dim d and a V of dim 2d.
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init is one scalar per layer, shared by all heads.
    Output per head: ``(1 − λ_init) · RMSNorm(head)`` over its 2d channels (``head_norm: none``
    drops both the norm and the factor), then concatenated and projected by ``wo``.

    GQA: h_kv KV groups; each group owns one K1, one K2 (dim d) and one V (dim 2d). Head i's Q1
    attends with its group's K1 and Q2 with its group's K2, group = ``i // (h / h_kv)``.

    Parameter layout (``nn.Linear`` weights are ``(out, in)``), identical to the official
    ``multihead_flashdiff_1`` (sub-heads interleaved per head):

    - ``wq.weight`` ``(2*h*d, D)``: rows ``[(2i)*d:(2i+1)*d]`` are head i's Q1 and
      ``[(2i+1)*d:(2i+2)*d]`` its Q2.
    - ``wk.weight`` ``(2*h_kv*d, D)``: the same interleaving for group g's K1, K2.
    - ``wv.weight`` ``(h_kv*2d, D)``: rows ``[g*2d:(g+1)*2d]`` are group g's V.
    - ``wo.weight`` ``(D, h*2d)``: columns ``[i*2d:(i+1)*2d]`` read head i.
    - ``lambda_q1``, ``lambda_k1``, ``lambda_q2``, ``lambda_k2`` ``(d,)``: λ's re-parameterisation.
    - ``head_norm.weight`` ``(2d,)``: RMSNorm gain over a head's 2d channels, shared by the heads.
    - ``lambda_init`` (a float, not a parameter): from the config's strategy and depth. Held in a
      float64 buffer outside the state dict, so that a compiled block is one graph for every layer
      (a float attribute is a constant dynamo specialises on: one recompile per layer).
    """

    _lambda_init: torch.Tensor  # a buffer (see lambda_init)

    def __init__(self, cfg: ResolvedModel, layer: int, backend: AttentionBackend) -> None:
        super().__init__()
        a = cfg.attention
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.backend = backend
        D, h, hkv, d = cfg.d_model, a.num_heads, a.num_kv_heads, a.head_dim
        self.wq = nn.Linear(D, 2 * h * d, bias=False)
        self.wk = nn.Linear(D, 2 * hkv * d, bias=False)
        self.wv = nn.Linear(D, hkv * 2 * d, bias=False)
        self.wo = nn.Linear(h * 2 * d, D, bias=False)
        self.lambda_q1 = nn.Parameter(torch.empty(d))
        self.lambda_k1 = nn.Parameter(torch.empty(d))
        self.lambda_q2 = nn.Parameter(torch.empty(d))
        self.lambda_k2 = nn.Parameter(torch.empty(d))
        # depth-dependent, fixed (rule 5)
        self.register_buffer("_lambda_init", torch.tensor(a.parsed_lambda_init.for_layer(layer), dtype=torch.float64),
                             persistent=False)
        self.head_norm = HEAD_NORMS[a.head_norm](2 * d, cfg.norm_eps)

    @property
    def lambda_init(self) -> float:
        return float(self._lambda_init)

    @lambda_init.setter
    def lambda_init(self, value: float) -> None:
        self._lambda_init.fill_(value)

    def reset_parameters(self) -> None:
        """λ vectors N(0, 0.1) (the projections and the head norm are initialised by the model)."""
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, mean=0.0, std=LAMBDA_STD)

    def lambda_full(self) -> torch.Tensor:
        """The current λ of this layer (a 0-dim tensor, at least fp32)."""
        lam1 = torch.exp(torch.sum(upcast(self.lambda_q1) * upcast(self.lambda_k1)))
        lam2 = torch.exp(torch.sum(upcast(self.lambda_q2) * upcast(self.lambda_k2)))
        return lam1 - lam2 + self._lambda_init.to(lam1.dtype)  # rounded as a Python float would be

    def project(self, x: torch.Tensor, rope: Rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        # Sub-heads are interleaved per head (see the layout above): split them with one permute.
        q = rope.apply(self.wq(x).view(B, T, h, 2, d).permute(3, 0, 2, 1, 4))  # (2, B, h, T, d)
        k = rope.apply(self.wk(x).view(B, T, hkv, 2, d).permute(3, 0, 2, 1, 4))  # (2, B, h_kv, T, d)
        v_bhtd = self.wv(x).view(B, T, hkv, 2 * d).transpose(1, 2)  # (B, h_kv, T, 2d)
        return q[0], k[0], q[1], k[1], v_bhtd  # q1, k1, q2, k2: (B, h|h_kv, T, d) each

    def core(self, q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor,
             v_bhtd: torch.Tensor) -> torch.Tensor:
        B, _, T, d = q1.shape
        out_bhtd = self.backend.diff_attend(q1, k1, q2, k2, v_bhtd, self.lambda_full(), scale=d**-0.5)
        if self.head_norm is not None:
            out_bhtd = self.head_norm(out_bhtd, scale=1.0 - self._lambda_init)  # (1 − λ_init)·RMSNorm
        return out_bhtd.transpose(1, 2).reshape(B, T, self.num_heads * 2 * d)

    def probe(self, x: torch.Tensor) -> dict[str, float]:
        """This layer's λ (called inside the forward: FSDP shards the λ vectors outside it)."""
        return {"lambda": float(self.lambda_full())}
