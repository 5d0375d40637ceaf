"""``AttentionModule``: what the model, the probes and the benchmark ask of any attention kind's module.

A kind's module is built as ``cls(model_config, layer, backend)`` (``layer`` is 1-based) and splits
its forward in two, so the attention benchmark can time the real attention math without the
projections: ``project`` (input projections, RoPE, anything per token) and ``core`` (the backend
call, the kind's combination and per-head norm, up to ``wo``'s input).
"""

from __future__ import annotations

from typing import Generic, TypeVarTuple

import torch
from torch import nn

from diffsweep.model.attention.backends import AttentionBackend
from diffsweep.model.layers import Rotary, upcast
from diffsweep_kernels import reference

Inputs = TypeVarTuple("Inputs")


class AttentionModule(nn.Module, Generic[*Inputs]):
    """Base class of attention kinds' modules; subclasses define ``project`` and ``core`` and a ``wo``.

    ``Inputs`` is what ``project`` returns and ``core`` takes, positionally: e.g. a subclass of
    ``AttentionModule[Tensor, Tensor, Tensor]`` defines ``core(self, q, k, v)`` (a subclass that
    does not say stands for ``AttentionModule[*tuple[Any, ...]]``).

    ``nn.Linear`` weights and ``RMSNorm`` gains are initialised by the model (N(0, init_std), ones);
    parameters of the module's own (DIFF V1's λ vectors) are initialised by ``reset_parameters``,
    which the model calls on every module that has it.
    """

    backend: AttentionBackend
    wo: nn.Linear

    def reset_parameters(self) -> None:
        """Initialise this module's own parameters (not its children's). The default has none to
        initialise, and refuses to pass over any: a parameter left as ``torch.empty`` would train from
        whatever memory held."""
        own = [name for name, _ in self.named_parameters(recurse=False)]
        if own:
            raise NotImplementedError(f"{type(self).__name__} has its own parameters {own}: "
                                      "define reset_parameters to initialise them")

    def project(self, x: torch.Tensor, rope: Rotary) -> tuple[*Inputs]:
        """The inputs of ``core`` from the normalised block input ``x`` ``(B, T, D)``."""
        raise NotImplementedError

    def core(self, *inputs: *Inputs) -> torch.Tensor:
        """Attention from ``project``'s outputs: ``(B, T, channels)``, the input of ``wo``."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, rope: Rotary) -> torch.Tensor:
        return self.wo(self.core(*self.project(x, rope)))

    def attention_maps(self, x: torch.Tensor, rope: Rotary) -> torch.Tensor:
        """The attention map each output head applies to V: ``(B, h, T, T)``, at least fp32, zero
        above the diagonal (row t weighs the values of keys s ≤ t), from the normalised block input
        ``x`` ``(B, T, D)``.

        What ``core`` computes before any per-head norm is ``map @ V`` with the head's (group's) V.
        The default runs ``core`` once with a backend that computes attention explicitly and keeps
        the map of its one call: ``softmax(QKᵀ·scale)`` for ``attend`` (standard attention: rows sum
        to 1; a per-head norm acts on the output, not the map), ``A1 − λ·A2`` for ``diff_attend``
        (DIFF V1, paper eq. 1). A kind that calls its backend more than once, or combines heads
        after the call (DIFF V2), overrides this."""
        recorder = _MapRecorder(self.backend)
        self.backend = recorder
        try:
            self.core(*self.project(x, rope))
        finally:
            self.backend = recorder.inner
        if len(recorder.maps) != 1:
            raise NotImplementedError(f"{type(self).__name__} called its backend {len(recorder.maps)} times: "
                                      "define attention_maps for it")
        return recorder.maps[0]

    def probe(self, x: torch.Tensor) -> dict[str, float]:
        """Readings of this layer for the periodic probes, e.g. ``{"lambda": 0.53}`` or
        ``{"lambda/mean": ..., "lambda/std": ...}``; the first path component is the family (logged
        as ``<family>/layer_XX[/rest]``). Called with the module's input during a probe's forward."""
        return {}


def _probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal ``softmax(q kᵀ · scale)`` ``(B, Hq, T, T)`` in at least fp32, also under autocast."""
    with torch.autocast(q.device.type, enabled=False):
        return reference.attention_probs(q, k, scale=scale, upcast=True)


def _apply(probs: torch.Tensor, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``probs @ V`` (V expanded to the query heads: GQA, contiguous groups), cast to ``dtype``."""
    v = upcast(v.repeat_interleave(probs.shape[1] // v.shape[1], dim=1)).to(probs.dtype)
    with torch.autocast(probs.device.type, enabled=False):
        return (probs @ v).to(dtype)


class _MapRecorder(AttentionBackend):
    """Computes attention explicitly (at least fp32) and keeps the map of each call:
    ``softmax(QKᵀ·scale)``, or ``A1 − λ·A2`` for ``diff_attend``."""

    def __init__(self, inner: AttentionBackend) -> None:
        self.inner, self.name = inner, inner.name
        self.maps: list[torch.Tensor] = []

    def attend(self, q, k, v, *, scale):
        probs = _probs(q, k, scale)
        self.maps.append(probs)
        return _apply(probs, v, q.dtype)

    def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
        p1, p2 = _probs(q1, k1, scale), _probs(q2, k2, scale)
        diff = p1 - upcast(lam).to(p1.dtype) * p2
        self.maps.append(diff)
        return _apply(diff, v, q1.dtype)
