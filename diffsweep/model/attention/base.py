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
from diffsweep.model.layers import Rotary

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

    def probe(self, x: torch.Tensor) -> dict[str, float]:
        """Readings of this layer for the periodic probes, e.g. ``{"lambda": 0.53}`` or
        ``{"lambda/mean": ..., "lambda/std": ...}``; the first path component is the family (logged
        as ``<family>/layer_XX[/rest]``). Called with the module's input during a probe's forward."""
        return {}
