"""Activation outliers (paper Table 5, §3.6): the largest and the median magnitudes of the attention
logits and of the hidden states, on the validation split.

Over the run's validation windows, ``attn_logit`` is |q·kᵀ/√d| at the causal positions of every
query head (``diffsweep.eval.tap``) and ``hidden`` |each block's output|; their top-K and median per
layer and over all layers. The statistics are kept in one pass and constant memory (``AbsStats``:
top 100 exactly, the median from a bfloat16-bin histogram), where the exact median would need every
value. ``OutliersProbe``'s docstring gives the exact definitions, metrics and table; ``AbsStats``'s
the statistics'.

See docs/eval.md, 'The probes'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from diffsweep.config import Config, ConfigError
from diffsweep.data.dataset import val_starts, windows
from diffsweep.eval.probe import Capped, EvalContext, Probe, ProbeResult, TableComparison
from diffsweep.eval.tap import tapped

TOPS = (1, 2, 3, 10, 100)  # Table 5's columns
BINS = 1 << 15  # top 16 bits of a non-negative float32 (sign 0): exponent and 7 mantissa bits
WHATS = ("attn_logit", "hidden")


class AbsStats:
    """Running top 100 and bfloat16-bin histogram of the values added.

    - ``topK`` (K = 1, 2, 3, 10, 100): the K-th largest value, counting repeats (kept exactly, as a
      running top 100 merged batch by batch); absent when fewer than K values were seen;
    - ``median``: the lower median (the value of 0-based rank ⌊(N − 1)/2⌋ among the N sorted values,
      as ``torch.median``) truncated to bfloat16 precision: its float32 bits with the low 16 cleared
      (8 significant bits, within a relative 2⁻⁷ below the exact median). This is exact from a 32768-bin
      histogram of the values' top 16 bits, so it needs one pass and constant memory, where the exact
      median would need every value (2·10¹¹ logits for a 3B model at 0.4M tokens).
    """

    def __init__(self) -> None:
        self.top = torch.zeros(0)  # the largest values seen, descending
        self.hist = torch.zeros(BINS, dtype=torch.int64)
        self.count = 0

    def add(self, values: torch.Tensor) -> None:
        """Add |values| (any shape)."""
        a = values.detach().float().abs().flatten()
        bins = torch.bincount(a.view(torch.int32) >> 16, minlength=BINS)  # |a| >= 0: sign bit 0
        self._merge(a.topk(min(max(TOPS), a.numel())).values, bins, a.numel())

    def _merge(self, top: torch.Tensor, hist: torch.Tensor, count: int) -> None:
        both = torch.cat([self.top.to(top.device), top])
        self.top = both.topk(min(max(TOPS), both.numel())).values
        self.hist = self.hist.to(hist.device) + hist
        self.count += count

    @classmethod
    def union(cls, parts: list[AbsStats]) -> AbsStats:
        """The statistics of all values of ``parts`` together."""
        out = cls()
        for part in parts:
            out._merge(part.top, part.hist, part.count)
        return out

    def top_k(self, k: int) -> float | None:
        """The k-th largest value, or None when fewer than k were seen."""
        return float(self.top[k - 1]) if k <= self.top.numel() else None

    def median(self) -> float | None:
        """The lower median truncated to bfloat16 precision, or None when nothing was seen."""
        if not self.count:
            return None
        rank = (self.count - 1) // 2  # 0-based rank of the lower median
        cumulative = self.hist.cumsum(0)
        bin_index = int(torch.searchsorted(cumulative, torch.tensor(rank, device=cumulative.device), right=True))
        return float(torch.tensor(bin_index << 16, dtype=torch.int32).view(torch.float32))

    def row(self) -> dict[str, float | None]:
        return {**{f"top{k}": self.top_k(k) for k in TOPS}, "median": self.median()}


@dataclass(frozen=True)
class OutliersSettings:
    """``tokens``: predicted tokens of validation windows to read (the paper: 0.4M);
    ``micro_batch``: windows per forward (bounds the ``(B, H, T, T)`` logits in memory)."""

    tokens: int = 409_600
    micro_batch: int = 8


def check_counts(probe: str, settings: Any) -> None:
    """``tokens`` and ``micro_batch`` are positive, or a ``ConfigError`` names ``<probe>.<key>``."""
    for key in ("tokens", "micro_batch"):
        if getattr(settings, key) < 1:
            raise ConfigError(f"{probe}.{key}", f"expected a positive integer, got {getattr(settings, key)}")


def validation_windows(ctx: EvalContext, tokens: int, result: ProbeResult | None = None) -> torch.Tensor:
    """The validation windows ``(N, seq_len + 1)`` covering ``tokens`` predicted tokens (at least one):
    the same windows the trainer evaluates on (``val_starts``), at the run's ``train.seq_len``. When
    the split is too short for ``tokens``, says so in ``result.capped["tokens"]``."""
    seq_len, length = ctx.config.train.seq_len, len(ctx.val_tokens)
    starts = val_starts(length, seq_len, tokens)
    if result is not None and (length - 1) // seq_len * seq_len < tokens:  # the data limits it, not the rounding
        result.capped["tokens"] = Capped(tokens, len(starts) * seq_len, f"the validation split has {length:,} "
                                         f"tokens: {len(starts)} windows of {seq_len}")
    return torch.from_numpy(windows(ctx.val_tokens, starts, seq_len))


class OutliersProbe(Probe):
    """Values, over the validation windows (non-overlapping, from the start of the split, the run's
    ``train.seq_len`` tokens each, ``tokens`` predicted tokens in all and at least one window; one
    forward per micro-batch under the run's autocast):

    - ``attn_logit``: |q·kᵀ/√d| at the causal positions (key s ≤ query t) of every query head, in
      fp32 from the q and k the backend receives (``diffsweep.eval.tap``): both maps of DIFF V1, all
      2h query heads of DIFF V2;
    - ``hidden``: |each block's output| (the residual stream after block l), every channel of every token.

    Statistics (``AbsStats``), over all values of one layer (``layer_XX``, 1-based) or of all layers
    (``all``): ``top1``, ``top2``, ``top3``, ``top10``, ``top100`` and ``median``.

    Metrics: ``outliers/<what>/<stat>`` (all layers) and ``outliers/<what>/layer_XX/<stat>``; table
    ``outliers``: rows ``{layer ("all" or 1..L), what, top1, top2, top3, top10, top100, median}``.
    """

    name = "outliers"
    summary = ("top-k and median |attention logit| (pre-softmax, every map of DIFF) and |hidden state|, per layer "
               "and overall")
    cites = "Table 5, §3.6"
    Settings = OutliersSettings
    defaults_shown = {"tokens": "409,600: the paper's 0.4M"}
    headline = "outliers/attn_logit/top1"
    comparisons = (TableComparison(table="outliers", title="Table 5: largest (top1) and median activation over all "
                                   "layers", keys=("what",), values=("top1", "median"), where=(("layer", "all"),)),)

    def check(self, settings: OutliersSettings, config: Config) -> None:
        check_counts(self.name, settings)

    @torch.no_grad()
    def run(self, ctx: EvalContext, settings: OutliersSettings) -> ProbeResult:
        blocks = ctx.model.blocks()
        stats = {what: [AbsStats() for _ in blocks] for what in WHATS}

        def observe(layer: int, logits: torch.Tensor, causal: torch.Tensor) -> None:
            stats["attn_logit"][layer - 1].add(logits[:, :, causal])

        def hidden_hook(index: int):
            def hook(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
                stats["hidden"][index].add(output)
            return hook

        result = ProbeResult()
        data = validation_windows(ctx, settings.tokens, result)
        handles = [block.register_forward_hook(hidden_hook(i)) for i, block in enumerate(blocks)]
        try:
            with tapped(ctx.model, observer=observe):
                for batch in data.split(settings.micro_batch):
                    with ctx.autocast():
                        ctx.model(batch[:, :-1].to(ctx.device))
        finally:
            for handle in handles:
                handle.remove()

        seq_len = data.shape[1] - 1
        result.notes.append(f"{len(data)} validation windows of {seq_len} tokens ({len(data) * seq_len:,} tokens)")
        rows: list[dict[str, Any]] = []
        for what in WHATS:
            for layer, part in [("all", AbsStats.union(stats[what])), *enumerate(stats[what], start=1)]:
                row = part.row()
                rows.append({"layer": layer, "what": what, **row})
                prefix = f"outliers/{what}" + ("" if layer == "all" else f"/layer_{layer:02d}")
                result.metrics.update({f"{prefix}/{stat}": value for stat, value in row.items() if value is not None})
        result.tables["outliers"] = rows
        return result
