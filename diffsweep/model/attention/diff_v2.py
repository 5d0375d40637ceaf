"""DIFF V2 (V2 blog): 2h query heads, one attention call, per-token per-head λ."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from diffsweep.config import ResolvedModel, V2Lambda, V2Pairing
from diffsweep.model.attention.backends import AttentionBackend
from diffsweep.model.attention.base import AttentionModule
from diffsweep.model.layers import Rotary, upcast
from diffsweep_kernels import reference


def _same_group(out: torch.Tensor, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    return out[:, 0::2], out[:, 1::2]  # query heads 2i and 2i+1 (V2)


def _cross_group(out: torch.Tensor, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    return out[:, :h], out[:, h:]  # query heads i and h+i (blog ablation 1)


def _identity(lam: torch.Tensor) -> torch.Tensor:
    return lam  # blog ablation 3: λ without sigmoid


# One registry per switch (named functions, so modules stay picklable): which query heads are
# subtracted, and how the projected λ becomes the weight (None: no projection, λ = 1; ablation 2).
PAIRINGS: dict[V2Pairing, Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]] = {
    V2Pairing.SAME_GROUP: _same_group,
    V2Pairing.CROSS_GROUP: _cross_group,
}
LAMBDA_ACTIVATIONS: dict[V2Lambda, Callable[[torch.Tensor], torch.Tensor] | None] = {
    V2Lambda.SIGMOID: torch.sigmoid,
    V2Lambda.RAW: _identity,
    V2Lambda.NONE: None,
}


class DiffAttentionV2(AttentionModule[torch.Tensor, torch.Tensor, torch.Tensor, *tuple[torch.Tensor, ...]]):
    """``out_i = attn_{2i} − λ_i · attn_{2i+1}`` over 2h query heads of dim d on h_kv K/V heads.

    One standard attention call (any backend, no custom kernel). With ``v2_pairing: same_group``
    heads 2i and 2i+1 belong to the same GQA group (group = ``j // (2h / h_kv)``, and 2h / h_kv is
    even), so they share K and V. λ = sigmoid(x W_λ) per token and head (``v2_lambda``: ``none``
    uses λ = 1, ``raw`` drops the sigmoid). No per-head norm; ``wo`` is the baseline's size.

    ``v2_pairing: cross_group`` (blog ablation 1) subtracts query head h+i from head i instead,
    which sit in different GQA groups whenever h_kv > 1.

    Parameter layout (``nn.Linear`` weights are ``(out, in)``), as the official
    ``multihead_flashdiffv2``:

    - ``wq.weight`` ``(2h*d, D)``: rows ``[j*d:(j+1)*d]`` are query head j. same_group: output head
      i = query head 2i minus λ_i * query head 2i+1; cross_group: head i minus λ_i * head h+i.
    - ``wk.weight``, ``wv.weight`` ``(h_kv*d, D)``: rows ``[g*d:(g+1)*d]`` are K/V head g.
    - ``wlambda.weight`` ``(h, D)``: row i projects λ of output head i (absent with ``v2_lambda: none``).
    - ``wo.weight`` ``(D, h*d)``: columns ``[i*d:(i+1)*d]`` read output head i.
    """

    def __init__(self, cfg: ResolvedModel, layer: int, backend: AttentionBackend) -> None:
        super().__init__()
        a = cfg.attention
        self.num_heads, self.num_kv_heads, self.head_dim = a.num_heads, a.num_kv_heads, a.head_dim
        self.pair = PAIRINGS[a.v2_pairing]
        self.activation = LAMBDA_ACTIVATIONS[a.v2_lambda]
        self.backend = backend
        D, h, hkv, d = cfg.d_model, a.num_heads, a.num_kv_heads, a.head_dim
        self.wq = nn.Linear(D, 2 * h * d, bias=False)
        self.wk = nn.Linear(D, hkv * d, bias=False)
        self.wv = nn.Linear(D, hkv * d, bias=False)
        self.wo = nn.Linear(h * d, D, bias=False)
        self.wlambda = nn.Linear(D, h, bias=False) if self.activation is not None else None

    def lambda_values(self, x: torch.Tensor) -> torch.Tensor | None:
        """λ of shape ``(B, T, h)`` as applied (after sigmoid when used); None for ``v2_lambda: none``."""
        if self.wlambda is None or self.activation is None:
            return None
        return self.activation(self.wlambda(x))

    def project(self, x: torch.Tensor, rope: Rotary) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                              *tuple[torch.Tensor, ...]]:
        B, T, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_bhtd = rope.apply(self.wq(x).view(B, T, 2 * h, d).transpose(1, 2))  # (B, 2h, T, d)
        k_bhtd = rope.apply(self.wk(x).view(B, T, hkv, d).transpose(1, 2))
        v_bhtd = self.wv(x).view(B, T, hkv, d).transpose(1, 2)
        lam = self.lambda_values(x)  # (B, T, h), or None: λ = 1
        return (q_bhtd, k_bhtd, v_bhtd) if lam is None else (q_bhtd, k_bhtd, v_bhtd, lam)

    def core(self, q_bhtd: torch.Tensor, k_bhtd: torch.Tensor, v_bhtd: torch.Tensor,
             *lam_bth: torch.Tensor) -> torch.Tensor:
        """``lam_bth``: ``project``'s λ ``(B, T, h)``, or nothing for ``v2_lambda: none`` (λ = 1)."""
        (lam,) = lam_bth or (None,)
        B, _, T, d = q_bhtd.shape
        h = self.num_heads
        out = self.backend.attend(q_bhtd, k_bhtd, v_bhtd, scale=d**-0.5)  # (B, 2h, T, d)
        out1, out2 = self.pair(out, h)  # (B, h, T, d) each
        if lam is None:
            diff_bhtd = out1 - out2
        else:
            diff_bhtd = out1 - lam.transpose(1, 2).unsqueeze(-1).to(out1.dtype) * out2  # λ: (B, h, T, 1)
        return diff_bhtd.transpose(1, 2).reshape(B, T, h * d)

    def attention_maps(self, x: torch.Tensor, rope: Rotary) -> torch.Tensor:
        """The map output head i applies to V ``(B, h, T, T)``, at least fp32: ``A_a − λ_i(t)·A_b``
        with ``A_j = softmax(Q_j Kᵀ/√d)`` (causal) of query head j, (a, b) the pairing's two heads
        ((2i, 2i+1) same_group, (i, h+i) cross_group), λ_i(t) per query token (1 with
        ``v2_lambda: none``); rows sum to 1 − λ_i(t).

        ``map @ V`` is the output head (``core``) when heads a and b share a K/V head: always with
        same_group; with cross_group they read different V heads whenever h_kv > 1, and the map then
        only says which positions the difference weighs."""
        q_bhtd, k_bhtd, _, *lam_bth = self.project(x, rope)
        with torch.autocast(x.device.type, enabled=False):
            probs = reference.attention_probs(q_bhtd, k_bhtd, scale=self.head_dim**-0.5, upcast=True)
        probs1, probs2 = self.pair(probs, self.num_heads)  # (B, h, T, T) each
        if not lam_bth:
            return probs1 - probs2
        lam = upcast(lam_bth[0]).to(probs.dtype).transpose(1, 2).unsqueeze(-1)  # (B, h, T, 1): per query row
        return probs1 - lam * probs2

    def probe(self, x: torch.Tensor) -> dict[str, float]:
        """λ over this layer's tokens and heads (as applied): its mean and spread."""
        lam = self.lambda_values(x)
        if lam is None:
            return {}
        lam = lam.detach().float()
        return {"lambda/mean": float(lam.mean()), "lambda/std": float(lam.std())}
