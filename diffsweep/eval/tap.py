"""A tap on attention: see the attention logits, or quantize them (paper §3.6, §3.7).

A ``Tap`` is an ``AttentionBackend`` wrapping the backend a model was built with (``inner``), put in
place of every block's ``attention.backend`` by ``tapped`` for as long as a probe needs it; the
modules and their parameters are untouched (the idea of ``diffsweep.train.probes``). The attention
logits (``attention_logits``) are computed in fp32 at the causal positions; quantizing them
(``quantize_logits``, 2..15 bits) replaces ``inner`` by an explicit fp32 path, since a fused kernel
does not expose its logits; ``bits=None`` or 16 runs ``inner`` unchanged (bit for bit the untapped
model). The exact definitions are in the docstrings of those two functions and of ``Tap``.

See docs/eval.md, 'Quantization granularity'.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from enum import StrEnum

import torch

from diffsweep.model.attention.backends import AttentionBackend
from diffsweep.model.layers import upcast
from diffsweep.model.transformer import LanguageModel

# observer(layer, logits, causal): ``layer`` 1-based, ``logits`` (B, H, T, T) fp32 as computed
# (before any quantization; masked positions hold q·kᵀ·scale too and must be ignored),
# ``causal`` (T, T) bool, True at the causal positions. DIFF V1 calls it once per map.
Observer = Callable[[int, torch.Tensor, torch.Tensor], None]

UNQUANTIZED = 16  # bits that mean "no quantization" (the paper's 16-bit baseline, Fig. 8)


def causal_mask(T: int, device: torch.device) -> torch.Tensor:
    """``(T, T)`` bool: True where key s ≤ query t."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def attention_logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``q · kᵀ · scale`` ``(B, H, T, T)`` in fp32 (fp64 stays fp64), K expanded to q's heads (GQA).

    These are the *attention logits* of one call with q ``(B, H, T, D)``, k ``(B, Hkv, T, D)``: computed
    in fp32 from the q and k the backend receives (bf16 under bf16 autocast), K expanded to the query
    heads by ``repeat_interleave`` (GQA, contiguous groups). Query t sees keys s ≤ t (the *causal
    positions*, ``causal[t, s]``); the other positions are masked and are not logits of the model."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    with torch.autocast(q.device.type, enabled=False):  # fp32 even under bf16 autocast
        return (upcast(q) @ upcast(k).transpose(-1, -2)) * scale


class Granularity(StrEnum):
    """Which logits share one quantization scale (the paper, §3.7, does not say; docs/eval.md)."""

    TENSOR = "tensor"  # all heads of one sequence (one map of DIFF V1): (B, 1, 1, 1) scales
    HEAD = "head"  # one head of one sequence: (B, H, 1, 1)
    ROW = "row"  # one query row of one head: (B, H, T, 1)


_REDUCED = {Granularity.TENSOR: (1, 2, 3), Granularity.HEAD: (2, 3), Granularity.ROW: (3,)}  # dims a scale spans


def quantize_logits(logits: torch.Tensor, causal: torch.Tensor, bits: int,
                    granularity: Granularity = Granularity.HEAD) -> torch.Tensor:
    """Absmax-quantize ``logits`` ``(B, H, T, T)`` to signed ``bits``, one scale per ``granularity``
    group from its causal positions; masked positions are quantized with the same scale and stay
    meaningless.

    Dynamic post-training absmax quantization, symmetric and signed, one scale per group of logits
    (``tensor``: one per sequence over all heads; ``head``: one per sequence and head; ``row``: one
    per query row of a head): ``scale = max |logit| over the group's causal positions / (2^(bits-1) − 1)``,
    ``logit ← round(logit / scale) · scale`` (``torch.round``: halves to even; a group of zeros stays
    zero). Groups never span sequences of a batch, so results do not depend on the micro-batch."""
    levels = 2 ** (bits - 1) - 1
    absmax = logits.abs().masked_fill(~causal, 0).amax(dim=_REDUCED[granularity], keepdim=True)
    scale = absmax / levels
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero slice stays zero
    return torch.round(logits / safe) * safe


def quantizes(bits: int | None) -> bool:
    """Whether ``bits`` asks for quantization (None and 16 do not)."""
    return bits is not None and bits < UNQUANTIZED


class Tap(AttentionBackend):
    """``inner`` with its logits shown to ``observer`` and, when ``bits`` < 16, quantized with one
    scale per ``granularity`` group (then the explicit fp32 path computes the attention instead of
    ``inner``). ``layer`` is 1-based.

    While quantizing (``bits`` 2..15), the attention is ``softmax(quantized logits, causal) @ V`` in
    fp32 (the *explicit path*), cast back to q's dtype; DIFF V1's two maps are each quantized and
    combined in fp32 as ``A1 V − λ A2 V`` (``AttentionBackend.diff_attend``'s semantics). The
    explicit path replaces ``inner`` because a fused kernel (flash, triton) does not expose its
    logits (``replacement_note`` is the line a probe reports about it); it holds a few
    ``(B, H, T, T)`` fp32 tensors: the probe's micro-batch bounds that memory. ``bits=None`` or 16
    (the unquantized model, the paper's 16-bit baseline) computes the output with ``inner`` itself,
    unchanged, so it is bit for bit the untapped model's."""

    def __init__(self, inner: AttentionBackend, layer: int, observer: Observer | None = None,
                 bits: int | None = None, granularity: Granularity = Granularity.HEAD) -> None:
        if bits is not None and not 2 <= bits <= UNQUANTIZED:
            raise ValueError(f"bits must be in 2..{UNQUANTIZED} (or None), got {bits}")
        self.inner, self.name, self.layer = inner, inner.name, layer
        self.observer, self.bits, self.granularity = observer, bits, Granularity(granularity)

    def _logits(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        logits, causal = attention_logits(q, k, scale), causal_mask(q.shape[2], q.device)
        if self.observer is not None:
            self.observer(self.layer, logits, causal)
        return logits, causal

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Quantized attention ``(B, H, T, Dv)`` in fp32 (not cast back)."""
        assert self.bits is not None  # called only when quantizes(self.bits)
        logits, causal = self._logits(q, k, scale)
        logits = quantize_logits(logits, causal, self.bits, self.granularity).masked_fill_(~causal, float("-inf"))  # a fresh tensor
        v = upcast(v.repeat_interleave(q.shape[1] // v.shape[1], dim=1))
        with torch.autocast(q.device.type, enabled=False):
            return torch.softmax(logits, dim=-1) @ v

    def attend(self, q, k, v, *, scale):
        if quantizes(self.bits):
            return self._explicit(q, k, v, scale).to(q.dtype)
        if self.observer is not None:
            self._logits(q, k, scale)
        return self.inner.attend(q, k, v, scale=scale)

    def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
        if quantizes(self.bits):
            out1, out2 = self._explicit(q1, k1, v, scale), self._explicit(q2, k2, v, scale)
            return (out1 - upcast(lam) * out2).to(q1.dtype)
        if self.observer is not None:
            self._logits(q1, k1, scale)
            self._logits(q2, k2, scale)
        return self.inner.diff_attend(q1, k1, q2, k2, v, lam, scale=scale)


@contextlib.contextmanager
def tapped(model: LanguageModel, observer: Observer | None = None, bits: int | None = None,
           granularity: Granularity = Granularity.HEAD) -> Iterator[list[Tap]]:
    """Every block's ``attention.backend`` replaced by a ``Tap`` of it (block i is layer i + 1)
    inside the ``with``; the original backends are back afterwards, also after an exception."""
    attentions = [block.attention for block in model.blocks()]
    originals = [a.backend for a in attentions]
    taps = [Tap(inner, layer, observer, bits, granularity) for layer, inner in enumerate(originals, start=1)]
    try:
        for attention, tap in zip(attentions, taps, strict=True):
            attention.backend = tap
        yield taps
    finally:
        for attention, original in zip(attentions, originals, strict=True):
            attention.backend = original


def replacement_note(model: LanguageModel, bits: list[int]) -> str | None:
    """The note a probe reports when quantizing ``bits`` replaces the model's backend by the explicit
    path (a fused kernel such as flash or triton cannot quantize its logits); None when no width quantizes."""
    quantized = [b for b in bits if quantizes(b)]
    if not quantized:
        return None
    name = model.blocks()[0].attention.backend.name.value
    return (f"bits {', '.join(map(str, quantized))}: attention ran through the explicit fp32 softmax(QKᵀ)V "
            f"of diffsweep.eval.tap in place of the run's backend {name!r} (its kernel does not expose the "
            f"logits); 16 bits used {name!r} itself")
