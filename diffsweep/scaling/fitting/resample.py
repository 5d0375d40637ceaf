"""Case and cluster resampling for large fits (docs/references.md §6, §7).

A parametric bootstrap trusts the fitted curve and a noise model; with many points the data can
speak for themselves. Every architecture with at least ``CASE_MIN_POINTS`` distinct design points
is resampled non-parametrically:

- ``case``: rows drawn with replacement (Epoch AI's bootstrap of the Chinchilla points);
- ``cluster``: whole runs drawn with replacement when some run gave several points (the
  evaluations of one run share its seed and data order, so they move together).

A draw is the data with each point counted as often as it was drawn; it is refitted by weighting
the objective, warm-started at the estimate. Small ladders keep the parametric bootstrap: a case
resample of 5 sizes has at most 3 distinct sizes 58% of the time (§4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diffsweep.scaling.fitting.fit import LawFit
from diffsweep.scaling.fitting.optimize import solve_batch

CASE_MIN_POINTS = 30  # distinct design points per architecture before rows are resampled
CLUSTER_MIN_RUNS = 10  # runs per architecture before whole runs are resampled (fewer: parametric)


@dataclass(frozen=True)
class Resampling:
    """How the bootstrap draws were made (``result["resampling"]``)."""

    method: str  # parametric | case | cluster
    unit: str  # point | run
    why: str

    def to_dict(self) -> dict:
        return {"method": self.method, "unit": self.unit, "why": self.why}


def choose(cells: dict[str, int], runs: dict[str, np.ndarray], joint: bool) -> Resampling | None:
    """Case/cluster resampling when every architecture has ≥ CASE_MIN_POINTS distinct design
    points (``cells``), the fit is one law per architecture and, where runs gave several points,
    there are ≥ CLUSTER_MIN_RUNS runs to draw; None: keep the parametric bootstrap."""
    smallest = min(cells.values())
    if joint or smallest < CASE_MIN_POINTS:
        return None
    if any(len(np.unique(r)) < len(r) for r in runs.values()):
        n_runs = min(len(np.unique(r)) for r in runs.values())
        if n_runs < CLUSTER_MIN_RUNS:  # a resample of 3 runs is one run thrice 1 time in 9
            return None
        return Resampling("cluster", "run", (
            f"at least {smallest} distinct points per architecture, and some runs gave several evaluations: whole runs "
            f"(at least {n_runs} per architecture) are drawn with replacement so a run's evaluations move together"))
    return Resampling("case", "point", (
        f"at least {smallest} distinct points per architecture ({CASE_MIN_POINTS} needed): points are drawn with "
        "replacement, so the CIs rest on the data's own scatter rather than on a noise model"))


def weights(rng: np.random.Generator, clusters: np.ndarray, n_boot: int) -> np.ndarray:
    """(B, n) how often each point is counted in each draw; ``clusters`` (n,) its run (or itself)."""
    k = int(clusters.max()) + 1
    drawn = rng.integers(0, k, size=(n_boot, k))
    counts = np.zeros((n_boot, k))
    np.add.at(counts, (np.arange(n_boot)[:, None], drawn), 1.0)
    return counts[:, clusters]


def refit(fit: LawFit, w: np.ndarray) -> np.ndarray:
    """Refit ``fit`` to each weighted draw (B, n), warm-started at the estimate: (B, p)."""
    start = np.repeat(fit.theta[None, :], w.shape[0], axis=0)
    theta, _ = solve_batch(fit.law, fit.data, start, fit.objective, max_iter=200, weights=w)
    return theta
