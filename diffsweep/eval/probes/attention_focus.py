"""Attention to the answer vs attention noise (paper §3.4, Table 3).

On the multi-needle retrieval prompts (``diffsweep.eval.needles``, the same generator as the
``needle`` probe), how much of the attention the answer prompt's positions pay goes to the answer
needle, and how much to the rest of the context, per depth of the answer needle. The maps are what
every output head applies to V (``A1 − λ·A2`` for DIFF V1, so DIFF's cancellation shows), each row
normalised by the sum of its absolute values so that both kinds are on one scale;
``AttentionFocusProbe``'s docstring defines **answer** and **noise** exactly. The paper's Table 3
(3B models, 64K context): Transformer 0.03–0.09 to the answer and 0.49–0.54 noise; DIFF 0.27–0.40
and 0.01–0.02. See docs/eval.md, 'The probes'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from diffsweep.config import Config, ConfigError
from diffsweep.eval.needles import ANSWER_PREFIX, NEEDLE, needle_prompts, question
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, TableComparison


@dataclass(frozen=True)
class FocusSettings:
    """``needles`` N (one of them answers, the others distract), ``context`` in tokens (0: the
    run's ``train.seq_len``), ``depths`` in percent, ``samples`` prompts per depth, ``batch``
    prompts per forward."""

    needles: int = 4
    context: int = 0
    depths: tuple[float, ...] = (0.0, 25.0, 50.0, 75.0, 100.0)
    samples: int = 20
    batch: int = 8


class AttentionFocusProbe(Probe):
    """Exactly:

    - the maps are each layer's ``AttentionModule.attention_maps``: what every output head applies
      to V (softmax for the Transformer; ``A1 − λ·A2`` for DIFF V1; V2's paired heads with their
      per-token λ), so DIFF's cancellation shows;
    - the query rows are the positions of the answer prefix ("\\nThe magic number of CITY is"), the
      last tokens of the prompt, where the model is about to state the number;
    - each row is normalised by the sum of its absolute values (softmax rows already sum to 1; a
      differential row may have negative entries and a smaller sum), so both kinds are on one scale;
    - **answer** = the normalised row's (signed) sum over the answer needle's tokens (the whole
      sentence "\\nThe magic number of CITY is NUMBER.\\n" that holds the answer);
    - **noise** = the normalised row's absolute sum over the other context tokens: the haystack and
      the other needles (not the question and answer prefix at the end, which are the query itself);
    - both are averaged over the query rows, heads, layers and samples, per depth of the answer needle.
    """

    name = "attention_focus"
    summary = "attention the answer prompt pays to the answer needle vs the rest of the context"
    cites = "Table 3, §3.4"
    Settings = FocusSettings
    defaults_shown = {"context": "the run's"}
    headline = "attention_focus/answer"
    comparisons = (TableComparison(table="attention_focus", title="Table 3: attention to the answer and to noise by "
                                   "answer depth (mean: over depths)", keys=("context", "needles", "depth"),
                                   values=("answer", "noise"), mean_over="depth"),)

    def check(self, settings: FocusSettings, config: Config) -> None:
        if settings.context < 0:
            raise ConfigError(f"{self.name}.context", f"expected a length in tokens (0: train.seq_len = "
                              f"{config.train.seq_len}), got {settings.context}")
        context = settings.context or config.train.seq_len
        if context > config.train.seq_len:
            raise ConfigError(f"{self.name}.context", f"{context} tokens is longer than the model's training "
                              f"length ({config.train.seq_len})")
        if settings.needles < 1:
            raise ConfigError(f"{self.name}.needles", f"expected at least 1, got {settings.needles}")
        if not settings.depths or any(not 0 <= d <= 100 for d in settings.depths):
            raise ConfigError(f"{self.name}.depths", f"expected percentages in [0, 100], got {list(settings.depths)}")
        for key in ("samples", "batch"):
            if getattr(settings, key) < 1:
                raise ConfigError(f"{self.name}.{key}", f"expected a positive integer, got {getattr(settings, key)}")

    @torch.no_grad()
    def run(self, ctx: EvalContext, settings: FocusSettings) -> ProbeResult:
        context = settings.context or ctx.config.train.seq_len
        result = ProbeResult()
        totals: dict[str, list[float]] = {"answer": [], "noise": []}
        for depth in settings.depths:
            try:
                prompts = needle_prompts(ctx.val_tokens, ctx.tokenizer, context=context, needles=settings.needles,
                                         queries=1, depth=depth, samples=settings.samples, seed=ctx.seed)
            except ValueError as exc:
                raise ConfigError(f"{self.name}.context", str(exc)) from None
            answer: list[float] = []
            noise: list[float] = []
            for first in range(0, len(prompts), settings.batch):
                chunk = prompts[first : first + settings.batch]
                tokens = torch.tensor([p.tokens for p in chunk], device=ctx.device)
                masks = [_masks(p, ctx.tokenizer, context) for p in chunk]
                rows = torch.tensor([m[2] for m in masks]).max().item()  # the longest answer prefix
                maps = _layer_maps(ctx, tokens, int(rows))  # per layer: (B, h, rows, T)
                answer_mask = torch.stack([m[0] for m in masks]).to(ctx.device)  # (B, T)
                noise_mask = torch.stack([m[1] for m in masks]).to(ctx.device)
                row_mask = torch.stack([torch.arange(int(rows)) >= int(rows) - m[2] for m in masks]).to(ctx.device)
                for m in maps:
                    m = m / m.abs().sum(-1, keepdim=True).clamp_min(1e-30)
                    a = (m * answer_mask[:, None, None, :]).sum(-1)  # (B, h, rows)
                    n = (m.abs() * noise_mask[:, None, None, :]).sum(-1)
                    for values, into in ((a, answer), (n, noise)):
                        per_prompt = (values.mean(1) * row_mask).sum(-1) / row_mask.sum(-1)  # (B,)
                        into += per_prompt.tolist()
            layers = len(ctx.model.blocks())
            # ``answer``/``noise`` hold one value per (layer, prompt): their mean is over both.
            a_mean, n_mean = sum(answer) / len(answer), sum(noise) / len(noise)
            totals["answer"].append(a_mean)
            totals["noise"].append(n_mean)
            tag = f"depth_{depth:g}"
            result.metrics[f"attention_focus/{tag}/answer"] = a_mean
            result.metrics[f"attention_focus/{tag}/noise"] = n_mean
            result.tables.setdefault("attention_focus", []).append(
                {"depth": depth, "context": context, "needles": settings.needles, "samples": settings.samples,
                 "layers": layers, "answer": a_mean, "noise": n_mean})
        result.metrics["attention_focus/answer"] = sum(totals["answer"]) / len(totals["answer"])
        result.metrics["attention_focus/noise"] = sum(totals["noise"]) / len(totals["noise"])
        return result


def _masks(prompt: Any, tokenizer: Any, context: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """For one prompt: which keys are the answer needle, which are noise (the other context before
    the question), and how many query rows (the answer prefix's tokens) end the prompt."""
    index = prompt.cities.index(prompt.city)
    needle = len(tokenizer.encode(NEEDLE.format(city=prompt.city, number=prompt.answer)))
    prefix = len(tokenizer.encode(ANSWER_PREFIX.format(city=prompt.city)))
    start = prompt.needle_offsets[index]
    answer = torch.zeros(context, dtype=torch.bool)
    answer[start : start + needle] = True
    tail = len(tokenizer.encode(question([prompt.city]))) + prefix  # the question, then the answer prefix
    noise = torch.zeros(context, dtype=torch.bool)
    noise[: context - tail] = True
    noise &= ~answer
    return answer, noise, prefix


def _layer_maps(ctx: EvalContext, tokens: torch.Tensor, rows: int) -> list[torch.Tensor]:
    """Every layer's attention maps for the last ``rows`` query positions: ``(B, h, rows, T)``."""
    model = ctx.model
    rope = model.rope(tokens.shape[1], tokens.device)
    found: list[torch.Tensor] = []

    def hook(module: Any, inputs: tuple[torch.Tensor, ...]) -> None:
        found.append(module.attention_maps(inputs[0], rope)[:, :, -rows:, :].float())

    handles = [block.attention.register_forward_pre_hook(hook) for block in model.blocks()]
    try:
        with ctx.autocast():
            model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return found
