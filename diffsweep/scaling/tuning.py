"""Best-of-grid fits: each architecture at its own best setting (a tuned sweep's ``tune:``, or
``--tune lr`` on a table).

In every *cell* (one architecture at one size and token budget) the runs that differ only in the
tuning columns are *candidates*; the fit uses the candidate of lowest mean log loss over its runs
(``choose``). Taking that minimum over noisy candidates is biased low (the winner's curse) and the
choice itself is uncertain, so both go into the bootstrap (``reselect``): every draw regenerates each
losing candidate's mean around its observed gap to the winner (with the draw's noise scale) and
takes the cell's minimum again; the mean shift this selection makes over the draws is the estimated
selection bias, which is removed from the fitted points and from the draws, so the intervals are
centred where an unbiased reading would be. Monte Carlo coverage on synthetic studies with a known
best-vs-best ratio: analysis/benchmarks/RESULTS.md; see docs/fits.md, 'Tuned studies'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm

from diffsweep.config import ConfigError

TUNED = "tuned"  # points.csv column: "best" (the cell's winner), "lost", or "" (not a tuned cell)


@dataclass(frozen=True)
class Losers:
    """One architecture's losing candidates: each one's cell (x, other), its mean log loss above the
    winner's (``gap`` >= 0) and its number of runs."""

    x: np.ndarray
    other: np.ndarray
    gap: np.ndarray
    runs: np.ndarray


@dataclass(frozen=True)
class Choice:
    """What ``choose`` made of a table: the points with the losers marked, the losers per
    architecture for the draws, and one row per cell for the report."""

    columns: tuple[str, ...]
    points: pd.DataFrame
    losers: dict[str, Losers]
    cells: list[dict]


def choose(points: pd.DataFrame, tune: tuple[str, ...], x_col: str, other_col: str | None) -> Choice:
    """Pick each cell's best candidate among the used points (a cell: one architecture at one
    ``x_col`` value, and ``other_col`` value for a joint law); the others are marked unused
    (``reason`` says which won) and kept for the bootstrap."""
    missing = [c for c in tune if c not in points.columns]
    if missing:
        raise ConfigError("tune", f"no column {missing[0]!r} in the points; expected tuning columns among "
                          f"[{', '.join(map(str, points.columns))}]")
    pts = points.copy()
    used = pts[pts["used"].astype(bool)]
    keys = used[list(tune)].astype(str).agg("|".join, axis=1)  # each point's candidate
    logs = np.log(used["loss"].astype(float))
    tuned = pd.Series("", index=pts.index, dtype=object)
    reasons: dict[Any, str] = {}
    losers: dict[str, list[tuple[float, float, float, int]]] = {}
    cells = []
    by = ["arch", x_col, *([other_col] if other_col else [])]
    for key, rows in used.groupby(by, sort=False):  # one cell
        arch, x, other = key[0], key[1], key[2] if other_col else 0.0
        values = keys[rows.index]
        stats = logs[rows.index].groupby(values, sort=False).agg(["mean", "size"])
        best = str(stats["mean"].idxmin())
        won = values == best
        tuned[rows.index] = np.where(won, "best", "lost")
        reasons |= dict.fromkeys(rows.index[~won], f"tuning: lost to {_label(tune, best)} in its cell")
        losers.setdefault(str(arch), []).extend(
            (float(x), float(other), float(m - stats.loc[best, "mean"]), int(n))
            for k, (m, n) in stats.iterrows() if k != best)
        first = rows.groupby(values, sort=False).head(1)
        cells.append(_cell(str(arch), float(x), float(other), tune, first.set_index(values[first.index]), stats,
                           best))
    pts[TUNED] = tuned
    lost = list(reasons)
    pts.loc[lost, "used"] = False
    pts.loc[lost, "reason"] = [reasons[i] for i in lost]
    return Choice(tune, pts, {a: Losers(*(np.array(col, float) for col in zip(*rows))) for a, rows in losers.items()},
                  cells)


def candidate_noise(choice: Choice, x_col: str, other_col: str | None) -> tuple[float, int] | None:
    """The run-to-run sd of log loss (and its degrees of freedom) from every candidate's runs, for
    a tuned study without seed replicates: the residuals of an additive model, cell + tuning value,
    per architecture, pooled. The winners alone would understate it (each is the lowest of its
    cell's candidates, so they scatter less than one run does); a best value that moves with size
    puts its interaction into the residuals, which overstates it (wider intervals, not narrower).
    None: too few candidates for any degree of freedom."""
    pts = choice.points[choice.points[TUNED] != ""]
    ss, dof = 0.0, 0
    for _, rows in pts.groupby("arch", sort=False):
        cells = rows[[x_col, *([other_col] if other_col else [])]].astype(str).agg("|".join, axis=1)
        values = rows[list(choice.columns)].astype(str).agg("|".join, axis=1)
        design = np.hstack([pd.get_dummies(cells).to_numpy(float), pd.get_dummies(values).to_numpy(float)])
        y = np.log(rows["loss"].to_numpy(float))
        fitted = design @ np.linalg.lstsq(design, y, rcond=None)[0]
        ss += float(((y - fitted) ** 2).sum())
        dof += len(y) - int(np.linalg.matrix_rank(design))
    return (float(np.sqrt(ss / dof)), dof) if dof > 0 else None


def _label(tune: tuple[str, ...], key: str) -> str:
    return ", ".join(f"{c}={v}" for c, v in zip(tune, key.split("|")))


def _cell(arch: str, x: float, other: float, tune: tuple[str, ...], first: pd.DataFrame, stats: pd.DataFrame,
          best: str) -> dict:
    """The report's row: the candidates (``first``: one row of each, by candidate) with their mean
    loss and runs (``stats``), the winner, and whether it sits at an edge of the cell's grid (or is
    the only value tried)."""
    won = first.loc[best]
    edge = []
    for col in tune:
        tried = pd.to_numeric(first[col], errors="coerce").dropna().unique()
        value = pd.to_numeric(pd.Series([won[col]]), errors="coerce").iloc[0]
        if len(tried) > 1 and np.isfinite(value) and value in (tried.min(), tried.max()):
            edge.append(f"{col}={won[col]} is the {'smallest' if value == tried.min() else 'largest'} tried")
    return {"arch": arch, "x": x, "tokens": other, "winner": _label(tune, best),
            "winner_values": {c: won[c] for c in tune}, "untuned": len(stats) == 1, "edge": edge,
            "candidates": [{"values": _label(tune, str(k)), "value": _values(first.loc[k], tune),
                            "loss": float(np.exp(m)), "runs": int(n)} for k, (m, n) in stats.iterrows()]}


def _values(row: pd.Series, tune: tuple[str, ...]) -> dict[str, Any]:
    """A candidate's tuning values as JSON-able numbers (or text)."""
    out: dict[str, Any] = {}
    for col in tune:
        number = pd.to_numeric(pd.Series([row[col]]), errors="coerce").iloc[0]
        out[col] = float(number) if np.isfinite(number) else str(row[col])
    return out


def sensitivity(cells: list[dict], tune: tuple[str, ...]) -> list[dict]:
    """How much each architecture's loss rises from its best value of a single numeric tuning
    column to the next larger and the next smaller value tried, averaged over its cells (sizes):
    ``{arch, column, cells, up: {factor, rise}, down: {factor, rise}}`` (a side no cell has: None).
    Empty for several tuning columns or a non-numeric one."""
    if len(tune) != 1:
        return []
    col = tune[0]
    out = []
    for arch in dict.fromkeys(c["arch"] for c in cells):
        sides: dict[str, list[tuple[float, float]]] = {"up": [], "down": []}
        mine = [c for c in cells if c["arch"] == arch and not c["untuned"]]
        for c in mine:
            tried = [(k["value"][col], k["loss"]) for k in c["candidates"]]
            if not all(isinstance(v, float) and v > 0 for v, _ in tried):
                return []
            best_value = c["winner_values"][col]
            best = min(loss for v, loss in tried if v == float(best_value))
            above = sorted((v, loss) for v, loss in tried if v > float(best_value))
            below = sorted(((v, loss) for v, loss in tried if v < float(best_value)), reverse=True)
            for side, near in (("up", above), ("down", below)):
                if near:
                    sides[side].append((near[0][0] / float(best_value), near[0][1] / best - 1))
        out.append({"arch": arch, "column": col, "cells": len(mine),
                    **{side: ({"factor": float(np.median([f for f, _ in got])), "rise": float(np.mean([r for _, r in got])),
                               "cells": len(got)} if got else None) for side, got in sides.items()}})
    return out


def true_gap(observed: np.ndarray, tau: np.ndarray) -> np.ndarray:
    """The gap between two candidates whose observed gap, the absolute difference of their means
    (sd ``tau``), is ``observed`` on average: the folded normal's mean inverted (0 where the observed
    gap is no more than a tie gives, tau * sqrt(2/pi)). An observed winner-to-loser gap overstates a
    near tie (the winner was chosen for being low), and draws around it would understate the
    selection bias by about half for a tie."""
    def folded_mean(gap: np.ndarray) -> np.ndarray:
        return tau * np.sqrt(2 / np.pi) * np.exp(-gap ** 2 / (2 * tau ** 2)) + gap * (1 - 2 * norm.cdf(-gap / tau))

    lo, hi = np.zeros_like(observed), np.maximum(observed, 0.0)
    for _ in range(60):  # folded_mean increases from tau * sqrt(2/pi) and exceeds gap: bisect on [0, observed]
        mid = (lo + hi) / 2
        below = folded_mean(mid) < observed
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return np.where(observed <= tau * np.sqrt(2 / np.pi), 0.0, (lo + hi) / 2)


def reselect(rng: np.random.Generator, z: np.ndarray, x: np.ndarray, other: np.ndarray, cell: np.ndarray,
             losers: Losers | None, sd: np.ndarray, point_sd: float | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                                              np.ndarray]:
    """The draws ``z`` (B, n: log-loss deviations of the winners' points from the fitted curve) with
    each cell's selection redone: the losers' means are drawn around their gaps (noise sd ``sd``
    (B, 1) over their runs) and the cell takes the lowest of them and its winner's drawn mean.
    Returns the selected draws centred on the estimated selection bias (so the bias is not counted
    twice), that bias per point (<= 0: subtract it from the observed log losses), and per point the
    share of draws in which the observed winner stayed the cell's best. ``point_sd``: the noise's
    point estimate, with which the losers' gaps are corrected for the selection (``true_gap``)."""
    out = np.array(z, float)
    shift = np.zeros_like(out)
    kept = np.ones(z.shape[1])
    if losers is None or len(losers.gap) == 0:
        return out, np.zeros(z.shape[1]), kept
    for c in np.unique(cell):
        idx = cell == c
        mine = (losers.x == x[idx][0]) & (losers.other == other[idx][0])
        if not mine.any():
            continue
        winner = out[:, idx].mean(axis=1)
        gap = losers.gap[mine]
        if point_sd is not None:  # draws around the gaps the observed ones estimate, not the inflated ones
            gap = true_gap(gap, point_sd * np.sqrt(1 / idx.sum() + 1 / losers.runs[mine]))
        drawn = gap[None, :] + sd * rng.standard_normal((len(out), int(mine.sum()))) / np.sqrt(
            losers.runs[mine])[None, :]
        delta = np.minimum(0.0, drawn.min(axis=1) - winner)
        shift[:, idx] = delta[:, None]
        kept[idx] = float(np.mean(delta == 0.0))
    bias = shift.mean(axis=0)
    return out + shift - bias[None, :], bias, kept
