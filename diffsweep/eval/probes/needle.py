"""Multi-needle retrieval (paper §3.3, Table 2 and Fig. 5): accuracy by context length and depth.

The prompts are ``diffsweep.eval.needles``' (N needles in the run's own validation text, R
queried cities, the answer needle at each depth). The model greedily continues each prompt by up
to ``digits + 2`` tokens (room for a leading space, the number and one token after it) and a
query counts as retrieved when the continuation states exactly the needle's number
(``needles.recovered``). Accuracy of a (context, depth) cell: the fraction of its
``samples * queries`` queries retrieved; the probe's accuracy is the mean over cells (Table 2
averages over the answer needle's depths; Fig. 5's bottom row averages each context's depths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from diffsweep.config import Config, ConfigError
from diffsweep.config.kinds import display_name
from diffsweep.eval import needles
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, TableComparison, save_figure
from diffsweep.model.transformer import LanguageModel


@dataclass(frozen=True)
class NeedleSettings:
    """``needles``: N; ``queries``: R; ``contexts``: prompt lengths in tokens (empty: the longest
    that fits the run's ``train.seq_len`` with the answer); ``depths``: the answer needle's depths
    in percent; ``samples``: samples per (context, depth) cell (the paper's 50); ``digits``: of
    each magic number (LWM's 7); ``batch``: prompts per forward pass; ``allow_longer``: allow
    contexts past the trained length (RoPE extrapolation)."""

    needles: int = 6
    queries: int = 2
    contexts: tuple[int, ...] = ()
    depths: tuple[float, ...] = (0.0, 25.0, 50.0, 75.0, 100.0)
    samples: int = 50
    digits: int = 7
    batch: int = 8
    allow_longer: bool = False


def new_tokens(digits: int) -> int:
    """Tokens generated per query at most: a leading space, the digits (a token holds at least
    one byte) and one token after the number, so a longer number is seen as wrong."""
    return digits + 2


def contexts(settings: NeedleSettings, config: Config) -> tuple[int, ...]:
    """The prompt lengths to test: as set, or the longest whose answer fits in ``train.seq_len``."""
    return settings.contexts or (config.train.seq_len - new_tokens(settings.digits) + 1,)


@torch.no_grad()
def greedy(model: LanguageModel, prompts: torch.Tensor, steps: int,
           finished: Callable[[list[int]], bool] | None = None) -> torch.Tensor:
    """Greedy continuation ``(B, <= steps)`` of equal-length ``prompts`` ``(B, T)``: each step
    recomputes the full forward (no KV cache: contexts of small models are short) and appends
    the argmax token; stops early once ``finished(row's new tokens)`` holds for every row."""
    tokens = prompts
    for _ in range(steps):
        next_token = model(tokens)[:, -1].float().argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, next_token], dim=1)
        new = tokens[:, prompts.shape[1]:]
        if finished is not None and all(finished(row) for row in new.tolist()):
            break
    return tokens[:, prompts.shape[1]:]


def _answered(text: str) -> bool:
    """Whether a continuation has said all it can about the number (something after its digits,
    or text that is no number at all)."""
    rest = text.lstrip()
    return bool(rest) and (not rest[0].isdigit() or bool(rest.lstrip("0123456789")))


def _label(settings: NeedleSettings) -> str:
    return f"N{settings.needles}_R{settings.queries}"


def _depth(depth: float) -> str:
    return f"{depth:03g}"


class NeedleProbe(Probe):
    name = "needle"
    summary = "multi-needle retrieval accuracy by context length and answer depth (LWM / Gemini 1.5 protocol)"
    cites = "Table 2, Fig. 5, §3.3"
    Settings: ClassVar[type] = NeedleSettings
    defaults_shown = {"contexts": "the run's length − digits − 1"}
    headline = "needle/N{needles}_R{queries}/accuracy"
    comparisons = (TableComparison(table="needle", title="Table 2 / Fig. 5: multi-needle retrieval accuracy by "
                                   "context and answer depth (mean: over depths)",
                                   keys=("needles", "queries", "context", "depth"), values=("accuracy",),
                                   mean_over="depth"),)

    def check(self, settings: NeedleSettings, config: Config) -> None:
        if settings.needles < 1 or settings.needles > len(needles.CITIES):
            raise ConfigError("needle.needles", f"expected 1 to {len(needles.CITIES)} needles (one per "
                              f"city of diffsweep.eval.needles.CITIES), got {settings.needles}")
        if not 1 <= settings.queries <= settings.needles:
            raise ConfigError("needle.queries", f"expected 1 to needles = {settings.needles} queried cities, "
                              f"got {settings.queries}")
        for key, value in (("samples", settings.samples), ("digits", settings.digits), ("batch", settings.batch)):
            if value < 1:
                raise ConfigError(f"needle.{key}", f"expected a positive integer, got {value}")
        if not settings.depths or any(not 0 <= d <= 100 for d in settings.depths):
            raise ConfigError("needle.depths", f"expected depths in percent, 0 to 100, got {list(settings.depths)}")
        seq_len, extra = config.train.seq_len, new_tokens(settings.digits) - 1
        for context in contexts(settings, config):
            if context < 1:
                raise ConfigError("needle.contexts", f"expected positive lengths, got {context}")
            if context + extra > seq_len and not settings.allow_longer:
                raise ConfigError("needle.contexts", f"{context} tokens plus the answer ({extra} more) is longer "
                                  f"than the model's trained length (train.seq_len = {seq_len}); at most "
                                  f"{seq_len - extra}, or set needle.allow_longer=true to test RoPE extrapolation")

    def run(self, ctx: EvalContext, settings: NeedleSettings) -> ProbeResult:
        model, label = ctx.model, _label(settings)
        model.eval()
        result = ProbeResult()
        rows: list[dict[str, Any]] = []
        seq_len = ctx.config.train.seq_len
        for context in contexts(settings, ctx.config):
            if context + new_tokens(settings.digits) - 1 > seq_len:
                result.notes.append(f"needle: context {context} with its answer is longer than the trained "
                                    f"{seq_len} tokens (RoPE extrapolation)")
            for depth in settings.depths:
                try:
                    prompts = needles.needle_prompts(
                        ctx.val_tokens, ctx.tokenizer, context=context, needles=settings.needles,
                        queries=settings.queries, depth=depth, samples=settings.samples, digits=settings.digits,
                        seed=ctx.seed)
                except ValueError as exc:
                    raise ConfigError("needle.contexts", str(exc)) from exc
                texts = self.answers(ctx, [p.tokens for p in prompts], settings)
                hits = [needles.recovered(t, p.answer) for t, p in zip(texts, prompts, strict=True)]
                accuracy = sum(hits) / len(hits)
                result.metrics[f"needle/{label}/ctx_{context:04d}/depth_{_depth(depth)}/accuracy"] = accuracy
                rows.append({"needles": settings.needles, "queries": settings.queries, "context": context,
                             "depth": depth, "samples": settings.samples, "accuracy": accuracy})
        result.metrics[f"needle/{label}/accuracy"] = sum(r["accuracy"] for r in rows) / len(rows)
        result.tables["needle"] = rows
        result.files.append(heat_map(rows, ctx.out_dir / f"needle_{label}.png",
                                     display_name(ctx.config.model.attention.kind), settings))
        return result

    def answers(self, ctx: EvalContext, prompts: list[list[int]], settings: NeedleSettings) -> list[str]:
        """The decoded greedy continuation of each prompt (in batches of ``settings.batch``)."""
        def finished(row: list[int]) -> bool:
            return _answered(ctx.tokenizer.decode(row))

        texts = []
        for i in range(0, len(prompts), settings.batch):
            batch = torch.tensor(prompts[i : i + settings.batch], dtype=torch.long, device=ctx.device)
            with ctx.autocast():
                new = greedy(ctx.model, batch, new_tokens(settings.digits), finished)
            texts += [ctx.tokenizer.decode(row) for row in new.tolist()]
        return texts


def heat_map(rows: list[dict[str, Any]], path: Path, title: str, settings: NeedleSettings) -> Path:
    """Fig. 5's picture: accuracy by answer depth (rows) and context length (columns), with the
    mean over depths as the bottom row (``heat_map_figure``), written to ``path``."""
    return save_figure(heat_map_figure(rows, title, settings), path)


def heat_map_figure(rows: list[dict[str, Any]], title: str, settings: NeedleSettings) -> Any:
    """The heat map's figure; its title is wrapped to the figure's width (a single context makes a
    narrow figure that a one-line title would overflow)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["context"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    cell = {(r["context"], r["depth"]): r["accuracy"] for r in rows}
    grid = [[cell[c, d] for c in lengths] for d in depths]
    grid.append([sum(cell[c, d] for d in depths) / len(depths) for c in lengths])
    width = max(4.0, 1.2 + 0.9 * len(lengths))  # inches: room for the colour bar and the labels
    fig, ax = plt.subplots(figsize=(width, 1.6 + 0.45 * len(grid)))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for y, line in enumerate(grid):
        for x, value in enumerate(line):
            ax.text(x, y, f"{value:.2f}", ha="center", va="center", fontsize="small")
    ax.axhline(len(depths) - 0.5, color="black", linewidth=1.2)
    ax.set_xticks(range(len(lengths)), [str(c) for c in lengths])
    ax.set_yticks(range(len(grid)), [f"{d:g}%" for d in depths] + ["avg"])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("answer needle depth")
    fig.colorbar(image, ax=ax, label="accuracy")
    text = f"{title}: N={settings.needles}, R={settings.queries}, {settings.samples} samples per cell"
    # ~0.55 em per character of the medium (10 pt) font, over the figure's width less a margin
    per_line = max(12, int((width - 0.4) * 72 / (0.55 * 10)))
    fig.suptitle("\n".join(textwrap.wrap(text, per_line)), fontsize="medium")
    return fig
