"""Differences between a tuned sweep's cells, each at its best candidate, judged against seed noise
with the choice of the best inside the interval.

In a tuned sweep (``tune:``, diffsweep.sweep.tune) a *cell* is one combination of the study's axes
(kind x size x switches) and each tuning value in it, with its seeds, a *candidate*. ``compare``
reads each cell at its candidate of lowest mean final metric (its *winner*) and each cell's winner
against the baseline cell's winner. The lowest of several noisy means reads low (the winner's
curse) by an amount that depends on what cannot be seen: how close the candidates truly are. If
the winner's rivals are far behind, its error is its own seed noise; if they are truly tied with
it, its error is the lowest of their noises. ``compare_cells`` draws each cell's error from both
worlds, half the draws each: the winner alone, and a tie among the candidates the data cannot tell
from the winner (an observed gap within 1.5 sd of a difference of two means), with the noise level
drawn from the pooled seed sd's chi-square. The interval is the observed difference less the
quantiles of the drawn errors' difference. Monte Carlo coverage of the true best-vs-best
difference at 95% (analysis/benchmarks/coverage_tuned_compare.py; RESULTS.md): 93-99% with 2 or
3 seeds, the optimum inside the grid, at its edge, on flat grids and far apart; reading the
winners' means as if they had not been chosen (a t interval) covers 87-90% where a flat grid of
eight learning rates is compared with one untuned run (the winner reads ~1.4 sd of its mean low).

See docs/sweeps.md, 'Tuned sweeps: each arm at its own best setting'.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from diffsweep.compare.runs import BEYOND, UNKNOWN, WITHIN, unit
from diffsweep.config import ConfigError, ConfigWarning
from diffsweep.config.decode import confidence_level

if TYPE_CHECKING:
    from diffsweep.sweep.expand import SweepRun
    from diffsweep.sweep.spec import SweepSpec
    from diffsweep.sweep.tune import Cell as TuneCell
    from diffsweep.tracking.results import Run

DRAWS = 4000
SPIKES = "train/loss_spikes"  # the trainer's count of loss spikes so far, logged every step
GRAD_SPIKES = "train/grad_norm_spikes"  # and of gradient-norm spikes
PLAUSIBLE = 1.5  # a candidate is told apart from the winner beyond this many sd of their difference


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One candidate of a cell: its label (``lr=0.002``), seeds and mean."""

    label: str
    n: int
    mean: float


@dataclass(frozen=True, kw_only=True)
class CellBest:
    """One cell at its best candidate, against the baseline cell's best."""

    cell: str
    candidates: tuple[Candidate, ...]
    winner: str  # the candidate of lowest mean
    n: int  # the winner's seeds
    mean: float  # the winner's mean
    rivals: int  # other candidates within the noise of the winner (a tie with them is plausible)
    bias: float | None  # the drawn errors' mean: how low the winner's mean reads on average (<= 0)
    kept: float | None  # share of draws around the observed means in which the winner stays best
    delta: float  # mean - the baseline cell's winner's mean
    lo: float | None  # CI of the true best-vs-best difference; None when the seed noise is unknown
    hi: float | None
    verdict: str
    sentence: str


@dataclass(frozen=True, kw_only=True)
class CellComparison:
    """Every cell at its best against ``baseline``'s best, with the pooled seed sd they rest on."""

    baseline: str
    level: float
    pooled_sd: float | None  # over every candidate with >= 2 seeds; None: none has two
    df: int
    draws: int
    cells: tuple[CellBest, ...]


def compare_cells(values: Mapping[str, Mapping[str, Sequence[float]]], baseline: str, level: float = 0.95,
                  draws: int = DRAWS, seed: int = 0, unit: str = "nats") -> CellComparison:
    """``values``: cell -> candidate -> one value per seed (lower is better). Each cell at its
    candidate of lowest mean, and its best against ``baseline``'s best with a ``level`` CI that
    includes the selection (module docstring). Without any candidate of two seeds the noise is
    unknown: winners and differences are given, with no CI. Raises
    ``ConfigError`` for an unknown baseline, an empty candidate or a non-finite value."""
    if baseline not in values:
        raise ConfigError("baseline", f"expected one of the cells [{', '.join(values)}], got {baseline!r}")
    confidence_level(level)
    for cell, candidates in values.items():
        if not candidates:
            raise ConfigError(f"cell {cell}", "expected at least one candidate")
        for label, vals in candidates.items():
            if len(vals) == 0 or not all(math.isfinite(float(v)) for v in vals):
                raise ConfigError(f"cell {cell}, {label}", f"expected one finite value per seed, got {list(vals)!r}")
    arrays = {c: {k: np.asarray(v, float) for k, v in cands.items()} for c, cands in values.items()}
    df = sum(len(v) - 1 for cands in arrays.values() for v in cands.values())
    ss = sum(float(((v - v.mean()) ** 2).sum()) for cands in arrays.values() for v in cands.values())
    pooled = math.sqrt(ss / df) if df > 0 else None
    rng = np.random.default_rng(seed)
    scale = None if pooled is None else pooled * np.sqrt(df / rng.chisquare(df, (draws, 1)))
    read: dict[str, tuple[list[Candidate], int, int, np.ndarray | None, float | None]] = {}
    for cell, cands in arrays.items():
        listed = [Candidate(label=k, n=len(v), mean=float(v.mean())) for k, v in cands.items()]
        means, ns = np.array([c.mean for c in listed]), np.array([c.n for c in listed], float)
        w = int(np.argmin(means))
        if scale is None or pooled is None:
            read[cell] = (listed, w, 0, None, None)
            continue
        close = means - means[w] <= PLAUSIBLE * pooled * np.sqrt(1 / ns + 1 / ns[w])
        noise = scale * rng.standard_normal((draws, len(listed))) / np.sqrt(ns)
        alone, tie = noise[:, w], noise[:, close].min(axis=1)
        err = np.where(rng.random(draws) < 0.5, alone, tie)
        kept = float(np.mean((means + noise).argmin(axis=1) == w))
        read[cell] = (listed, w, int(close.sum()) - 1, err, kept)
    base_listed, base_w, _, base_err, _ = read[baseline]
    base = base_listed[base_w]
    lo_q, hi_q = 0.5 - level / 2, 0.5 + level / 2
    out = []
    for cell, (listed, w, rivals, err, cell_kept) in read.items():
        win = listed[w]
        bias = None if err is None else float(err.mean())
        delta = win.mean - base.mean
        lo = hi = None
        if cell == baseline:
            verdict, sentence = WITHIN, f"{cell}: the baseline, at {_at(win, rivals, unit)}."
        elif err is None or base_err is None:
            verdict = UNKNOWN
            sentence = (f"{cell} - {baseline}: {delta:+.4f} {unit} at each cell's best ({win.label} vs {base.label}); "
                        f"{UNKNOWN}: no candidate has two seeds, so neither the difference nor the choice of the best "
                        "can be told apart from seed-to-seed variation (give the sweep `seeds: 2`).")
        else:
            spread = err - base_err  # the error of the winners' difference in each draw
            lo, hi = delta - float(np.quantile(spread, hi_q)), delta - float(np.quantile(spread, lo_q))
            verdict = WITHIN if lo <= 0 <= hi else BEYOND
            why = ("the CI contains 0, so the sign of the difference is not established" if verdict == WITHIN
                   else f"the CI excludes 0: {cell} at its best is {'higher' if delta > 0 else 'lower'}")
            sentence = (f"{cell} - {baseline}, each at its best: {delta:+.4f} {unit} ({level:.0%} CI {lo:+.4f} to "
                        f"{hi:+.4f}, the choice of each best included; {_at(win, rivals, unit)} vs "
                        f"{_at(base, read[baseline][2], unit)}): {verdict}; {why}.")
        out.append(CellBest(cell=cell, candidates=tuple(listed), winner=win.label, n=win.n, mean=win.mean,
                            rivals=rivals, bias=bias, kept=cell_kept, delta=delta, lo=lo, hi=hi, verdict=verdict,
                            sentence=sentence))
    return CellComparison(baseline=baseline, level=level, pooled_sd=pooled, df=df, draws=draws, cells=tuple(out))


def _at(win: Candidate, rivals: int, unit: str) -> str:
    seeds = f"{win.n} seed{'s' if win.n != 1 else ''}"
    tie = f"; {rivals} other candidate{'s' if rivals != 1 else ''} within its noise" if rivals else ""
    return f"{win.label} (mean {win.mean:.4f}, {seeds}{tie})"


# -- a launched tuned sweep's cells, read from the MLflow store ----------------------------------------

@dataclass(frozen=True, kw_only=True)
class TunedSweepComparison:
    """``compare_cells`` on a launched tuned sweep's finished runs."""

    sweep: str
    experiment: str
    metric: str
    tune: tuple[str, ...]  # the tuning keys
    comparison: CellComparison
    runs: dict[str, dict[str, list[str]]]  # cell -> candidate -> the names of its runs read
    planned: dict[str, dict[str, int]]  # cell -> candidate -> its runs in the sweep
    edges: dict[str, list[str]]  # cell -> where its winner sits at an end of its grid
    # cell -> candidate -> {"value": its tuning value (one tuning key) or None, "diverged": runs that
    # stopped on a non-finite loss, "spikes" / "grad_spikes": the loss / gradient-norm spikes its
    # finished runs logged (None: not logged)}
    stability: dict[str, dict[str, dict]]
    kinds: dict[str, str]  # cell -> its attention kind
    panels: dict[str, str]  # cell -> what it shares with the other kinds' cells beside it (size, switches)
    missing: tuple[str, ...]  # cells with no finished run

    @property
    def unit(self) -> str:
        return unit(self.metric)

    @property
    def noise(self) -> str:
        c = self.comparison
        if c.pooled_sd is None:
            return (f"{UNKNOWN}: one seed per candidate, so no difference or choice can be told apart from "
                    "seed-to-seed variation (give the sweep `seeds: 2`)")
        return (f"seed noise: pooled seed sd {c.pooled_sd:.4g} on {c.df} df (every candidate with >= 2 seeds); "
                f"{c.level:.0%} CIs from {c.draws} draws of each cell's selection error: half the winner's own "
                "noise, half a tie with the candidates within its noise")

    def _candidates(self, best: CellBest) -> list[dict]:
        """Every planned candidate of a cell, with its mean (None: no finished run) and stability."""
        read = {c.label: c for c in best.candidates}
        return [{"candidate": k, "n": read[k].n if k in read else 0, "planned": planned,
                 "mean": read[k].mean if k in read else None, "runs": self.runs.get(best.cell, {}).get(k, []),
                 **self.stability[best.cell][k]} for k, planned in self.planned[best.cell].items()]

    def to_dict(self) -> dict:
        c = self.comparison
        return {"sweep": self.sweep, "experiment": self.experiment, "metric": self.metric, "tune": list(self.tune),
                "baseline": c.baseline, "level": c.level, "pooled_sd": c.pooled_sd, "df": c.df, "draws": c.draws,
                "noise": self.noise,
                "cells": [{"cell": b.cell, "kind": self.kinds[b.cell], "panel": self.panels[b.cell],
                           "winner": b.winner, "n": b.n, "mean": b.mean, "rivals": b.rivals, "bias": b.bias,
                           "kept": b.kept, "delta": b.delta, "lo": b.lo, "hi": b.hi,
                           "verdict": b.verdict, "sentence": b.sentence, "edge": self.edges[b.cell],
                           "sensitivity": sensitivity(b, self.stability[b.cell], c.pooled_sd, self.unit),
                           "candidates": self._candidates(b)} for b in c.cells],
                "missing": list(self.missing)}


def compare_tuned_sweep(uri: str, spec: SweepSpec, runs: Sequence[SweepRun], metric: str = "val/loss",
                        baseline: str | None = None, level: float = 0.95) -> TunedSweepComparison:
    """A tuned sweep's cells (``sweep.tune.cells``) each at its best candidate, from the final
    ``metric`` of their finished runs (``compare.runs.finished_runs``), against ``baseline``
    (default: the first cell with a finished run) with ``compare_cells``. A candidate without a
    finished run is left out of its cell; a cell without any is listed as missing."""
    from diffsweep.compare.runs import diverged, ended_runs, final_value, finished_runs
    from diffsweep.sweep.tune import cells as tuned_cells
    from diffsweep.sweep.tune import edges

    found = _named(tuned_cells(runs, list(spec.tune)))
    if baseline is not None and baseline not in found:
        raise ConfigError("baseline", f"expected a cell of {spec.name}: one of [{', '.join(found)}], got {baseline!r}")
    ended = ended_runs(uri, spec, runs)
    latest = finished_runs(uri, spec, runs, metric, ended)
    values: dict[str, dict[str, list[float]]] = {}
    names: dict[str, dict[str, list[str]]] = {}
    planned: dict[str, dict[str, int]] = {}
    stability: dict[str, dict[str, dict]] = {}
    missing = []
    for name, cell in found.items():
        for cand in cell.candidates:
            planned.setdefault(name, {})[cand.label] = len(cand.runs)
            read = [latest[r.key] for r in cand.runs if r.key in latest]
            stability.setdefault(name, {})[cand.label] = {
                "value": cand.values[0][1] if len(cand.values) == 1 else None,
                "diverged": sum(r.key in ended and diverged(ended[r.key]) for r in cand.runs),
                "spikes": _count(read, SPIKES), "grad_spikes": _count(read, GRAD_SPIKES)}
            for run in cand.runs:
                finished = latest.get(run.key)
                value = None if finished is None else final_value(finished, metric, run.name)
                if value is not None:
                    values.setdefault(name, {}).setdefault(cand.label, []).append(value)
                    names.setdefault(name, {}).setdefault(cand.label, []).append(run.name)
        if name not in values:
            missing.append(name)
    if baseline is None:
        baseline = next(iter(values))
    elif baseline in missing:
        raise ConfigError("baseline", f"cell {baseline} has no finished run with {metric}; cells that have: "
                          f"[{', '.join(values)}]")
    comparison = compare_cells(values, baseline, level, unit=unit(metric))
    at_edge = {}
    for best in comparison.cells:
        cell = found[best.cell]
        at_edge[best.cell] = edges(cell, next(c for c in cell.candidates if c.label == best.winner))
        if len(best.candidates) == 1:
            warnings.warn(ConfigWarning(f"{best.cell}: one candidate with a finished run ({best.winner}): untuned, "
                                        "read as it is"))
        elif at_edge[best.cell]:
            warnings.warn(ConfigWarning(f"{best.cell}: the best candidate is at the edge of its grid "
                                        f"({'; '.join(at_edge[best.cell])}): the optimum may lie outside the grid: "
                                        "extend it"))
    return TunedSweepComparison(sweep=spec.name, experiment=spec.experiment, metric=metric, tune=tuple(spec.tune),
                                comparison=comparison, runs=names, planned=planned, edges=at_edge,
                                stability=stability, kinds={n: c.kind for n, c in found.items()},
                                panels={n: c.name.removeprefix(f"{c.kind}-") for n, c in found.items()},
                                missing=tuple(missing))


def sensitivity(best: CellBest, stability: Mapping[str, Mapping], pooled: float | None, unit: str = "nats") -> str:
    """One cell's reading of its tuning value, in one line: how much the metric rises from the
    best value to the next one tried either side (a single numeric tuning key), the candidates
    whose runs diverged or spiked (the trainer's ``train/loss_spikes``), and the seed noise."""
    means = {c.label: c.mean for c in best.candidates}
    numeric = {k: s["value"] for k, s in stability.items()
               if isinstance(s["value"], (int, float)) and not isinstance(s["value"], bool) and s["value"] > 0}
    if len(numeric) < len(stability) or best.winner not in numeric:
        reading = f"{best.cell}: best {best.winner}"  # several tuning keys, or values that are not numbers
    else:
        at, parts = numeric[best.winner], []
        for pick in (lambda v: v > at, lambda v: v < at):  # the next value tried above, then below
            near = sorted((k for k, v in numeric.items() if pick(v)), key=lambda k: abs(numeric[k] / at - 1))
            if near:
                rise = f"{means[near[0]] - best.mean:+.4f} {unit}" if near[0] in means else "no finished run"
                parts.append(f"at {numeric[near[0]] / at:.3g}x ({near[0]}) {rise}")
        reading = f"{best.cell}: from its best {best.winner}, " + ("; ".join(parts) or "no other value tried")
    troubles = []
    for k, s in stability.items():
        if s["diverged"]:
            troubles.append(f"{s['diverged']} run(s) diverged at {k}")
        if s["spikes"]:
            troubles.append(f"{s['spikes']} loss spike(s) at {k}")
        if s.get("grad_spikes"):
            troubles.append(f"{s['grad_spikes']} gradient-norm spike(s) at {k}")
    if troubles:
        reading += "; " + ", ".join(troubles)
    elif all(s["spikes"] is not None for s in stability.values()):
        reading += "; no loss spike or divergence"
    if pooled is not None:
        reading += f" (seed sd {pooled:.4f})"
    return reading + "."


def _count(runs: Sequence[Run], metric: str) -> int | None:
    """The runs' final counts of ``metric`` added up; None when any of them did not log it."""
    counts = [run.data.metrics.get(metric) for run in runs]
    return None if not counts or any(c is None for c in counts) else int(sum(c or 0.0 for c in counts))


def _named(cells: Sequence[TuneCell]) -> dict[str, TuneCell]:
    """The cells by name; two that spell the same (distinct values rendered alike) are numbered."""
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell.name] = counts.get(cell.name, 0) + 1
    out: dict[str, TuneCell] = {}
    for i, cell in enumerate(cells):
        out[cell.name if counts[cell.name] == 1 else f"{cell.name}-{i}"] = cell
    return out
