"""Attention-logit quantization (paper Fig. 8, §3.7): validation loss with the attention logits
quantized to fewer bits.

For each bit width b, the validation loss of the model whose attention logits are absmax-quantized
to b signed bits, one scale per ``granularity`` group (``diffsweep.eval.tap``), without calibration
or fine-tuning, as in the paper; 16 bits, the unquantized model, is always evaluated. With ``tasks``,
also the zero-shot downstream accuracy of the same quantized model at each width (Fig. 8's other
half, through the ``downstream`` probe's lm-evaluation-harness). ``QuantizationProbe``'s docstring
gives the exact definitions, metrics and tables. The paper does not say which granularity it used,
and it changes the 4-bit result: docs/eval.md, 'Quantization granularity', says why ``head`` is the
default. See docs/eval.md, 'The probes'.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffsweep.config import Config, ConfigError
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, TableComparison
from diffsweep.eval.probes.downstream import DownstreamProbe, DownstreamSettings, evaluate_tasks
from diffsweep.eval.probes.outliers import check_counts, validation_windows
from diffsweep.eval.tap import UNQUANTIZED, Granularity, replacement_note, tapped
from diffsweep.train.probes import token_losses


@dataclass(frozen=True)
class QuantizationSettings:
    """``bits``: widths to evaluate, each in 2..16 (16: unquantized); ``tokens``: predicted
    validation tokens; ``micro_batch``: windows (or lm-eval requests) per forward (bounds the
    ``(B, H, T, T)`` logits the explicit path holds); ``tasks``: lm-eval tasks also evaluated at
    each width (none: validation loss only), with ``include_path`` and ``limit`` as for the
    ``downstream`` probe; ``granularity``: which logits share one scale (tensor, head, row)."""

    bits: tuple[int, ...] = (16, 8, 6, 4)
    tokens: int = 65_536
    micro_batch: int = 8
    granularity: Granularity = Granularity.HEAD
    tasks: tuple[str, ...] = ()
    include_path: str = ""
    limit: int = 0

    def downstream(self) -> DownstreamSettings:
        """The ``downstream`` probe's settings for these tasks (zero-shot, as in the paper)."""
        return DownstreamSettings(tasks=self.tasks, include_path=self.include_path, limit=self.limit,
                                  batch=self.micro_batch, num_fewshot=0)


class QuantizationProbe(Probe):
    """For each bit width b, the validation loss (mean next-token cross-entropy over the validation
    windows: non-overlapping, from the start of the split, the run's ``train.seq_len`` tokens each,
    ``tokens`` predicted tokens in all and at least one window) of the model whose attention logits are
    absmax-quantized to b signed bits, one scale per ``granularity`` group (``tensor``: all heads of a
    sequence; ``head``: one head of a sequence, the default; ``row``: one query row of a head;
    ``diffsweep.eval.tap``: every layer, both maps of DIFF V1, all 2h query heads of DIFF V2). 16 bits
    is the unquantized model, computed by the run's own backend under its autocast (the paper's 16-bit
    baseline), and is always evaluated: ``delta`` is each width's loss minus its loss. The paper
    quantizes without any calibration or fine-tuning (dynamic post-training quantization), as here.

    With ``tasks`` (lm-eval task names, as the ``downstream`` probe takes them; none by default), the
    paper's other half of Fig. 8: the zero-shot downstream accuracy of the same quantized model at each
    bit width, through lm-evaluation-harness (``diffsweep.eval.probes.downstream``; needs the
    ``lm-eval`` extra; the tasks' datasets offline, as there). 16 bits gives the ``downstream``
    probe's numbers exactly.

    Metrics: ``quantization/bits_XX/val_loss``, and with tasks ``quantization/bits_XX/TASK/METRIC``
    (and ``quantization/bits_XX/downstream_average``); table ``quantization``: rows ``{bits, val_loss,
    delta, granularity}``, widest first (``compare --probes`` keys a cell on granularity and bits, so
    evaluations at two granularities never pool); with tasks, table ``quantization_downstream``: rows
    ``{bits, task, metric, value, stderr, delta, granularity}`` (``delta``: the value minus its 16-bit
    value).
    """

    name = "quantization"
    summary = ("validation loss with the attention logits absmax-quantized to each bit width (16: unquantized), in "
               "every backend; with `tasks`, the zero-shot accuracy at each width too")
    cites = "Fig. 8, §3.7"
    Settings = QuantizationSettings
    defaults_shown = {"tasks": "none: the loss only", "limit": "0: all"}
    comparisons = (TableComparison(table="quantization", title="Fig. 8: validation loss with attention logits "
                                   "quantized to b bits", keys=("granularity", "bits"), values=("val_loss", "delta"),
                                   x="bits"),
                   TableComparison(table="quantization_downstream", title="Fig. 8: zero-shot accuracy with attention "
                                   "logits quantized to b bits", keys=("task", "granularity", "bits"),
                                   values=("value", "delta"),
                                   where=(("metric", "acc"),)))

    def check(self, settings: QuantizationSettings, config: Config) -> None:
        bad = [b for b in settings.bits if not 2 <= b <= UNQUANTIZED]
        if bad or not settings.bits:
            raise ConfigError(f"{self.name}.bits", f"expected bit widths in 2..{UNQUANTIZED}, got {list(settings.bits)}")
        check_counts(self.name, settings)
        if settings.tasks or settings.include_path or settings.limit:
            if not settings.tasks:
                raise ConfigError(f"{self.name}.tasks", "expected lm-eval tasks to evaluate at each bit width "
                                  "(include_path and limit are for them)")
            try:
                DownstreamProbe().check(settings.downstream(), config)
            except ConfigError as exc:  # named by this probe's keys
                raise ConfigError(exc.key.replace("downstream.", f"{self.name}.", 1).replace(
                    f"{self.name}.batch", f"{self.name}.micro_batch"), exc.message) from None

    def headline_metric(self, settings: QuantizationSettings) -> str:
        """The validation loss at the narrowest width asked for (where quantization matters most)."""
        return f"quantization/bits_{min(settings.bits):02d}/val_loss"

    @torch.no_grad()
    def run(self, ctx: EvalContext, settings: QuantizationSettings) -> ProbeResult:
        result = ProbeResult()
        data = validation_windows(ctx, settings.tokens, result)
        widths = sorted(set(settings.bits) | {UNQUANTIZED}, reverse=True)
        losses = {bits: validation_loss(ctx, data, settings.micro_batch, bits, settings.granularity)
                  for bits in widths}
        note = replacement_note(ctx.model, widths)
        if note is not None:
            result.notes.append(note)
        base = losses[UNQUANTIZED]
        result.tables["quantization"] = [{"bits": b, "val_loss": loss, "delta": loss - base,
                                          "granularity": settings.granularity.value} for b, loss in losses.items()]
        result.metrics = {f"quantization/bits_{b:02d}/val_loss": loss for b, loss in losses.items()}
        if settings.tasks:
            downstream(ctx, settings, widths, result)
        return result


def downstream(ctx: EvalContext, settings: QuantizationSettings, widths: list[int], result: ProbeResult) -> None:
    """The lm-eval tasks at each width (the model's attention logits quantized while they run)
    into ``result``: metrics and the ``quantization_downstream`` table."""
    by_width = {}
    for bits in widths:
        with tapped(ctx.model, bits=bits, granularity=settings.granularity):
            by_width[bits] = evaluate_tasks(ctx, settings.downstream())
    base = {(r["task"], r["metric"]): r["value"] for r in by_width[UNQUANTIZED].tables.get("downstream", [])}
    rows = result.tables["quantization_downstream"] = []
    for bits, found in by_width.items():
        for name, value in found.metrics.items():  # downstream/TASK/METRIC, downstream/average
            short = name.removeprefix("downstream/")
            result.metrics[f"quantization/bits_{bits:02d}/{'downstream_average' if short == 'average' else short}"] = value
        rows += [{"bits": bits, **row, "delta": row["value"] - base[row["task"], row["metric"]],
                  "granularity": settings.granularity.value}
                 for row in found.tables.get("downstream", [])]
    result.notes += sorted({note for found in by_width.values() for note in found.notes})


def validation_loss(ctx: EvalContext, data: torch.Tensor, micro_batch: int, bits: int,
                    granularity: Granularity = Granularity.HEAD) -> float:
    """Mean ``token_losses`` over windows ``data`` ``(N, T + 1)``, logits quantized to ``bits`` with
    one scale per ``granularity`` group (summed in fp64 micro-batch by micro-batch, then divided by
    the number of targets)."""
    total, count = 0.0, 0
    with tapped(ctx.model, bits=bits, granularity=granularity):
        for batch in data.split(micro_batch):
            with ctx.autocast():
                losses = token_losses(ctx.model, batch.to(ctx.device))
            total += float(losses.double().sum())
            count += losses.numel()
    return total / count
