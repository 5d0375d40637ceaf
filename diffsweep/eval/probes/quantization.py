"""Attention-logit quantization (paper Fig. 8, §3.7): validation loss with the attention logits
quantized to fewer bits.

For each bit width b, the validation loss (mean next-token cross-entropy over the validation
windows: non-overlapping, from the start of the split, the run's ``train.seq_len`` tokens each,
``tokens`` predicted tokens in all and at least one window) of the model whose attention logits are
absmax-quantized to b signed bits per (batch, head) slice (``diffsweep.eval.tap``: every layer,
both maps of DIFF V1, all 2h query heads of DIFF V2). 16 bits is the unquantized model, computed
by the run's own backend under its autocast (the paper's 16-bit baseline), and is always evaluated:
``delta`` is each width's loss minus its loss. The paper quantizes without any calibration or
fine-tuning (dynamic post-training quantization), as here.

Metrics: ``quantization/bits_XX/val_loss``; table ``quantization``: rows ``{bits, val_loss,
delta}``, widest first.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from diffsweep.config import Config, ConfigError
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, TableComparison
from diffsweep.eval.probes.outliers import check_counts, validation_windows
from diffsweep.eval.tap import UNQUANTIZED, replacement_note, tapped
from diffsweep.train.probes import token_losses


@dataclass(frozen=True)
class QuantizationSettings:
    """``bits``: widths to evaluate, each in 2..16 (16: unquantized); ``tokens``: predicted
    validation tokens; ``micro_batch``: windows per forward (bounds the ``(B, H, T, T)`` logits
    the explicit path holds)."""

    bits: tuple[int, ...] = (16, 8, 6, 4)
    tokens: int = 65_536
    micro_batch: int = 8


class QuantizationProbe(Probe):
    name = "quantization"
    summary = "validation loss with attention logits absmax-quantized to 16/8/6/4 bits"
    cites = "Fig. 8, §3.7"
    Settings = QuantizationSettings
    comparisons = (TableComparison(table="quantization", title="Fig. 8: validation loss with attention logits "
                                   "quantized to b bits", keys=("bits",), values=("val_loss", "delta"), x="bits"),)

    def check(self, settings: QuantizationSettings, config: Config) -> None:
        bad = [b for b in settings.bits if not 2 <= b <= UNQUANTIZED]
        if bad or not settings.bits:
            raise ConfigError(f"{self.name}.bits", f"expected bit widths in 2..{UNQUANTIZED}, got {list(settings.bits)}")
        check_counts(self.name, settings)

    @torch.no_grad()
    def run(self, ctx: EvalContext, settings: QuantizationSettings) -> ProbeResult:
        data = validation_windows(ctx, settings.tokens)
        widths = sorted(set(settings.bits) | {UNQUANTIZED}, reverse=True)
        losses = {bits: validation_loss(ctx, data, settings.micro_batch, bits) for bits in widths}
        result = ProbeResult()
        note = replacement_note(ctx.model, widths)
        if note is not None:
            result.notes.append(note)
        base = losses[UNQUANTIZED]
        result.tables["quantization"] = [{"bits": b, "val_loss": loss, "delta": loss - base} for b, loss in losses.items()]
        result.metrics = {f"quantization/bits_{b:02d}/val_loss": loss for b, loss in losses.items()}
        return result


def validation_loss(ctx: EvalContext, data: torch.Tensor, micro_batch: int, bits: int) -> float:
    """Mean ``token_losses`` over windows ``data`` ``(N, T + 1)``, logits quantized to ``bits``
    (summed in fp64 micro-batch by micro-batch, then divided by the number of targets)."""
    total, count = 0.0, 0
    with tapped(ctx.model, bits=bits):
        for batch in data.split(micro_batch):
            with ctx.autocast():
                losses = token_losses(ctx.model, batch.to(ctx.device))
            total += float(losses.double().sum())
            count += losses.numel()
    return total / count
