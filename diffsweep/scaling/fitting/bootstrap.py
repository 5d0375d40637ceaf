"""Noise model and parametric (hierarchical) bootstrap draws for scaling fits.

Row resampling is useless on a five-size ladder (a resample has ≤ 3 distinct sizes 58% of the time;
docs/references.md §4), so the bootstrap is parametric: each draw adds noise to the fitted curve and
refits. The run is the unit of noise: every draw gives each run a random offset shared by all of its
evaluations, plus independent noise per evaluation (on a size ladder, one per-point noise). The noise
comes, in order of preference, from ``given`` sds (``--noise-sd``, ``--run-sd``), from ``seeds``
(seed replicates: ``_one_point_per_run``, ``_multi_point``) or from the fit's ``residuals``; each
draw redraws every estimated sd for its own uncertainty (``scale_draws``).

See docs/fits.md, 'Uncertainty: bootstrap, noise, resampling'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.stats import f as f_dist
from scipy.stats import norm
from scipy.stats import t as t_dist

LACK_OF_FIT_P = 0.05  # size-level scatter is modelled when the lack-of-fit F-test rejects at 5%


@dataclass(frozen=True)
class Noise:
    """Per-evaluation sd of log loss (``sd``, with ``dof``), the size-level sd (``between_sd``) and
    the sd of a per-run offset shared by all evaluations of one run (``run_sd``)."""

    source: str  # given | seeds | residuals
    sd: float
    dof: float  # inf when given
    between_sd: float = 0.0
    between_dof: float = 0.0
    warning: str | None = None
    run_sd: float = 0.0
    run_dof: float = 0.0  # inf when given
    runs_per_arch: float = 1.0  # median runs per architecture
    multi_point_runs: bool = False  # some run gives several points (a token scan's evaluations)
    description: str = ""

    @property
    def ci_scope(self) -> str:
        """``curve_fit_only`` when runs give several points and the run offset is unknown."""
        return "curve_fit_only" if self.multi_point_runs and self.run_dof == 0 else "full"

    @property
    def hierarchical(self) -> bool:
        return self.multi_point_runs and self.run_dof > 0

    def resampling(self) -> dict:
        if self.hierarchical:
            return {"method": "hierarchical", "unit": "run", "why": (
                "each run gives several evaluations, which share the run's offset (seed, data order): every draw "
                "gives each run one random offset plus independent noise per evaluation, then refits")}
        if self.ci_scope == "curve_fit_only":
            return {"method": "parametric", "unit": "point", "why": (
                "one run per architecture: the run offset cannot be told from the curve, so draws add "
                "per-evaluation noise only (curve-fit uncertainty)")}
        return {"method": "parametric", "unit": "point", "why": (
            "one point per run on a small design (a case resample of a few sizes would drop sizes): every draw "
            "adds the measured noise to the fitted curve and refits")}

    def to_dict(self) -> dict:
        return {"source": self.source, "sd": self.sd, "dof": _dof(self.dof),
                "between_sd": self.between_sd, "between_dof": self.between_dof, "warning": self.warning,
                "run_sd": self.run_sd, "run_dof": _dof(self.run_dof), "description": self.description,
                "ci_scope": self.ci_scope}


def _dof(v: float) -> float | None:
    return None if np.isinf(v) else float(v)


@dataclass(frozen=True)
class Group:
    """One architecture's points for the noise estimate: log losses, fitted values, size cells, runs."""

    y: np.ndarray
    fitted: np.ndarray
    cell: np.ndarray  # index of the point's size (same x) within the group
    num_params: int
    robust: bool = False  # Huber fits: a MAD-based scale instead of the RMS
    run: np.ndarray | None = None  # index of the point's run within the group (None: one run per point)

    @property
    def runs(self) -> np.ndarray:
        return np.arange(len(self.y)) if self.run is None else np.unique(self.run, return_inverse=True)[1].ravel()


def estimate_noise(groups: list[Group], given: float | None = None, run_sd: float | None = None) -> Noise:
    """Pool the noise over architectures (same data, same code: same noise level)."""
    multi = any(np.bincount(g.runs).max() > 1 for g in groups)
    runs = float(np.median([len(np.unique(g.runs)) for g in groups]))
    if not multi:
        noise = _one_point_per_run(groups, given, run_sd)
        return _describe(_with(noise, runs_per_arch=runs))
    return _describe(_multi_point(groups, given, run_sd, runs))


def _with(noise: Noise, **kw) -> Noise:
    return replace(noise, **kw)


def _one_point_per_run(groups: list[Group], given: float | None, run_sd: float | None) -> Noise:
    """Every run gives one point: the run offset and the evaluation noise are one per-point noise."""
    if given is not None or run_sd is not None:
        return Noise("given", float(np.hypot(given or 0.0, run_sd or 0.0)), np.inf)
    within_ss, within_dof, cell_means, means_dof = 0.0, 0, [], 0
    for g in groups:
        for c in np.unique(g.cell):
            y = g.y[g.cell == c]
            if len(y) > 1:
                within_ss += float(((y - y.mean()) ** 2).sum())
                within_dof += len(y) - 1
            cell_means.append((float(y.mean() - g.fitted[g.cell == c][0]), len(y)))
        means_dof += len(np.unique(g.cell)) - g.num_params
    if within_dof > 0:
        sd = float(np.sqrt(within_ss / within_dof))
        between_sd, between_dof = 0.0, 0.0
        if means_dof > 0 and sd > 0:
            r = np.array([m for m, _ in cell_means])
            counts = np.array([k for _, k in cell_means], float)
            # Lack-of-fit F-test: do the size means scatter around the curve more than seed noise
            # explains? Only then is a size-level component estimated (else it would add width
            # from pure noise: 97.5% coverage and twice the width at the largest size, measured).
            f_stat = float((counts * r ** 2).sum() / means_dof / sd ** 2)
            if f_dist.sf(f_stat, means_dof, within_dof) < LACK_OF_FIT_P:
                between_var = float((r ** 2).sum() / means_dof - sd ** 2 * np.mean(1.0 / counts))
                between_sd, between_dof = float(np.sqrt(max(between_var, 0.0))), float(means_dof)
        return Noise("seeds", sd, float(within_dof), between_sd, between_dof)
    sd, n, dof = _residual_sd(groups)
    return Noise("residuals", sd, float(dof), warning=(
        f"no seed replicates: the noise (sd {sd:.2g} of log loss) is estimated from the residuals of {n} points "
        f"with {dof} degrees of freedom, so the intervals are about {_t_factor(dof, 0.95):.2f}x as wide as a known "
        "noise would give (the price of estimating it; calibrated on synthetic ladders, not too narrow) and assume "
        "the law fits; run seeds for a direct noise estimate and narrower intervals"))


def _residual_sd(groups: list[Group]) -> tuple[float, int, int]:
    n = sum(len(g.y) for g in groups)
    dof = n - sum(g.num_params for g in groups)
    if dof <= 0:
        raise ValueError("no noise estimate: as many parameters as points and no seed replicates")
    residuals = np.concatenate([g.y - g.fitted for g in groups])
    if any(g.robust for g in groups):
        sd = float(1.4826 * np.median(np.abs(residuals)) * np.sqrt(n / dof))
    else:
        sd = float(np.sqrt((residuals ** 2).sum() / dof))
    return max(sd, 1e-12), n, dof


def _multi_point(groups: list[Group], given: float | None, run_sd: float | None, runs: float) -> Noise:
    """Runs with several points: a per-run offset and per-evaluation noise, separated by a two-way
    (cell × run) decomposition when some architecture has ≥ 2 runs (a token scan with ≥ 2 runs per
    architecture; Henderson's method III: unbiased for unbalanced designs too)."""
    ss_e = dof_e = ss_r = dof_r = trace = 0.0
    for g in groups:
        n = len(g.y)
        x = np.eye(len(np.unique(g.cell)))[g.cell]
        z = np.eye(len(np.unique(g.runs)))[g.runs]
        xz = np.hstack([x, z])
        res_x, res_xz = _residual_maker(x), _residual_maker(xz)
        rank_x, rank_xz = np.linalg.matrix_rank(x), np.linalg.matrix_rank(xz)
        ss_e += float(g.y @ res_xz @ g.y)
        dof_e += n - rank_xz
        ss_r += float(g.y @ (res_x - res_xz) @ g.y)
        dof_r += rank_xz - rank_x
        trace += float(np.trace(z.T @ res_x @ z))
    source = "seeds" if dof_r > 0 else "residuals"
    if given is not None:
        sd, e_dof, source = float(given), np.inf, "given"
    elif dof_e > 0:
        sd, e_dof = float(np.sqrt(ss_e / dof_e)), dof_e
    else:
        sd, _, e_dof = _residual_sd(groups)
    if run_sd is not None:
        return Noise(source, sd, e_dof, run_sd=float(run_sd), run_dof=np.inf, runs_per_arch=runs,
                     multi_point_runs=True)
    if dof_r > 0:
        var_run = (ss_r - dof_r * sd ** 2) / trace
        # a run-level sd estimated at 0 (its sum of squares below what evaluation noise explains)
        # would leave the offsets out of every draw; it is kept at the smallest value consistent
        # with the data instead: what one sd of the sum of squares would allow (never 0).
        floor = np.sqrt(2.0 / dof_r) * dof_r * sd ** 2 / trace
        return Noise(source, sd, e_dof, run_sd=float(np.sqrt(max(var_run, floor))), run_dof=float(dof_r),
                     runs_per_arch=runs, multi_point_runs=True)
    return Noise(source, sd, e_dof, runs_per_arch=runs, multi_point_runs=True, warning=(
        "one run per architecture on a scan of its evaluations: the evaluations share the run's offset (seed, data "
        "order), which one run cannot measure, so the CI is curve-fit only and excludes run-to-run variance; run "
        "≥ 2 seeds per architecture or give the run-level sd with --run-sd"))


def _residual_maker(x: np.ndarray) -> np.ndarray:
    return np.eye(len(x)) - x @ np.linalg.pinv(x)


def _describe(noise: Noise) -> Noise:
    runs = f"{noise.runs_per_arch:g} run{'s' if noise.runs_per_arch != 1 else ''} per architecture"
    if noise.multi_point_runs:
        if noise.hierarchical:
            how = "given (--run-sd)" if np.isinf(noise.run_dof) else f"estimated from {runs}"
            text = (f"a per-run offset (sd {noise.run_sd:.2g} of log loss, {how}) shared by all evaluations of a "
                    f"run, plus independent noise per evaluation (sd {noise.sd:.2g}, {_source_words(noise)})")
        else:
            text = (f"noise per evaluation only (sd {noise.sd:.2g}, {_source_words(noise)}): with {runs} the offset "
                    "shared by a run's evaluations is not measured, so the CI is curve-fit only and excludes "
                    "run-to-run variance")
    elif noise.source == "given":
        text = f"a given run-to-run sd of {noise.sd:.2g} of log loss, independent per run"
    elif noise.source == "seeds":
        text = f"run-to-run noise (sd {noise.sd:.2g} of log loss) from seed replicates ({noise.dof:g} degrees of freedom)"
        if noise.between_sd > 0:
            text += f", plus a size-level scatter around the law (sd {noise.between_sd:.2g})"
    else:
        text = (f"noise (sd {noise.sd:.2g} of log loss) estimated from the residuals around the fitted laws "
                f"({noise.dof:g} degrees of freedom; no seed replicates), so it also holds any misfit of the law")
    return _with(noise, description=text)


def _source_words(noise: Noise) -> str:
    return {"given": "given (--noise-sd)", "seeds": "from the spread between runs at the same point",
            "residuals": "from the residuals around the fitted law"}[noise.source]


def _t_factor(dof: float, level: float) -> float:
    """t_ν / z at the two-sided ``level``: how much wider a CI is when the sd is estimated with ν
    degrees of freedom than when it is known."""
    if not np.isfinite(dof) or dof <= 0:
        return 1.0
    q = (1.0 + level) / 2.0
    return float(t_dist.ppf(q, dof) / norm.ppf(q))


@dataclass(frozen=True)
class Scales:
    """The sds of each draw (B, 1): per evaluation, per size cell, per run."""

    sd: np.ndarray
    between: np.ndarray
    run: np.ndarray


def scale_draws(rng: np.random.Generator, noise: Noise, n_boot: int) -> Scales:
    """Per-draw sds, each estimated one scaled by ν/χ²_ν for its own uncertainty.

    Every estimated sd is itself uncertain: each draw scales its variance by ν/χ²_ν (ν its degrees of
    freedom), which for a quantity linear in the noise gives exactly the t_ν interval. With 5 sizes ×
    1 seed (ν = 4) that makes the intervals ~1.4× (t_4/z) as wide as with a known sd, and they are
    calibrated (95% coverage measured, analysis/benchmarks/RESULTS.md); a fixed t_ν/z scale instead
    was tried and measured no better (wider at the largest size), so the mixture stays. One draw
    shares its noise scales across architectures, so ratios are computed from paired fits."""
    def mix(sd: float, dof: float) -> np.ndarray:
        if sd <= 0 or dof <= 0:
            return np.zeros((n_boot, 1))
        if np.isinf(dof):
            return np.full((n_boot, 1), sd)
        return (sd * np.sqrt(dof / rng.chisquare(dof, n_boot)))[:, None]

    return Scales(sd=mix(noise.sd, noise.dof), between=mix(noise.between_sd, noise.between_dof),
                  run=mix(noise.run_sd, noise.run_dof))


def draw_targets(rng: np.random.Generator, fitted: np.ndarray, cell: np.ndarray, scales: Scales,
                 run: np.ndarray | None = None) -> np.ndarray:
    """Simulated log losses (B, n): fitted curve + a size-level effect per cell + a per-run offset
    (shared by the run's evaluations) + noise per evaluation."""
    n_boot, n = len(scales.sd), len(fitted)
    cells = np.unique(cell, return_inverse=True)[1].ravel()
    size_effect = rng.standard_normal((n_boot, cells.max() + 1))[:, cells] * scales.between
    out = fitted[None, :] + size_effect + rng.standard_normal((n_boot, n)) * scales.sd
    if np.any(scales.run > 0) and run is not None:
        runs = np.unique(run, return_inverse=True)[1].ravel()
        out += rng.standard_normal((n_boot, runs.max() + 1))[:, runs] * scales.run
    return out


def interval(draws: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Percentile interval per column of ``draws`` (B, k); NaN (undefined) counts as +∞.

    Returns lower, upper and the share of undefined draws; an upper bound of +∞ means the data
    cannot rule out that no finite value is reached."""
    tail = (1.0 - level) / 2.0
    x = np.where(np.isnan(draws), np.inf, draws)
    x = np.sort(x, axis=0)
    b = x.shape[0]
    lo = x[int(np.floor(tail * (b - 1)))]
    hi = x[int(np.ceil((1.0 - tail) * (b - 1)))]
    return lo, hi, np.isnan(draws).mean(axis=0)
