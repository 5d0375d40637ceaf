"""Which run to add next: a preposterior analysis of the efficiency ratio's CI (``diffsweep suggest``).

For a candidate run (an architecture at a size, or a token count): how much narrower the CI of ρ at
the chosen reference is expected to be once it has finished, per GPU-hour. Its outcome is simulated
from M paired bootstrap draws of the current fit, the laws are refitted, and the linearised
(delta-method) CI width is read with and without it (``expected_reduction``, ``half_width``).
``choose_within`` picks runs within a GPU-hour budget greedily (not the optimal set). Scope: one law
per architecture (not ``--shared-e``). Where runs give several points (a token scan read from one
run's checkpoints, or a run and its cooldown branches: a run *family*), the points of a family share
its offset, as in the fit's hierarchical bootstrap: the width is the sandwich covariance of the fit
under that correlation, a new cooldown branch of a measured run is simulated with that run's offset
(as the data estimate it) and priced at its cooldown only, and another seed of a family is a new run
with its own offset giving all of the family's points. See docs/fits.md, 'Which run next:
`diffsweep suggest`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import norm
from scipy.stats import t as t_dist

from diffsweep.config import ConfigError
from diffsweep.config.units import human
from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.choices import Axis
from diffsweep.scaling.fitting.fit import LawFit, fit_law
from diffsweep.scaling.fitting.optimize import Data
from diffsweep.scaling.points import architectures, run_ids
from diffsweep.scaling.result import FitResult

FD_STEP = 1e-5  # central-difference step on the (log-space) parameters for ∂ log ρ / ∂θ
DEFAULT_DRAWS = 64  # simulated outcomes per candidate (common random numbers across candidates)


@dataclass(frozen=True)
class Candidate:
    """One run that could be added: its architecture, where it sits on the fitted axis (``x``, and
    ``other``: D of a joint L(N, D) law), its size and tokens (for display) and its cost."""

    arch: str
    x: float
    gpu_hours: float
    num_params: float
    tokens: float
    other: float = 0.0
    name: str = ""  # a planned run's name; "" for an extra
    # planned | seed (another seed of a measured point) | extra (a new size or token count) | beyond-edge (a
    # tuning value beyond the end of its grid, where a cell's best is: ``beyond_edges``)
    origin: str = "extra"
    repeatable: bool = False  # an extra can be chosen more than once (more seeds); a planned run once
    # The run family whose offset it shares: a measured family's id (a new cooldown branch of that
    # run), a planned parent's key (it and its planned branches); "": a run of its own.
    family: str = ""
    more: tuple[tuple[float, float], ...] = ()  # the further (x, other) points the same new run gives
    like: str = ""  # another seed of this measured family (``more``: the family's other points)

    @property
    def points(self) -> tuple[tuple[float, float], ...]:
        return ((self.x, self.other), *self.more)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.like:
            return f"{self.arch}: another seed of {self.like} ({len(self.points)} points)"
        if self.origin == "branch":
            return f"{self.arch} @ {human(self.x)}: a new branch of {self.family}"
        return f"{self.arch} @ {human(self.x)}" + (" (another seed)" if self.origin == "seed" else "")


@dataclass(frozen=True)
class Design:
    """The current fit as ``suggest`` needs it: per architecture the fitted law (with its data) and
    paired bootstrap draws, the noise, the ratio being narrowed and at which reference."""

    fits: dict[str, LawFit]
    draws: dict[str, np.ndarray]  # (M, p) per architecture, the same row = the same draw
    baseline: str
    candidate: str
    ref: float
    axis: str  # N | D (the ratio's axis)
    other_ref: float | None  # a joint law's fixed D for ρ_N
    sd: float  # per-point noise sd of log loss (evaluation and size-level components combined)
    dof: float  # the noise estimate's degrees of freedom (inf: given)
    noise_source: str  # given | seeds | residuals
    level: float
    measured: dict[str, np.ndarray] = field(default_factory=dict)  # distinct x per architecture
    families: dict[str, np.ndarray] = field(default_factory=dict)  # run family id of each data row per architecture
    run_sd: float = 0.0  # sd of a family's offset, shared by its points (0: runs give one point, or not measured)
    run_dof: float = np.inf

    def log_ratio(self, theta_base: np.ndarray, theta_cand: np.ndarray) -> np.ndarray:
        """log ρ at the reference for each row of the two (B, p) parameter arrays: (B,)."""
        law_b, law_c = self.fits[self.baseline].law, self.fits[self.candidate].law
        target = law_b.loss_at(theta_base, self.ref, 0, self.other_ref, self.axis)
        x = law_c.invert(theta_cand, target, 0, self.other_ref, self.axis)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log(x[:, 0] / self.ref)


def design_from_points(points: pd.DataFrame, request: FitRequest, candidate: str | None = None,
                       ref: float | None = None, num_draws: int = DEFAULT_DRAWS) -> tuple[Design, FitResult]:
    """Fit ``points`` as ``diffsweep fit`` would (``request``), and the design ``suggest`` works on:
    the ratio of ``candidate`` (default: the first) at ``ref`` (default: the largest measured x)."""
    if request.shared_e:
        raise ConfigError("shared_e", "suggest fits one law per architecture; a shared E is not supported yet")
    result = analyse(points, request)
    if not result.candidates:
        raise ConfigError("candidates", "one architecture only: there is no ratio whose CI a run could narrow")
    cand = candidate or result.candidates[0]
    if cand not in result.candidates:
        raise ConfigError("candidates", f"'{cand}' is not among the fitted candidates ({', '.join(result.candidates)})")
    assert result.points is not None
    axis = Axis.N if result.axis in ("N", "N,D") else Axis.D
    archs = architectures(result.points, axis, request)
    fits: dict[str, LawFit] = {}
    draws: dict[str, np.ndarray] = {}
    measured: dict[str, np.ndarray] = {}
    families: dict[str, np.ndarray] = {}
    used = result.points[result.points["used"]]
    m = min(num_draws, result.n_boot)
    for name in (request.baseline, cand):
        arch = archs[name]
        families[name] = run_ids(used[used["arch"] == name])
        data = Data(u=np.log(arch.x), y=np.log(arch.loss), v=np.log(np.maximum(arch.other, 1e-300)))
        fits[name] = fit_law(result.curves[name].law, data, request.resolved_objective)
        draws[name] = result.curves[name].draws[:m]
        measured[name] = np.unique(arch.x)
    noise = result.noise
    sd = float(np.hypot(noise["sd"], noise.get("between_sd") or 0.0))
    dof = float(noise["dof"]) if noise.get("dof") is not None else np.inf
    hierarchical = result.resampling.get("unit") == "run"
    run_sd = float(noise.get("run_sd") or 0.0) if hierarchical else 0.0
    run_dof = float(noise["run_dof"]) if hierarchical and noise.get("run_dof") is not None else np.inf
    at = float(ref) if ref is not None else float(measured[request.baseline].max())
    design = Design(fits=fits, draws=draws, baseline=request.baseline, candidate=cand, ref=at,
                    axis="D" if result.axis == "D" else "N", other_ref=result.other_ref, sd=sd, dof=dof,
                    noise_source=noise["source"], level=request.level, measured=measured, families=families,
                    run_sd=run_sd, run_dof=run_dof)
    return design, result


Dof = tuple[float, float]  # degrees of freedom of the per-point sd and of the run offsets' sd (inf: given)


def half_width(design: Design, data: dict[str, Data], theta: dict[str, np.ndarray], dof: Dof,
               families: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The linearised (delta-method) CI half-width of log ρ, t·se, for each row of ``theta`` (B, p
    per architecture) fitted to ``data``: (B,), +inf where ρ is undefined.

    Linearised, not bootstrapped: a full bootstrap per simulated outcome per candidate would be
    M × B refits. The delta method on log ρ, with each architecture's least-squares covariance and
    the Student t quantile for the noise's degrees of freedom (the bootstrap's ν/χ²_ν noise mixture
    gives exactly t_ν for a quantity linear in the noise; bootstrap.py); ``_width`` turns it into a
    width of ρ:

        width = ρ̂ (exp(t·se) − exp(−t·se)),  se² = Σ_arch g_archᵀ Cov_arch g_arch,  g = ∂ log ρ / ∂θ.

    Points independent, Cov = σ²(JᵀJ)⁻¹ (Gauss-Newton). Where the points of a run family
    (``families``: the id of each row's family, default the design's) share an offset of sd τ, the
    fit is still least squares, so Cov is its sandwich (JᵀJ)⁻¹ Jᵀ(σ²I + τ²ZZᵀ)J (JᵀJ)⁻¹ (Z: rows ×
    families), split into its σ² and τ² parts, and the quantile is that of the two components each
    scaled for its own degrees of freedom, as the bootstrap draws them (``_mixture_quantile``).
    ρ̂ is the current estimate (so the median over draws of the width is that of t·se, transformed).
    It is checked against the full bootstrap width on the synthetic ladder and on branch scans
    (tests/scaling/test_suggest.py)."""
    base, cand = design.baseline, design.candidate
    tb, tc = theta[base], theta[cand]
    families = design.families if families is None else families
    log_rho = design.log_ratio(tb, tc)
    var_e = np.zeros(len(tb))
    var_r = np.zeros(len(tb))
    for name, t in ((base, tb), (cand, tc)):
        grad = np.empty_like(t)
        for j in range(t.shape[1]):
            step = np.zeros(t.shape[1])
            step[j] = FD_STEP
            if name == base:
                up, down = design.log_ratio(t + step, tc), design.log_ratio(t - step, tc)
            else:
                up, down = design.log_ratio(tb, t + step), design.log_ratio(tb, t - step)
            grad[:, j] = (up - down) / (2 * FD_STEP)
        fit = design.fits[name]
        _, jac = data[name].predict(fit.law, t)  # (B, n, p)
        info_inv = np.linalg.pinv(np.einsum("bni,bnj->bij", jac, jac))
        var_e += design.sd ** 2 * np.einsum("bi,bij,bj->b", grad, info_inv, grad)
        if design.run_sd > 0:
            z = np.eye(len(np.unique(families[name])))[np.unique(families[name], return_inverse=True)[1].ravel()]
            per_family = np.einsum("nf,bni->bfi", z, jac) @ np.einsum("bij,bj->bi", info_inv, grad)[:, :, None]
            var_r += design.run_sd ** 2 * (per_family[:, :, 0] ** 2).sum(axis=1)
    e_dof, r_dof = dof
    if design.run_sd > 0:
        half = _mixture_quantile(var_e, var_r, e_dof, r_dof, design.level)
    else:
        q = (1 + design.level) / 2
        quantile = float(t_dist.ppf(q, e_dof)) if np.isfinite(e_dof) else float(norm.ppf(q))
        half = quantile * np.sqrt(np.maximum(var_e, 0.0))
    return np.where(np.isfinite(log_rho) & np.isfinite(half), half, np.inf)


MIXTURE_SAMPLES = 4000  # fixed draws of the two-component t mixture (the same in every call)


def _mixture_quantile(var_e: np.ndarray, var_r: np.ndarray, e_dof: float, r_dof: float, level: float) -> np.ndarray:
    """The ``level`` two-sided quantile of Z·√(v_e·ν_e/χ²_{ν_e} + v_r·ν_r/χ²_{ν_r}) for each row: what
    the fit's bootstrap draws for a quantity linear in the noise (each sd scaled by its own ν/χ²_ν,
    bootstrap.scale_draws). With one component it is t_ν's; with two, neither Satterthwaite's t
    (it understates a component with few degrees of freedom: 2 run offsets' t_2 tail) nor a sum of
    quantiles. Monte Carlo over fixed draws (``MIXTURE_SAMPLES``, one seeded stream), so the
    comparison of candidates is smooth."""
    rng = np.random.default_rng(20241205)
    z = np.abs(rng.standard_normal(MIXTURE_SAMPLES))

    def scale(dof: float) -> np.ndarray:
        return np.ones(MIXTURE_SAMPLES) if not np.isfinite(dof) else dof / rng.chisquare(max(dof, 1e-9), MIXTURE_SAMPLES)

    w_e, w_r = scale(e_dof), scale(r_dof)
    spread = np.sqrt(np.maximum(var_e, 0.0)[:, None] * w_e + np.maximum(var_r, 0.0)[:, None] * w_r) * z
    with np.errstate(invalid="ignore"):
        return np.quantile(spread, level, axis=1)


def _rho(design: Design) -> float:
    """ρ at the current estimate."""
    return float(np.exp(design.log_ratio(design.fits[design.baseline].theta[None, :],
                                         design.fits[design.candidate].theta[None, :])[0]))


def _width(design: Design, half_log: float) -> float:
    """A CI of log ρ of half-width ``half_log`` as a width in ratio units, at the current estimate
    (fixed, so the median over draws of this monotone transform is the transform of the median)."""
    rho = _rho(design)
    with np.errstate(over="ignore", invalid="ignore"):
        width = rho * 2.0 * np.sinh(half_log)
    return float(width) if np.isfinite(width) else np.inf


def current_width(design: Design) -> float:
    """The linearised CI width of ρ now, at the estimate."""
    data = {a: f.data for a, f in design.fits.items()}
    theta = {a: f.theta[None, :] for a, f in design.fits.items()}
    return _width(design, float(half_width(design, data, theta, (design.dof, design.run_dof))[0]))


def _dof_after(design: Design, added: Sequence[Candidate]) -> Dof:
    """Degrees of freedom of the noise estimates once ``added`` are in. Points independent: a
    residual estimate gains one per point, a seed estimate one per repeat of a measured point.
    Families sharing offsets: what the fit's two-way (cell × run) decomposition gains
    (``_two_way_dof``): a new branch at a measured token count one per-point degree of freedom, a
    new run with a point at a measured cell one run degree of freedom, a point at a new cell
    nothing. A given sd stays known."""
    if design.run_sd > 0:
        e_dof, r_dof = design.dof, design.run_dof
        for name, fit in design.fits.items():
            fam = design.families[name]
            rows = [(x, other, _family_of(c, i)) for i, c in enumerate(added) if c.arch == name for x, other in c.points]
            if not rows:
                continue
            e0, r0 = _two_way_dof(fit.data.u, fit.data.v, fam)
            e1, r1 = _two_way_dof(np.concatenate([fit.data.u, np.log([x for x, _, _ in rows])]),
                                  None if fit.data.v is None else np.concatenate(
                                      [fit.data.v, np.log(np.maximum([o for _, o, _ in rows], 1e-300))]),
                                  np.concatenate([fam, [f for *_, f in rows]]))
            e_dof, r_dof = e_dof + e1 - e0, r_dof + r1 - r0
        return e_dof, r_dof
    points = [(c.arch, x) for c in added for x, _ in c.points]
    if not np.isfinite(design.dof):
        return design.dof, design.run_dof
    if design.noise_source == "residuals":
        return design.dof + len(points), design.run_dof
    repeats = 0
    for arch in dict.fromkeys(a for a, _ in points):  # points at a measured x: one np.isclose per architecture
        xs = np.array([x for a, x in points if a == arch])
        repeats += int(np.isclose(design.measured[arch][None, :], xs[:, None], rtol=1e-9).any(axis=1).sum())
    return design.dof + repeats, design.run_dof


def _two_way_dof(u: np.ndarray, v: np.ndarray | None, families: np.ndarray) -> tuple[int, int]:
    """The per-point and run degrees of freedom of one architecture's rows in the fit's two-way
    (cell × run) decomposition (bootstrap._multi_point): n − rank[X Z] and rank[X Z] − rank X."""
    key = np.column_stack([np.round(u, 9), np.zeros_like(u) if v is None else np.round(v, 9)])
    x = np.eye(len(np.unique(key, axis=0)))[np.unique(key, axis=0, return_inverse=True)[1].ravel()]
    z = np.eye(len(np.unique(families)))[np.unique(families, return_inverse=True)[1].ravel()]
    rank_xz, rank_x = np.linalg.matrix_rank(np.hstack([x, z])), np.linalg.matrix_rank(x)
    return len(u) - rank_xz, rank_xz - rank_x


def _family_of(c: Candidate, i: int) -> str:
    return c.family or f"new run {i}"


def _simulated(design: Design, added: Sequence[Candidate], seed: int
               ) -> tuple[dict[str, Data], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each architecture's data plus the points of the runs ``added``, its laws refitted for each of
    the design's M draws, and the family of every row: that draw's curves at the added points plus
    noise are the outcomes, refitted as ``LawFit.refit`` refits a bootstrap draw (warm start plus
    the form's extra starts). Noise: per point sd ``design.sd``; where families share offsets
    (``design.run_sd``), each added family's offset too: a new run's drawn afresh (sd τ), a
    measured run's (a new cooldown branch of it) drawn from what its points say of it in that draw
    (their mean residual shrunk by τ²/(τ² + σ²/n), with the rest of τ² left). Common random
    numbers: the first point of the i-th added run has the i-th column of one seeded (M, k) normal
    matrix, its other points and its family's offset streams seeded by (seed, i), so candidates
    compared at one step see the same noise. An architecture's added rows follow its measured ones,
    in the order of ``added``."""
    m = len(design.draws[design.baseline])
    z = np.random.default_rng(seed).standard_normal((m, len(added)))
    data: dict[str, Data] = {}
    theta: dict[str, np.ndarray] = {}
    families: dict[str, np.ndarray] = {}
    for name, fit in design.fits.items():
        cols = [i for i, c in enumerate(added) if c.arch == name]
        d = fit.data
        fam = design.families.get(name, np.array([f"row {k}" for k in range(len(d.y))]))
        families[name] = fam
        if not cols:
            data[name], theta[name] = d, np.repeat(fit.theta[None, :], m, axis=0)
            continue
        rows = [(i, j, x, other) for i in cols for j, (x, other) in enumerate(added[i].points)]
        u_new = np.log([x for _, _, x, _ in rows])
        v_new = np.log(np.maximum([o for *_, o in rows], 1e-300))
        mean, _ = fit.law.predict(design.draws[name], u_new, v_new)  # (M, k) the draw's curve there
        eps = np.column_stack([z[:, i] if j == 0 else
                               np.random.default_rng([seed, i]).standard_normal((m, len(added[i].points)))[:, j]
                               for i, j, _, _ in rows])
        outcome = mean + design.sd * eps
        new_fam = np.array([_family_of(added[i], i) for i, *_ in rows])
        if design.run_sd > 0:
            outcome += _offsets(design, name, fam, new_fam, [i for i, *_ in rows], seed)
        aug = Data(u=np.concatenate([d.u, u_new]), y=np.concatenate([d.y, outcome[0]]),  # y: one draw's; refit uses targets
                   v=None if d.v is None else np.concatenate([d.v, v_new]))
        targets = np.concatenate([np.repeat(d.y[None, :], m, axis=0), outcome], axis=1)
        with np.errstate(all="ignore"):
            theta[name] = LawFit(fit.law, aug, fit.objective, fit.solution).refit(targets)
        data[name] = aug
        families[name] = np.concatenate([fam, new_fam])
    return data, theta, families


def _offsets(design: Design, name: str, fam: np.ndarray, new_fam: np.ndarray, owner: list[int],
             seed: int) -> np.ndarray:
    """Each added row's family offset (M, k): drawn once per family, from the stream of the first
    added run in it; a measured family's conditional on its points in each draw (``_simulated``)."""
    fit = design.fits[name]
    m = len(design.draws[name])
    tau2, sigma2 = design.run_sd ** 2, design.sd ** 2
    residuals = None
    out = np.zeros((m, len(new_fam)))
    for f in dict.fromkeys(new_fam):
        where = new_fam == f
        z = np.random.default_rng([seed, owner[int(np.argmax(where))], 1]).standard_normal(m)
        measured = fam == f
        if not measured.any():
            out[:, where] = (np.sqrt(tau2) * z)[:, None]
            continue
        if residuals is None:
            curve, _ = fit.law.predict(design.draws[name], fit.data.u, fit.data.v)
            residuals = fit.data.y[None, :] - curve  # (M, n) the data around each draw's curve
        n = int(measured.sum())
        shrink = tau2 / (tau2 + sigma2 / n)
        out[:, where] = (shrink * residuals[:, measured].mean(axis=1) + np.sqrt(shrink * sigma2 / n) * z)[:, None]
    return out


def expected_ci_width(design: Design, added: Sequence[Candidate], seed: int = 0) -> float:
    """The median linearised CI width of ρ after the runs ``added`` finish, over the design's M draws:
    the laws refitted to the data plus each draw's simulated outcomes (``_simulated``), the width
    read at the refitted laws."""
    data, theta, families = _simulated(design, added, seed)
    with np.errstate(all="ignore"):
        half = half_width(design, data, theta, _dof_after(design, added), families)
    return _width(design, float(np.median(half)))


def expected_reduction(design: Design, chosen: Sequence[Candidate], candidate: Candidate, seed: int = 0) -> float:
    """How much narrower the CI of ρ is expected to be once ``candidate`` finishes, after ``chosen``.

    Paired per draw: the laws are refitted to the data plus ``chosen`` and the candidate's simulated
    outcomes, and at those refitted laws the linearised width is read twice, with and without the
    candidate's run (its information, and its degrees of freedom). The median over the M draws of
    the difference is the expected reduction. Reading both widths at the same laws cancels what
    the refits add to both (the estimate moving with the simulated outcomes), which otherwise
    swamps the small narrowing one cheap run brings: unpaired, the widths after two different
    refits differ by more than one cheap run narrows them, and greedy stopped far below its budget.
    The median is robust to the few draws whose candidate never reaches the baseline's loss, or
    whose refit is near-singular, where the linearised width explodes."""
    added = [*chosen, candidate]
    data, theta, families = _simulated(design, added, seed)
    before, before_families = dict(data), dict(families)
    d, k = data[candidate.arch], len(candidate.points)  # the candidate's rows are the last of its architecture
    before[candidate.arch] = Data(u=d.u[:-k], y=d.y[:-k], v=None if d.v is None else d.v[:-k])
    before_families[candidate.arch] = families[candidate.arch][:-k]
    rho = _rho(design)
    with np.errstate(all="ignore"):
        after = rho * 2.0 * np.sinh(half_width(design, data, theta, _dof_after(design, added), families))
        prior = rho * 2.0 * np.sinh(half_width(design, before, theta, _dof_after(design, chosen), before_families))
        gain = prior - after
    gain = gain[np.isfinite(gain)]
    return float(np.median(gain)) if len(gain) * 2 > len(after) else -np.inf  # ρ undefined in most draws


@dataclass(frozen=True)
class Scored:
    """A candidate with its expected width after it finishes and the narrowing per GPU-hour."""

    candidate: Candidate
    width_after: float
    reduction: float  # current width − width after
    per_gpu_hour: float

    def to_dict(self) -> dict:
        c = self.candidate
        return {"candidate": c.label, "name": c.name or None, "arch": c.arch, "origin": c.origin,
                "num_params": c.num_params, "tokens": c.tokens, "gpu_hours": c.gpu_hours,
                "family": c.family or c.like or None, "points": len(c.points),
                "expected_width_after": finite(self.width_after), "reduction": finite(self.reduction),
                "reduction_per_gpu_hour": finite(self.per_gpu_hour)}


def _score(design: Design, chosen: Sequence[Candidate], candidates: Sequence[Candidate], width_now: float,
           seed: int) -> list[Scored]:
    out: list[Scored] = []
    for c in candidates:
        gain = expected_reduction(design, chosen, c, seed)
        out.append(Scored(c, width_now - gain, gain, gain / c.gpu_hours if c.gpu_hours > 0 else np.inf * np.sign(gain)))
    return out


def rank(design: Design, candidates: Sequence[Candidate], seed: int = 0) -> tuple[float, list[Scored]]:
    """The width now (linearised) and every candidate scored alone, best reduction per GPU-hour first."""
    now = expected_ci_width(design, [], seed)
    scored = _score(design, [], candidates, now, seed)
    return now, sorted(scored, key=lambda s: (-_key(s.per_gpu_hour), s.candidate.gpu_hours))


@dataclass(frozen=True)
class Choice:
    """The runs picked within a budget, in the order picked, and the expected width after each."""

    budget: float
    steps: list[Scored]
    width_now: float
    stopped: str = "budget"  # budget: nothing left is affordable | no gain: nothing affordable narrows it | max runs

    @property
    def spent(self) -> float:
        return float(sum(s.candidate.gpu_hours for s in self.steps))

    @property
    def width_after(self) -> float:
        return self.steps[-1].width_after if self.steps else self.width_now

    def to_dict(self) -> dict:
        return {"method": "greedy", "budget_gpu_hours": self.budget, "spent_gpu_hours": self.spent,
                "stopped": self.stopped,
                "expected_width_after": finite(self.width_after), "runs": [s.to_dict() for s in self.steps]}


def choose_within(design: Design, candidates: Sequence[Candidate], budget: float, seed: int = 0,
                  max_runs: int = 64) -> Choice:
    """Greedy selection within ``budget`` GPU-hours: repeatedly the affordable candidate with the
    largest expected narrowing per GPU-hour given the runs already chosen; stops when none
    narrows the CI (or none is affordable). Each step's reduction is against the width after the
    previous step."""
    now = expected_ci_width(design, [], seed)
    width = now
    chosen: list[Candidate] = []
    steps: list[Scored] = []
    pool = list(candidates)
    stopped = "max runs"
    while len(steps) < max_runs:
        spent = sum(c.gpu_hours for c in chosen)
        affordable = [c for c in pool if spent + c.gpu_hours <= budget * (1 + 1e-9)]
        if not affordable:
            stopped = "budget"
            break
        scored = _score(design, chosen, affordable, width, seed)
        best = max(scored, key=lambda s: (_key(s.per_gpu_hour), -s.candidate.gpu_hours))
        if not best.reduction > 0:
            stopped = "no gain"
            break
        chosen.append(best.candidate)
        steps.append(best)
        width = best.width_after
        if not best.candidate.repeatable:
            pool.remove(best.candidate)
    return Choice(budget=budget, steps=steps, width_now=now, stopped=stopped)


def _key(v: float) -> float:
    return v if np.isfinite(v) else (np.inf if v > 0 else -np.inf) if not np.isnan(v) else -np.inf


def finite(v: float) -> float | None:  # None where infinite or NaN: JSON has no such numbers
    return float(v) if np.isfinite(v) else None
