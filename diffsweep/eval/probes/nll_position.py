"""NLL by position (paper §3.2 "long-context evaluation", Fig. 4): how much the context helps.

Fig. 4 plots the cumulative average negative log-likelihood of the tokens at positions 1..t
(the measure of Gemini 1.5, Reid et al., 2024) against t, for book documents of 64K tokens. Here
the documents are ``documents`` non-overlapping windows of ``context + 1`` tokens from the start
of the run's validation split (``dataset.val_starts``, as the trainer's validation loss).

Position t (1..T, T = ``context``) is the t-th predicted token, predicted from the t tokens
before it. ``per_position[t]`` is its NLL averaged over the documents; ``cumulative[t]`` is the
mean of ``per_position[1..t]``, so ``cumulative[T]`` (``nll_position/mean``) is the validation
loss over these windows. A falling curve is a model that uses its longer context.

``rope_theta`` evaluates with another RoPE base (the paper raises θ to 640,000 for its 64K
extension, §3.3); the model's own θ is restored afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from diffsweep.config import Config, ConfigError
from diffsweep.config.kinds import display_color, display_name
from diffsweep.data.dataset import val_starts, windows
from diffsweep.eval.probe import Capped, EvalContext, Probe, ProbeResult, TableComparison, save_figure
from diffsweep.model.transformer import LanguageModel
from diffsweep.train.probes import token_losses

LAST_FRACTION = 0.1  # ``nll_position/last_tenth``: the mean NLL of the last 10% of positions


@dataclass(frozen=True)
class NllPositionSettings:
    """``context``: tokens per document (0: the run's ``train.seq_len``); ``documents``: how many
    validation windows (fewer if the split is shorter); ``rope_theta``: a RoPE base to evaluate
    with instead of the model's (None: the model's); ``micro_batch``: windows per forward pass."""

    context: int = 0
    documents: int = 64
    rope_theta: float | None = None
    micro_batch: int = 8


@contextlib.contextmanager
def rope_theta(model: LanguageModel, theta: float | None) -> Iterator[None]:
    """Run the model with RoPE base ``theta`` inside the block (None: unchanged); its config and
    its cached RoPE tables are put back afterwards, even on an error."""
    if theta is None:
        yield
        return
    with model.rope_theta(theta):
        yield


def log_positions(length: int) -> list[int]:
    """1, 2, 4, ... up to ``length``, and ``length`` itself: the table's rows."""
    out, t = [], 1
    while t < length:
        out.append(t)
        t *= 2
    return [*out, length]


class NllPositionProbe(Probe):
    name = "nll_position"
    summary = "cumulative average NLL of the validation tokens by position (long-context modelling)"
    cites = "Fig. 4, §3.2"
    Settings: ClassVar[type] = NllPositionSettings
    defaults_shown = {"context": "the run's"}
    headline = "nll_position/mean"
    comparisons = (TableComparison(table="nll_position", title="Fig. 4: cumulative average NLL of positions 1..t",
                                   keys=("position",), values=("cumulative",), x="position", log_x=True),)

    def check(self, settings: NllPositionSettings, config: Config) -> None:
        for key, value in (("documents", settings.documents), ("micro_batch", settings.micro_batch)):
            if value < 1:
                raise ConfigError(f"nll_position.{key}", f"expected a positive integer, got {value}")
        if settings.context < 0:
            raise ConfigError("nll_position.context", f"expected a length in tokens (0: train.seq_len = "
                              f"{config.train.seq_len}), got {settings.context}")
        if settings.rope_theta is not None and not settings.rope_theta > 0:
            raise ConfigError("nll_position.rope_theta", f"expected a positive RoPE base, got {settings.rope_theta}")

    def run(self, ctx: EvalContext, settings: NllPositionSettings) -> ProbeResult:
        length = settings.context or ctx.config.train.seq_len
        if len(ctx.val_tokens) < length + 1:
            raise ConfigError("nll_position.context", f"the validation split has {len(ctx.val_tokens)} tokens, "
                              f"fewer than one window of {length} + 1")
        result = ProbeResult()
        available = (len(ctx.val_tokens) - 1) // length  # windows the split holds (as val_starts counts them)
        if available < settings.documents:
            result.capped["documents"] = Capped(settings.documents, available, f"the validation split has "
                                                f"{len(ctx.val_tokens):,} tokens: {available} windows of {length}")
        per_position = position_nll(ctx, settings, length)
        cumulative = np.cumsum(per_position) / np.arange(1, length + 1)
        positions = range(1, length + 1)
        result.series["nll_position/per_position"] = dict(zip(positions, per_position.tolist(), strict=True))
        result.series["nll_position/cumulative"] = dict(zip(positions, cumulative.tolist(), strict=True))
        result.metrics["nll_position/mean"] = float(cumulative[-1])
        result.metrics["nll_position/last_tenth"] = float(per_position[-max(1, round(LAST_FRACTION * length)):].mean())
        result.tables["nll_position"] = [{"position": t, "nll": float(per_position[t - 1]),
                                          "cumulative": float(cumulative[t - 1])} for t in log_positions(length)]
        kind = ctx.config.model.attention.kind
        theta = settings.rope_theta or ctx.config.model.rope_theta
        result.files.append(plot(cumulative, ctx.out_dir / "nll_position.png", display_name(kind),
                                 display_color(kind), f"{result.metrics['nll_position/mean']:.3f}, RoPE θ = {theta:g}"))
        return result


@torch.no_grad()
def position_nll(ctx: EvalContext, settings: NllPositionSettings, length: int) -> np.ndarray:
    """NLL per position ``(length,)`` (float64), averaged over the validation windows."""
    starts = val_starts(len(ctx.val_tokens), length, settings.documents * length)
    total = torch.zeros(length, dtype=torch.float64)
    ctx.model.eval()
    with rope_theta(ctx.model, settings.rope_theta):
        for i in range(0, len(starts), settings.micro_batch):
            window = torch.from_numpy(windows(ctx.val_tokens, starts[i : i + settings.micro_batch], length))
            with ctx.autocast():
                losses = token_losses(ctx.model, window.to(ctx.device))
            total += losses.double().sum(0).cpu()
    return (total / len(starts)).numpy()


def plot(cumulative: np.ndarray, path: Path, name: str, color: str | None, note: str) -> Path:
    """Fig. 4's picture: cumulative average NLL against position, position on a log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(np.arange(1, len(cumulative) + 1), cumulative, color=color or "C0", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("position t (tokens)")
    ax.set_ylabel("cumulative average NLL of positions 1..t")
    ax.set_title(f"NLL by position: {name} (mean {note})", fontsize="medium")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, path)

