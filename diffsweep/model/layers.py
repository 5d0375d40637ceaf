"""Building blocks of the LLaMA-style decoder: RMSNorm, SwiGLU, RoPE. No biases anywhere."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from diffsweep.config import HeadNorm


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least fp32 (bf16/fp16 -> fp32; fp64 stays fp64, so float64 checks are exact)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019) over the last dimension, computed in >= fp32, with a gain."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
        """Normalise ``x``; ``scale`` (a number or a 0-dim tensor, rounded to the computation's
        dtype) multiplies the gain (folded in: no extra full-size multiply)."""
        x32 = upcast(x)
        weight = self.weight.to(x32.dtype)
        if isinstance(scale, torch.Tensor):
            weight = weight * scale.to(x32.dtype)
        elif scale != 1.0:
            weight = weight * scale
        return F.rms_norm(x32, (x32.shape[-1],), weight, self.eps).to(x.dtype)


# The one registry from ``HeadNorm`` to the per-head norm module (None: no module at all).
def _no_norm(dim: int, eps: float) -> None:
    return None


HEAD_NORMS: dict[HeadNorm, Callable[[int, float], nn.Module | None]] = {
    HeadNorm.RMSNORM: RMSNorm,
    HeadNorm.NONE: _no_norm,
}


class SwiGLU(nn.Module):
    """Feed-forward ``w_down(silu(w_gate x) * w_up x)`` (Shazeer 2020), hidden size ``hidden``."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w_gate = nn.Linear(d_model, hidden, bias=False)
        self.w_up = nn.Linear(d_model, hidden, bias=False)
        self.w_down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Rotary:
    """RoPE tables for one sequence length: ``cos``/``sin`` of shape ``(T, dim/2)``, fp64 angles.

    Channels are rotated in interleaved pairs (2i, 2i+1), as in Meta's LLaMA and the official
    DIFF code (``apply_rotary_emb(..., interleaved=True)``); weights from implementations that
    use the rotate-half convention need their Q/K rows permuted.
    """

    def __init__(self, seq_len: int, dim: int, theta: float, device: torch.device | str | None = None) -> None:
        self.seq_len = seq_len
        dtype = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=dtype) / dim))
        positions = torch.arange(seq_len, device=device, dtype=dtype)
        angles = torch.outer(positions, inv_freq)  # (T, dim/2)
        self.cos64, self.sin64 = angles.cos(), angles.sin()
        self.cos, self.sin = self.cos64.float(), self.sin64.float()

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``(..., T, dim)``; returns the same shape and dtype."""
        x32 = upcast(x).unflatten(-1, (-1, 2))  # (B, H, T, dim/2, 2)
        x_even, x_odd = x32[..., 0], x32[..., 1]
        cos, sin = (self.cos64, self.sin64) if x32.dtype == torch.float64 else (self.cos, self.sin)
        cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
        rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)
