"""What ``analyse`` returns: the fit's JSON-able summary as typed fields, plus what stays in memory.

``FitResult.to_dict()`` is the document written as fit.json and logged to MLflow; its keys and
their order are the file's (fields in declaration order; an optional output that was not made is
left out rather than written as null). The points table and the fitted curves (with their
bootstrap draws) are fields too, but not part of the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from diffsweep.scaling.ratio import Curve

class FitWarning(UserWarning):
    """A fit that still answers, with a caveat the user must see."""


_OPTIONAL = {"optional": True}  # left out of the document when None
_MEMORY = {"memory": True}  # never part of the document


@dataclass(frozen=True)
class FitResult:
    """One fit: laws per architecture, bootstrap CIs, ratios and the checks around them."""

    axis: str  # N, D, or "N,D" for a joint L(N, D) law
    count: str
    form: str
    objective: str
    shared_e: bool
    baseline: str
    candidates: list[str]
    level: float
    n_boot: int
    seed: int
    noise: dict[str, Any]  # bootstrap.Noise.to_dict()
    resampling: dict[str, Any]  # how the draws were made: method, unit, why
    measured_range: list[float]  # the baseline's smallest and largest x
    other_ref: float | None  # the fixed D of a joint law's ρ_N (its baseline's largest D)
    fits: dict[str, dict[str, Any]]  # per architecture: params, ci, se, diagnostics, points, band
    ratios: list[dict[str, Any]]  # one row per candidate and reference
    ratio_curve: dict[str, dict[str, Any]]  # per candidate: ratio and CI along a grid of x
    per_point: list[dict[str, Any]]  # each candidate size against the baseline's curve
    paper_reading: dict[str, Any] | None  # None for a joint law (the paper read one axis)
    points_used: int
    pure_law_fits: dict[str, dict[str, float]] | None = field(default=None, metadata=_OPTIONAL)
    holdout: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)
    compute_optimal: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)
    shift_model: dict[str, dict[str, Any]] | None = field(default=None, metadata=_OPTIONAL)
    tuning: dict[str, Any] | None = field(default=None, metadata=_OPTIONAL)  # best-of-grid: each cell's winner
    # a token scan's D points: "checkpoints" (intermediate evaluations), "branches" (annealed cooldown
    # branches and their parents' final evaluations) or "runs" (one separate run per D)
    token_points: str | None = field(default=None, metadata=_OPTIONAL)
    warnings: list[str] = field(default_factory=list)
    points: pd.DataFrame | None = field(default=None, repr=False, compare=False, metadata=_MEMORY)
    curves: dict[str, Curve] = field(default_factory=dict, repr=False, compare=False, metadata=_MEMORY)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able document (fit.json's content before the pipeline adds ``source``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("memory") or (f.metadata.get("optional") and value is None):
                continue
            out[f.name] = value
        return out
