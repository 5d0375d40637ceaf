"""A small, seeded version of the synthetic study in analysis/benchmarks/bench_suggest.py, for the
acceptance test of ``choose_within``: does following suggest's budget choice make the ratio's CI
narrower per GPU-hour than adding runs uniformly? (Tests do not import analysis/; the full study
with its many studies and rounds stays a benchmark there.)

Truth: Transformer L = 2.30 + 406.4·N^-0.34, DIFF at 62% of its size, noise sd 0.005 of log
loss per run; 5 sizes (0.83-13.1B), 20 tokens per parameter, a run priced at 6·N·20N FLOPs on an
H100 at 40% MFU. One round per study: suggest's arm buys what ``choose_within`` picks within the
budget; the uniform arm buys runs round-robin over (size, architecture), smallest first, for what
suggest spent. A design's precision is the robust sd of log ρ̂ at ``ref`` over ``replicates``
datasets drawn from the truth, refitted as a bootstrap draw is; the j-th run of a cell has the
same loss and the same noise in both arms (common random numbers), so the arms differ by what
they buy, not by luck.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from diffsweep.scaling.analysis import FitRequest
from diffsweep.scaling.fitting.fit import LawFit
from diffsweep.scaling.suggest import candidates
from diffsweep.scaling.suggest import preposterior as sg
from diffsweep.scaling.table import _complete
from tests.scaling.synthetic import SIZES, TRUE_RATIO, baseline_loss

ARCHS = {"transformer": 1.0, "diff_v1": TRUE_RATIO}
NOISE_SD, TOKENS_PER_PARAM = 0.005, 20.0
RATE = 989e12 * 0.40 * 3600  # FLOPs per GPU-hour, as the CLI's default


def true_loss(arch: str, n: float) -> float:
    return float(baseline_loss(n / ARCHS[arch]))


def cost(n: float) -> float:
    """GPU-hours of a run of ``n`` parameters on 20 tokens per parameter: 58 at 830M, 14,460 at 13.1B."""
    return 6.0 * n * TOKENS_PER_PARAM * n / RATE


def _row(arch: str, n: float, rng: np.random.Generator, k: int) -> dict:
    return {"arch": arch, "num_params": n, "tokens": TOKENS_PER_PARAM * n, "seed": k,
            "run_name": f"{arch}-{n:.3g}-{k}", "loss": true_loss(arch, n) * np.exp(NOISE_SD * rng.standard_normal())}


@dataclass(frozen=True)
class Shape:
    """A starting ladder and where the ratio is read: ``seeds`` per (size, DIFF), ``baseline_seeds``
    per size of the Transformer; ``budget`` GPU-hours and at most ``max_runs`` runs for suggest."""

    seeds: int
    baseline_seeds: int
    ref: float
    budget: float
    max_runs: int
    boot: int = 50  # bootstrap draws (the fewest FitRequest allows) of the fit suggest starts from
    draws: int = 12  # simulated outcomes per candidate


@dataclass(frozen=True)
class Study:
    """One study's outcome: GPU-hours spent and the design's precision (sd of log ρ̂) per arm."""

    start: float
    suggest: float
    uniform: float
    spent_suggest: float
    spent_uniform: float
    picked: tuple[tuple[str, float], ...]


def _frame(rows: list[dict]) -> pd.DataFrame:
    return _complete(pd.DataFrame(rows))


def _add(rows: list[dict], picked: list[tuple[str, float]], rep: int) -> list[dict]:
    """``rows`` plus the runs ``picked``; the j-th new run of a cell has the same loss in either arm."""
    out = list(rows)
    for a, n in picked:
        j = sum(1 for r in out if r["arch"] == a and np.isclose(r["num_params"], n))
        out.append(_row(a, n, np.random.default_rng([rep, list(ARCHS).index(a), round(n / 1e6), j]), len(out)))
    return out


def spread(rows: list[dict], rep: int, ref: float, replicates: int = 2000) -> float:
    """The robust sd (IQR / 1.349) of log ρ̂ at ``ref`` over ``replicates`` datasets from the truth on
    the design of ``rows`` (its runs, not their losses); +inf when over a quarter have no ρ."""
    design, _ = sg.design_from_points(_frame(rows), FitRequest(n_boot=50, seed=rep), ref=ref, num_draws=2)
    theta = {}
    for name, fit in design.fits.items():
        d = fit.data
        n = np.exp(d.u)
        truth = np.log([true_loss(name, x) for x in n])
        seen: dict[int, int] = {}
        noise = []
        for x in n:
            cell = round(x / 1e6)
            j = seen[cell] = seen.get(cell, -1) + 1
            noise.append(np.random.default_rng([rep, 7, list(ARCHS).index(name), cell, j]).standard_normal(replicates))
        targets = truth[None, :] + NOISE_SD * np.array(noise).T
        theta[name] = LawFit(fit.law, replace(d, y=truth), fit.objective, fit.solution).refit(targets)
    log_rho = design.log_ratio(theta[design.baseline], theta[design.candidate])
    if np.mean(~np.isfinite(log_rho)) >= 0.25:
        return np.inf
    q25, q75 = np.nanpercentile(np.where(np.isfinite(log_rho), log_rho, np.nan), [25, 75])
    return float((q75 - q25) / 1.349)


def uniform_runs(budget: float) -> list[tuple[str, float]]:
    """Round-robin over (size, architecture), smallest first; a run that does not fit what is left
    is passed over; ends after a whole cycle that bought nothing."""
    order = [(a, float(n)) for n in SIZES for a in ARCHS]
    picked: list[tuple[str, float]] = []
    spent, idle, i = 0.0, 0, 0
    while idle < len(order):
        a, n = order[i % len(order)]
        i += 1
        if spent + cost(n) <= budget * (1 + 1e-9):
            picked.append((a, n))
            spent += cost(n)
            idle = 0
        else:
            idle += 1
    return picked


def study(shape: Shape, rep: int) -> Study:
    """One synthetic study (seeded by ``rep``): the same start for both arms, one round each."""
    rng = np.random.default_rng(10_000 + rep)
    per_arch = {"transformer": shape.baseline_seeds, "diff_v1": shape.seeds}
    first = [_row(a, float(n), rng, k) for a in ARCHS for k in range(per_arch[a]) for n in SIZES]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design, result = sg.design_from_points(_frame(first), FitRequest(n_boot=shape.boot, seed=rep),
                                               ref=shape.ref, num_draws=shape.draws)
        assert result.points is not None
        pool = candidates.extra_candidates(result.points, design, "num_params", RATE)
        choice = sg.choose_within(design, pool, shape.budget, seed=rep, max_runs=shape.max_runs)
        picked = [(s.candidate.arch, s.candidate.num_params) for s in choice.steps]
        rival = uniform_runs(choice.spent)
        return Study(start=spread(first, rep, shape.ref),
                     suggest=spread(_add(first, picked, rep), rep, shape.ref),
                     uniform=spread(_add(first, rival, rep), rep, shape.ref),
                     spent_suggest=choice.spent, spent_uniform=sum(cost(n) for _, n in rival),
                     picked=tuple(picked))


def summary(studies: list[Study]) -> dict:
    """Over the studies: the mean gap log(uniform sd / suggest sd) (> 0: suggest narrower) and its se,
    how often suggest is at least as narrow, the spend ratio, and each arm's mean narrowing of log sd
    per 1,000 GPU-h from the common start."""
    a = np.array([s.suggest for s in studies])
    b = np.array([s.uniform for s in studies])
    start = np.array([s.start for s in studies])
    spent_a = np.array([s.spent_suggest for s in studies])
    spent_b = np.array([s.spent_uniform for s in studies])
    with np.errstate(all="ignore"):
        gap = np.log(b) - np.log(a)
        per_a = 1000 * (np.log(start) - np.log(a)) / spent_a
        per_b = 1000 * (np.log(start) - np.log(b)) / spent_b
    return {"studies": len(studies), "finite": int(np.isfinite(gap).sum()),
            "log_gap": float(np.mean(gap)), "log_gap_se": float(np.std(gap, ddof=1) / np.sqrt(len(gap))),
            "suggest_as_narrow": float(np.mean(a <= b)),
            "spent_ratio": float(spent_a.sum() / spent_b.sum()) if spent_b.sum() > 0 else float("nan"),
            "suggest_per_1000": float(np.mean(per_a)), "uniform_per_1000": float(np.mean(per_b))}
