"""Periodic measurements of a model: validation loss with the paper's Table 6 slices, λ per
layer, and the activation-outlier statistics of §3.6 (top-1 attention logit, top-1 hidden state).

Probes observe the model without changing it: they wrap each attention module's backend for one
forward pass (the module and its parameters are untouched) and use forward hooks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from diffsweep.model.attention.backends import AttentionBackend
from diffsweep.model.transformer import LanguageModel


def ar_hit_mask(window: torch.Tensor) -> torch.Tensor:
    """Which targets are "AR-Hit" tokens: ``(B, T)`` bool for windows ``(B, T + 1)``.

    Target t (token ``t + 1`` of the window) is a hit when the bigram it completes,
    ``(window[t], window[t + 1])``, already occurred earlier in the same window: the associative
    recall definition of Zoology (Arora et al., 2023), used by the DIFF paper's Table 6.
    """
    inputs, targets = window[:, :-1].long(), window[:, 1:].long()
    keys = inputs * (int(window.max()) + 1) + targets  # one int64 per bigram
    sorted_keys, order = torch.sort(keys, dim=1, stable=True)  # stable: first occurrence first
    first_sorted = torch.ones_like(sorted_keys, dtype=torch.bool)
    first_sorted[:, 1:] = sorted_keys[:, 1:] != sorted_keys[:, :-1]
    first = torch.empty_like(first_sorted).scatter_(1, order, first_sorted)
    return ~first


class LossSums:
    """Token-weighted validation loss, overall and split into AR-Hit / Others."""

    def __init__(self) -> None:
        self.total = {"all": 0.0, "ar_hit": 0.0, "others": 0.0}
        self.count = {"all": 0, "ar_hit": 0, "others": 0}

    def add(self, token_loss: torch.Tensor, hit: torch.Tensor) -> None:
        token_loss = token_loss.double()
        for name, mask in (("all", torch.ones_like(hit)), ("ar_hit", hit), ("others", ~hit)):
            self.total[name] += float(token_loss[mask].sum())
            self.count[name] += int(mask.sum())

    def reduce(self, sum_all: Callable[[list[float]], list[float]]) -> None:
        """Replace the sums with every process's added up (``sum_all`` sums a list elementwise
        over the processes)."""
        names = list(self.total)
        summed = sum_all([self.total[n] for n in names] + [float(self.count[n]) for n in names])
        self.total = dict(zip(names, summed[: len(names)], strict=True))
        self.count = {n: round(v) for n, v in zip(names, summed[len(names) :], strict=True)}

    def metrics(self) -> dict[str, float]:
        out = {"val/loss": self.total["all"] / self.count["all"]}
        for name in ("ar_hit", "others"):
            if self.count[name]:
                out[f"val/loss_{name}"] = self.total[name] / self.count[name]
        out["val/ar_hit_fraction"] = self.count["ar_hit"] / self.count["all"]
        return out


def token_losses(model: LanguageModel, window: torch.Tensor) -> torch.Tensor:
    """Per-target cross-entropy ``(B, T)`` (fp32) of windows ``(B, T + 1)``."""
    logits = model(window[:, :-1])
    return F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten(), reduction="none").view(
        window.shape[0], -1
    )


class _LogitProbe(AttentionBackend):
    """Delegates to the real backend and records the largest |q·k|·scale over causal pairs."""

    def __init__(self, inner: AttentionBackend) -> None:
        self.inner, self.name, self.top = inner, inner.name, 0.0

    def _record(self, q: torch.Tensor, k: torch.Tensor, scale: float) -> None:
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        T = q.shape[2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        with torch.autocast(q.device.type, enabled=False):  # fp32 logits even under bf16 autocast
            for h in range(q.shape[1]):  # one head at a time: (B, T, T) is the largest tensor
                logits = (q[:, h].float() @ k[:, h].float().transpose(-1, -2)) * scale
                self.top = max(self.top, float(logits.abs().masked_fill(~causal, 0).max()))

    def attend(self, q, k, v, *, scale):
        self._record(q, k, scale)
        return self.inner.attend(q, k, v, scale=scale)

    def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
        self._record(q1, k1, scale)
        self._record(q2, k2, scale)
        return self.inner.diff_attend(q1, k1, q2, k2, v, lam, scale=scale)


@dataclass
class _Readings:
    """What the probes of one forward pass found."""

    hidden_top: float = 0.0  # the largest |hidden state|
    logit_top: float = 0.0  # the largest |attention logit| (set after the forward)
    layers: dict[int, dict[str, float]] = field(default_factory=dict)  # each attention module's ``probe``


@contextlib.contextmanager
def _probed(model: LanguageModel) -> Iterator[_Readings]:
    """Attach the probes for one forward pass; yields where their readings land."""
    found = _Readings()
    blocks = model.blocks()
    attentions = [block.attention for block in blocks]
    originals = [a.backend for a in attentions]
    probes = [_LogitProbe(b) for b in originals]
    handles = []

    def hidden_hook(module, inputs, output):
        found.hidden_top = max(found.hidden_top, float(output.detach().float().abs().max()))

    def layer_hook(index):
        # A pre-hook runs inside the block's forward, where FSDP has gathered the layer's parameters.
        def hook(module, inputs):
            readings = module.probe(inputs[0])
            if readings:
                found.layers[index] = readings
        return hook

    try:
        for index, (block, attention, probe) in enumerate(zip(blocks, attentions, probes, strict=True)):
            attention.backend = probe
            handles.append(block.register_forward_hook(hidden_hook))
            handles.append(attention.register_forward_pre_hook(layer_hook(index)))
        yield found
        found.logit_top = max(p.top for p in probes)
    finally:
        for attention, original in zip(attentions, originals, strict=True):
            attention.backend = original
        for handle in handles:
            handle.remove()


@torch.no_grad()
def probe(model: LanguageModel, window: torch.Tensor) -> dict[str, float]:
    """λ per layer and the outlier statistics, from one forward pass over ``window`` ``(B, T + 1)``.

    - what each layer's attention module reports (``AttentionModule.probe``), as
      ``<family>/layer_XX[/rest]``: ``lambda/layer_XX`` (DIFF V1: the layer's λ, paper eq. 2),
      ``lambda/layer_XX/mean`` and ``/std`` (DIFF V2: sigmoid λ over tokens and heads);
    - ``outliers/attn_logit_top1``: the largest |attention logit| (q·k/√d, any head, layer, map);
    - ``outliers/hidden_top1``: the largest |hidden state| (any block's output).
    """
    out: dict[str, float] = {}
    with _probed(model) as found:
        model(window[:, :-1])
    for index, readings in sorted(found.layers.items()):
        for name, value in readings.items():
            family, _, rest = name.partition("/")
            out[f"{family}/layer_{index + 1:02d}" + (f"/{rest}" if rest else "")] = value
    out["outliers/attn_logit_top1"] = found.logit_top
    out["outliers/hidden_top1"] = found.hidden_top
    return out
