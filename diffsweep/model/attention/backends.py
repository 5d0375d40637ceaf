"""Attention backends: *which kernel* computes attention (``attention.backend``).

What attention computes (``attention.kind``) is decided by the modules in this package; they
call a backend through two primitives:

- ``attend(q, k, v, scale)``: causal softmax attention, layout ``(B, H, T, D)``, GQA with
  contiguous groups (query head j uses K/V head ``j // (Hq // Hkv)``), V dim may differ from QK dim;
- ``diff_attend(q1, k1, q2, k2, v, lam, scale)``: ``attend(q1, k1, v) - lam * attend(q2, k2, v)``.

Each backend declares what it supports and is checked once, when the model is built
(``resolve_backend``), never mid-training. One registry maps ``Backend`` to its implementation.
"""

from __future__ import annotations

import functools
import importlib
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from diffsweep.config import Backend, EnvironmentUnavailable
from diffsweep.model.layers import upcast
from diffsweep_kernels import reference


@dataclass(frozen=True)
class AttentionCall:
    """The shape of the attention an attention module will ask a backend for."""

    num_q_heads: int
    num_kv_heads: int
    qk_dim: int
    v_dim: int
    differential: bool  # calls diff_attend (two maps, one λ)


class AttentionBackend(ABC):
    """Base class; ``attend`` must be provided, ``diff_attend`` defaults to two ``attend`` calls."""

    name: Backend

    def unavailable_reason(self) -> str | None:
        """Why this backend cannot run on this machine at all (package or hardware missing)."""
        return None

    def unsupported_reason(self, call: AttentionCall, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why this backend cannot run ``call`` on ``device`` with inputs of ``dtype``."""
        return None

    @abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
        """Causal softmax attention ``(B, Hq, T, Dv)`` of q ``(B, Hq, T, D)``, k/v ``(B, Hkv, T, D|Dv)``."""

    def diff_attend(
        self,
        q1: torch.Tensor,
        k1: torch.Tensor,
        q2: torch.Tensor,
        k2: torch.Tensor,
        v: torch.Tensor,
        lam: torch.Tensor,
        *,
        scale: float,
    ) -> torch.Tensor:
        out1 = self.attend(q1, k1, v, scale=scale)
        out2 = self.attend(q2, k2, v, scale=scale)
        # Combine in fp32 (as a fused kernel accumulates): λ keeps its precision in bf16 training
        # (bf16 would round λ ≈ 0.8 to steps of 0.004) and dλ is summed in fp32.
        return (upcast(out1) - upcast(lam) * upcast(out2)).to(out1.dtype)


class ReferenceBackend(AttentionBackend):
    """Explicit softmax(QK^T)V in PyTorch (``diffsweep_kernels.reference``). Slow, exact, any device."""

    name = Backend.REFERENCE

    def attend(self, q, k, v, *, scale):
        return reference.attention(q, k, v, scale=scale)

    def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
        return reference.diff_attention(q1, k1, q2, k2, v, lam, scale=scale)


def split_v(attend_equal_dims, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention with V wider than Q/K through a kernel that needs equal dims: one call per
    QK-wide chunk of V, concatenated (paper App. A, FlashDiffAttn_2)."""
    if v.shape[-1] == q.shape[-1]:
        return attend_equal_dims(v)
    return torch.cat([attend_equal_dims(chunk) for chunk in v.split(q.shape[-1], dim=-1)], dim=-1)


class SdpaBackend(AttentionBackend):
    """``torch.nn.functional.scaled_dot_product_attention``. Always available.

    PyTorch's fused kernels (flash on CPU and GPU) need V dim = QK dim; a wider V (DIFF V1's 2d)
    is split into QK-wide chunks so the fused kernel runs instead of the O(T²)-memory math kernel.
    """

    name = Backend.SDPA

    def attend(self, q, k, v, *, scale):
        gqa = q.shape[1] != k.shape[1]
        return split_v(lambda vc: F.scaled_dot_product_attention(q, k, vc, is_causal=True, scale=scale,
                                                                 enable_gqa=gqa), q, v)


def _flash_attn_func():
    try:
        from flash_attn import flash_attn_func  # GPU only; optional
    except (ImportError, OSError, RuntimeError):  # missing, no CUDA extension, ABI mismatch
        return None
    return flash_attn_func


@functools.cache
def _flash_takes_wide_v(qk_dim: int, v_dim: int) -> bool:
    """Whether the installed flash-attn accepts a V head dim other than the QK head dim (the DIFF
    authors' fork and FlashAttention-3 do for some pairs; stock FlashAttention-2 refuses). Probed
    once per pair with a 16-token call on the GPU."""
    q = torch.zeros(1, 16, 1, qk_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.zeros(1, 16, 1, v_dim, device="cuda", dtype=torch.bfloat16)
    try:
        return _flash_attn_func()(q, q, v, causal=True).shape[-1] == v_dim
    except (RuntimeError, ValueError, AssertionError, TypeError):
        return False


class FlashBackend(AttentionBackend):
    """The flash-attn package (CUDA, fp16/bf16). DIFF V1 takes two calls when the installed kernel
    accepts V twice as wide as Q/K, and otherwise four: V split into QK-wide halves, each half
    attended by both maps (paper App. A, FlashDiffAttn_1 and FlashDiffAttn_2)."""

    name = Backend.FLASH

    def unavailable_reason(self):
        if not torch.cuda.is_available():
            return "needs a CUDA GPU, and none is visible"
        if _flash_attn_func() is None:
            return "needs the flash-attn package (pip install flash-attn --no-build-isolation)"
        return None

    def unsupported_reason(self, call, device, dtype):
        if device.type != "cuda":
            return f"runs on CUDA devices only, got device {device.type!r}"
        if dtype not in (torch.float16, torch.bfloat16):
            return f"needs fp16/bf16 inputs (train.precision=bf16 or auto on GPU), got {dtype}"
        if call.qk_dim > 256 or call.v_dim % call.qk_dim:
            return f"needs head dims <= 256 with V dim a multiple of QK dim, got {call.qk_dim}/{call.v_dim}"
        return None

    def attend(self, q, k, v, *, scale):
        flash = _flash_attn_func()
        qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # flash-attn layout (B, T, H, D)

        def call(vc):
            return flash(qt, kt, vc.transpose(1, 2), softmax_scale=scale, causal=True).transpose(1, 2)

        if v.shape[-1] != q.shape[-1] and _flash_takes_wide_v(q.shape[-1], v.shape[-1]):
            return call(v)
        return split_v(call, q, v)


_TRITON_DIFF: list[types.ModuleType] = []  # the kernel module once imported: torch.compile cannot trace an import


def _triton_diff():
    """``diffsweep_kernels.triton_diff``, or None without the triton package. Imported once, when
    the backend is first checked (model build), so that a compiled forward only reads it."""
    if not _TRITON_DIFF:
        try:
            _TRITON_DIFF.append(importlib.import_module("diffsweep_kernels.triton_diff"))
        except ImportError:
            return None
    return _TRITON_DIFF[0]


class TritonBackend(AttentionBackend):
    """DIFF V1 through the fused Triton kernel (``diffsweep_kernels.triton_diff``): both softmax maps
    in one pass over K/V, forward and backward. Standard attention and DIFF V2 (one standard call)
    go to SDPA, whose FlashAttention kernel they can use as is.

    Runs on CUDA GPUs; on CPU only inside Triton's interpreter (``TRITON_INTERPRET=1`` set before
    the process imports the kernel), which is for tests, slow, and wrong in bf16."""

    name = Backend.TRITON

    def unavailable_reason(self):
        kernel = _triton_diff()
        if kernel is None:
            return "needs the triton package (pip install triton; CUDA builds of torch ship it)"
        if not torch.cuda.is_available() and not kernel.INTERPRET:
            return ("needs a CUDA GPU, and none is visible (TRITON_INTERPRET=1 runs the kernel in "
                    "Triton's CPU interpreter, for tests)")
        return None

    def unsupported_reason(self, call, device, dtype):
        if not call.differential:
            return BACKENDS[Backend.SDPA].unsupported_reason(call, device, dtype)
        return _triton_diff().unsupported_reason(call.num_q_heads, call.num_kv_heads, call.qk_dim, call.v_dim,
                                                 dtype, device)

    def attend(self, q, k, v, *, scale):
        return BACKENDS[Backend.SDPA].attend(q, k, v, scale=scale)

    def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
        return _triton_diff().diff_attention(q1, k1, q2, k2, v, lam, scale=scale)


BACKENDS: dict[Backend, AttentionBackend] = {
    Backend.REFERENCE: ReferenceBackend(),
    Backend.SDPA: SdpaBackend(),
    Backend.FLASH: FlashBackend(),
    Backend.TRITON: TritonBackend(),
}


def resolve_backend(
    name: Backend, call: AttentionCall, *, device: torch.device | str, dtype: torch.dtype
) -> AttentionBackend:
    """The backend ``name``, checked against ``call``; raises ``EnvironmentUnavailable`` with the reason."""
    backend = BACKENDS[Backend(name)]
    device = torch.device(device)
    reason = backend.unavailable_reason()
    if reason is None and device.type != "meta":
        reason = backend.unsupported_reason(call, device, dtype)
    if reason is not None:
        raise EnvironmentUnavailable(f"model.attention.backend: {backend.name.value!r} {reason}")
    return backend
