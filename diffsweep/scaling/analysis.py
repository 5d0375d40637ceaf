"""The fit behind ``diffsweep fit``: points → laws per architecture → paired bootstrap → ratios.

``analyse(points, request)`` is pure (a table in, a ``FitResult`` out); reading runs from
MLflow, writing reports and logging the fit run live in ``table``, ``report`` and ``pipeline``.
What depends on the law's form is asked of its registered definition (``laws.law_form``).

Errors name the ``FitRequest`` field at fault (``ConfigError("at", ...)``); the CLI maps fields
to its flags.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm
from scipy.stats import t as t_dist

from diffsweep.config import ConfigError
from diffsweep.config.units import human
from diffsweep.scaling import tuning

# the enums' home is the numpy-free choices module (the CLI's options); re-exported here
from diffsweep.scaling.choices import Axis, Count, TokenPoints
from diffsweep.scaling.compute_optimal import compute_optimal, token_ratios
from diffsweep.scaling.fitting import resample
from diffsweep.scaling.fitting.bootstrap import Group, Noise, draw_targets, estimate_noise, interval, scale_draws
from diffsweep.scaling.fitting.fit import LawFit, fit_law
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.mle import fit_huber_mle
from diffsweep.scaling.fitting.optimize import Data, Objective
from diffsweep.scaling.laws import law_forms
from diffsweep.scaling.laws.base import LawForm
from diffsweep.scaling.points import (
    Arch,
    architectures,
    choose_axis,
    finite,
    select_points,
    x_column,
)
from diffsweep.scaling.ratio import Curve, per_point, ratio
from diffsweep.scaling.report import arch_name
from diffsweep.scaling.request import FitRequest
from diffsweep.scaling.result import FitResult, FitWarning
from diffsweep.scaling.shift import shift_model

__all__ = ["Axis", "Count", "FitRequest", "FitResult", "FitWarning", "TokenPoints", "analyse"]


FAR_OUTSIDE = 10.0  # a reference size more than 10x outside the measured range is refused
RATIO_GRID = 41  # points on the ratio-vs-size curve


def analyse(points: pd.DataFrame, request: FitRequest) -> FitResult:
    """Fit, bootstrap and compare; ``FitResult.to_dict()`` is the document ``report`` renders."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FitWarning)
        result = _analyse(points, request)
    return replace(result, warnings=list(dict.fromkeys(str(w.message) for w in caught
                                                       if issubclass(w.category, FitWarning))))


def _analyse(points: pd.DataFrame, req: FitRequest) -> FitResult:
    form = req.law_form
    points = finite(points)
    axis = choose_axis(points, req)
    used = select_points(points, axis, req)
    choice = _tuning_choice(used, axis, req) if req.tune else None
    if choice is not None:
        used = choice.points
    archs = architectures(used, axis, req)
    base_name = req.baseline
    objective = req.resolved_objective
    other_ref = None
    if form.joint_nd:  # ρ_N is read at the baseline's largest D
        other_ref = float(archs[base_name].other.max())
    refs, ref_labels = _references(archs[base_name], req)

    main = _fit_all(archs, req.form, objective, req.shared_e)
    _diagnostic_warnings(main)
    comparison = _fit_all(archs, PAPER_LAW, Objective.L2, False) if form.pure_comparison else None
    # one definition of a point's run: points.run_index (None: each point a run of its own)
    runs = {a: arch.run if arch.run is not None else np.arange(len(arch.x)) for a, arch in archs.items()}
    resampling = resample.choose({a: len(np.unique(arch.cell)) for a, arch in archs.items()}, runs, req.shared_e)
    if choice is not None:  # a case resample cannot redo the selection: the draws stay parametric
        resampling = None
    with warnings.catch_warnings():  # resampled draws use no noise model: its caveat does not apply
        if resampling is not None:
            warnings.simplefilter("ignore", FitWarning)
        noise = _noise(archs, main, objective, req) if choice is None else _tuned_noise(archs, main, choice, axis, req)
    rng = np.random.default_rng(req.seed)
    scales = scale_draws(rng, noise, req.n_boot)
    z = {a: draw_targets(rng, np.zeros(len(arch.x)), arch.cell, scales, arch.run)
         for a, arch in archs.items()}
    tuned = None
    if choice is not None:  # every draw redoes each cell's selection; its bias is removed from the fit
        z, archs, tuned = _reselect(rng, z, archs, choice, scales, float(np.hypot(noise.sd, noise.run_sd)))
        main = _fit_all(archs, req.form, objective, req.shared_e)
        comparison = _fit_all(archs, PAPER_LAW, Objective.L2, False) if form.pure_comparison else None
    w = None
    if resampling is not None:  # ≥ 30 distinct points per architecture: case (or cluster) resampling
        w = {a: resample.weights(rng, runs[a] if resampling.unit == "run" else np.arange(len(arch.x)), req.n_boot)
             for a, arch in archs.items()}
        curves = {a: Curve(main[a].law, main[a].theta, resample.refit(main[a], w[a])) for a in archs}
        pure_curves = ({a: Curve(comparison[a].law, comparison[a].theta, resample.refit(comparison[a], w[a]))
                        for a in archs} if comparison else None)
    else:
        curves = _bootstrap(archs, main, z)
        pure_curves = _bootstrap(archs, comparison, z) if comparison else None

    x_axis = "N" if axis is Axis.N or form.joint_nd else "D"
    measured = (float(archs[base_name].x.min()), float(archs[base_name].x.max()))
    ratios, curve, multipliers = [], {}, []
    grid = np.geomspace(measured[0], measured[1] * 2.0, RATIO_GRID)
    for cand in (c for c in archs if c != base_name):
        point = ratio(curves[base_name], curves[cand], refs, other_ref, x_axis)
        draws = ratio(curves[base_name], curves[cand], refs, other_ref, x_axis, boot=True)
        lo, hi, undefined = interval(draws, req.level)
        pure = None
        if pure_curves:
            p_point = ratio(pure_curves[base_name], pure_curves[cand], refs)
            p_lo, p_hi, _ = interval(ratio(pure_curves[base_name], pure_curves[cand], refs, boot=True), req.level)
        cand_range = (float(archs[cand].x.min()), float(archs[cand].x.max()))
        for k, ref in enumerate(refs):
            if pure_curves:
                pure = {"ratio": _f(p_point[k]), "lo": _f(p_lo[k]), "hi": _f(p_hi[k])}
            row = {"candidate": cand, "axis": x_axis, "at": float(ref), "at_label": ref_labels[k],
                   "ratio": _f(point[k]), "lo": _f(lo[k]), "hi": _f(hi[k]),
                   "undefined_share": float(undefined[k]), "pure_law": pure}
            ratios.append(row | _extrapolation(row, measured, cand_range, base_name))
            if undefined[k] > (1 - req.level) / 2:
                warnings.warn(FitWarning(
                    f"{arch_name(cand)} at {ref_labels[k]}: in {undefined[k]:.0%} of bootstrap draws the candidate "
                    f"never reaches the {arch_name(base_name)}'s loss, so the upper CI bound is unbounded"))
        c_draws = ratio(curves[base_name], curves[cand], grid, other_ref, x_axis, boot=True)
        c_lo, c_hi, _ = interval(c_draws, req.level)
        curve[cand] = {"x": grid.tolist(), "ratio": _list(ratio(curves[base_name], curves[cand], grid, other_ref, x_axis)),
                       "lo": _list(c_lo), "hi": _list(c_hi)}
        arch = archs[cand]
        for c in np.unique(arch.cell):
            mask = arch.cell == c
            x, loss = float(arch.x[mask][0]), float(arch.loss[mask].mean())
            m = per_point(curves[base_name], np.array([x]), np.array([loss]), other_ref, x_axis)[0]
            multipliers.append({"candidate": cand, "x": x, "loss": loss, "multiplier": _f(m)})

    if form.joint_nd:  # ρ_D along tokens at the largest N, as ρ_N is read at the largest D
        n_ref = float(archs[base_name].x.max())
        for cand in (c for c in archs if c != base_name):
            ratios += token_ratios(curves[base_name], curves[cand], cand, archs[base_name].other,
                                   archs[cand].other, n_ref, req.level)
    # the paper's reading needs pure-law curves: this fit's own, or the pure law fitted beside it
    pure_for_paper = curves if str(req.form) == PAPER_LAW else pure_curves
    paper = None if form.joint_nd else _paper_reading(pure_for_paper, curves, base_name, x_axis, measured, req)
    pure_fits = None
    if comparison:
        pure_fits = {a: {k: float(v[0]) for k, v in comparison[a].law.natural(
            comparison[a].theta[None, :], 0).items()} for a in archs}
    holdout = _holdout(points, req, axis) if req.holdout else None
    compute, shift = _compute_optimal_and_shift(form, archs, main, curves, noise, z, w, req)
    return FitResult(
        axis=x_axis if not form.joint_nd else "N,D",
        count=req.count.value,
        form=str(req.form),
        objective=objective.value,
        shared_e=req.shared_e,
        baseline=base_name,
        candidates=[a for a in archs if a != base_name],
        level=req.level,
        n_boot=req.n_boot,
        seed=req.seed,
        noise=noise.to_dict(),
        resampling=resampling.to_dict() if resampling is not None else noise.resampling(),
        measured_range=list(measured),
        other_ref=other_ref,
        fits={a: _fit_summary(archs[a], main[a], curves[a], req, x_axis, other_ref) for a in archs},
        ratios=ratios,
        ratio_curve=curve,
        per_point=multipliers,
        paper_reading=paper,
        points_used=int(used["used"].sum()),
        token_points=_token_points(used) if x_axis == "D" and not form.joint_nd else None,
        pure_law_fits=pure_fits,
        holdout=holdout,
        compute_optimal=compute,
        shift_model=shift,
        tuning=tuned,
        points=used,
        curves=curves,
    )


def _token_points(points: pd.DataFrame) -> str:
    """What a token scan's D points are: intermediate evaluations, cooldown branches, or separate runs."""
    used = points[points["used"]]
    if (used["point"] != "final").any():
        return "checkpoints"
    return "branches" if (used["parent"].astype(str) != "").any() else "runs"


def _tuning_choice(used: pd.DataFrame, axis: Axis, req: FitRequest) -> tuning.Choice:
    """Each cell's best candidate over ``req.tune`` (warnings for a winner at the edge of its grid and
    for a cell with one value)."""
    if (used.loc[used["used"], "point"] != "final").any():
        raise ConfigError("tune", "a tuned fit reads one final evaluation per run (a size ladder, or runs of "
                          "several budgets); the intermediate evaluations of a token scan cannot be tuned per point")
    joint = req.law_form.joint_nd
    x_col = x_column(req) if axis is Axis.N or joint else "tokens"
    choice = tuning.choose(used, req.tune, x_col, "tokens" if joint else None)
    for cell in choice.cells:
        where = f"{arch_name(cell['arch'])} at {human(cell['x'])}"
        if cell["untuned"]:
            warnings.warn(FitWarning(f"{where}: one candidate ({cell['winner']}): untuned, read as it is"))
        elif cell["edge"]:
            warnings.warn(FitWarning(f"{where}: the best candidate is at the edge of its grid ({'; '.join(cell['edge'])}): "
                                     "the optimum may lie outside the grid: extend it"))
    return choice


def _tuned_noise(archs: dict[str, Arch], main: dict[str, LawFit], choice: tuning.Choice, axis: Axis,
                 req: FitRequest) -> Noise:
    """The noise of a tuned study: from seed replicates or given as for any fit; without seeds,
    from every candidate's runs (an additive model of cell and tuning value), not from the winners'
    residuals, which understate it (and of which a ladder of few sizes may have none to spare)."""
    try:
        with warnings.catch_warnings():  # the residuals' caveat is replaced below when it is not used
            warnings.simplefilter("ignore", FitWarning)
            noise: Noise | None = _noise(archs, main, req.resolved_objective, req)
    except ConfigError:
        noise = None
    if noise is not None and noise.source != "residuals":
        if noise.warning:
            warnings.warn(FitWarning(noise.warning))
        return noise
    joint = req.law_form.joint_nd
    x_col = x_column(req) if axis is Axis.N or joint else "tokens"
    found = tuning.candidate_noise(choice, x_col, "tokens" if joint else None)
    if found is None:
        if noise is None:
            return _noise(archs, main, req.resolved_objective, req)  # its error: too few points and candidates
        if noise.warning:
            warnings.warn(FitWarning(noise.warning))
        return noise
    sd, dof = found
    warning = (f"no seed replicates: the noise (sd {sd:.2g} of log loss) is estimated from every tuning candidate's run "
               f"around an additive model of cell and tuning value ({dof} degrees of freedom); a best value that moves "
               "with size adds to it (wider intervals); run seeds for a direct estimate")
    warnings.warn(FitWarning(warning))
    return Noise("residuals", sd, float(dof), warning=warning, description=(
        f"run-to-run noise (sd {sd:.2g} of log loss) from the spread of all tuning candidates around an additive "
        f"model of cell and tuning value ({dof} degrees of freedom; no seed replicates)"))


def _reselect(rng: np.random.Generator, z: dict[str, np.ndarray], archs: dict[str, Arch], choice: tuning.Choice,
              scales: Any, point_sd: float) -> tuple[dict[str, np.ndarray], dict[str, Arch], dict[str, Any]]:
    """The draws with every cell's selection redone, the architectures' points with the selection
    bias removed, and the report's tuning section."""
    out_z, out_archs, bias_of, kept_of = {}, {}, {}, {}
    for a, arch in archs.items():
        out_z[a], bias, kept = tuning.reselect(rng, z[a], arch.x, arch.other, arch.cell, choice.losers.get(a),
                                               scales.sd, point_sd)
        out_archs[a] = Arch(arch.name, arch.x, arch.loss * np.exp(-bias), arch.other, arch.run)
        for c in np.unique(arch.cell):
            idx = arch.cell == c
            bias_of[(a, float(arch.x[idx][0]))] = float(bias[idx][0])
            kept_of[(a, float(arch.x[idx][0]))] = float(kept[idx][0])
    order = list(archs)  # the baseline first, then the candidates; each by size
    cells = [cell | {"selection_bias": float(np.expm1(bias_of.get((cell["arch"], cell["x"]), 0.0))),
                     "winner_kept": kept_of.get((cell["arch"], cell["x"]), 1.0)}
             for cell in sorted((c for c in choice.cells if c["arch"] in archs),
                                key=lambda c: (order.index(c["arch"]), c["x"], c["tokens"]))]
    return out_z, out_archs, {"columns": list(choice.columns), "cells": cells,
                              "sensitivity": tuning.sensitivity(cells, choice.columns)}


def _compute_optimal_and_shift(form: LawForm, archs: dict[str, Arch], main: dict[str, LawFit],
                               curves: dict[str, Curve], noise, z: dict, w: dict | None,
                               req: FitRequest) -> tuple[dict | None, dict | None]:
    """The compute-optimal outputs and the joint shift model, where the form supports them."""
    compute = shift = None
    if form.compute_optimal:
        compute = {a: compute_optimal(curves[a], float((6 * arch.x * arch.other).max()), req.level)
                   for a, arch in archs.items()}
    if form.shift_model and not req.shared_e and req.resolved_objective is Objective.L2 and len(archs) > 1:
        base = req.baseline
        shift = {c: shift_model(main[base], main[c], noise.to_dict(), z[base], z[c], req.level,
                                *((w[base], w[c]) if w is not None else (None, None)))
                 for c in archs if c != base}
    return compute, shift


def _references(base: Arch, req: FitRequest) -> tuple[np.ndarray, list[str]]:
    distinct = np.unique(base.x)
    lo, hi = float(distinct.min()), float(distinct.max())
    refs = [hi, float(np.exp(np.log(distinct).mean()))]
    labels = [f"{human(hi)} (largest measured)", f"{human(refs[1])} (geometric mean)"]
    for at in req.at:
        if at > hi * FAR_OUTSIDE or at < lo / FAR_OUTSIDE:
            raise ConfigError("at", f"{human(at)} is more than {FAR_OUTSIDE:g}x outside the measured range "
                              f"{human(lo)}-{human(hi)}; an extrapolation that far is not an answer")
        refs.append(float(at))
        labels.append(human(at))
    return np.array(refs), labels


# How the DIFF paper read its Fig. 3 (arXiv 2410.05258 §3.2): Kaplan-style pure power laws, ratios
# read off the fitted curves at an 11B Transformer (parameters) and 251B tokens.
PAPER_LAW = "pure"  # the form fitted beside the others (where they ask) for the paper's reading
PAPER_READING = {"N": (11e9, "62.2% at 11B (6.8B DIFF vs an 11B Transformer)"),
                 "D": (251e9, "63.7% at 251B tokens (160B for DIFF)")}


def _paper_reading(pure: dict[str, Curve] | None, main: dict[str, Curve], base: str, axis: str,
                   measured: tuple[float, float], req: FitRequest) -> dict:
    """The paper's reading (pure law at its reference) beside this fit's law at the same reference."""
    at, claim = PAPER_READING[axis]
    out: dict[str, Any] = {"law": "pure", "at": at, "at_label": human(at), "paper": claim, "available": False, "why": None,
           "rows": []}
    if pure is None:
        return out | {"why": "no pure-law fit was made"}
    if not measured[0] / FAR_OUTSIDE <= at <= measured[1] * FAR_OUTSIDE:
        return out | {"why": f"{human(at)} is more than {FAR_OUTSIDE:g}x outside the measured {axis} range "
                             f"{human(measured[0])}-{human(measured[1])}, so no fit here can be read there"}
    refs = np.array([at])
    for cand in (c for c in main if c != base):
        row: dict[str, Any] = {"candidate": cand}
        for key, curves in (("pure_law", pure), ("this_fit", main)):
            lo, hi, undefined = interval(ratio(curves[base], curves[cand], refs, boot=True), req.level)
            row[key] = {"ratio": _f(ratio(curves[base], curves[cand], refs)[0]), "lo": _f(lo[0]), "hi": _f(hi[0]),
                        "undefined_share": float(undefined[0])}
        out["rows"].append(row)
    return out | {"available": True, "extrapolated": not _inside(at, measured)}


def _inside(x: float, span: tuple[float, float]) -> bool:
    return span[0] * (1 - 1e-9) <= x <= span[1] * (1 + 1e-9)


def _extrapolation(row: dict, measured: tuple[float, float], cand_range: tuple[float, float], base: str) -> dict:
    """Both sides of a ratio: the reference against the baseline's measured range, and the
    candidate's x at equal loss (ρ·x_ref) against the candidate's own; each side outside is a warning."""
    ref, axis, cand = row["at"], row["axis"], row["candidate"]
    cand_x = None if row["ratio"] is None else row["ratio"] * ref
    on_ref, on_cand = not _inside(ref, measured), cand_x is None or not _inside(cand_x, cand_range)
    if on_ref:
        warnings.warn(FitWarning(f"{arch_name(cand)} at {row['at_label']}: the reference extrapolates the "
                                 f"{arch_name(base)}'s curve beyond its measured {axis} range "
                                 f"{human(measured[0])}-{human(measured[1])}"))
    if on_cand and cand_x is not None:
        warnings.warn(FitWarning(f"{arch_name(cand)} at {row['at_label']}: the candidate's {axis} at equal loss, "
                                 f"{human(cand_x)}, lies outside its own measured range {human(cand_range[0])}-"
                                 f"{human(cand_range[1])}, so its curve is extrapolated"))
    return {"extrapolated": on_ref or on_cand, "extrapolated_reference": on_ref, "extrapolated_candidate": on_cand,
            "candidate_x": cand_x}


# -- fitting ----------------------------------------------------------------------------------

def _data(arch: Arch) -> Data:
    return Data(u=np.log(arch.x), y=np.log(arch.loss), v=np.log(np.maximum(arch.other, 1e-300)))


def _fit_all(archs: dict[str, Arch], form: str, objective: Objective, shared_e: bool) -> dict[str, LawFit]:
    if not shared_e:
        fit = fit_huber_mle if objective is Objective.HUBER_MLE else (lambda law, data: fit_law(law, data, objective))
        return {a: fit(Law(form), _data(arch)) for a, arch in archs.items()}
    if objective is Objective.HUBER_MLE:
        raise ConfigError("objective", "huber_mle fits one law per architecture; drop --shared-e or use l2/huber")
    names = list(archs)
    law = Law(form, n_groups=len(names), shared_e=True)
    group = np.concatenate([np.full(len(archs[a].x), g) for g, a in enumerate(names)])
    data = Data(u=np.log(np.concatenate([archs[a].x for a in names])),
                y=np.log(np.concatenate([archs[a].loss for a in names])), group=group)
    joint = fit_law(law, data, objective)
    return {a: joint for a in names}


def _diagnostic_warnings(fits: dict[str, LawFit]) -> None:
    """Each fit's ``LawFit.warnings`` (a joint fit's once, named as such)."""
    seen: list[LawFit] = []
    for arch, fit in fits.items():
        if any(fit is f for f in seen):
            continue
        seen.append(fit)
        who = arch_name(arch) if sum(f is fit for f in fits.values()) == 1 else "the joint fit"
        for message in fit.warnings(who):
            warnings.warn(FitWarning(message))


def _noise(archs: dict[str, Arch], fits: dict[str, LawFit], objective: Objective, req: FitRequest):
    groups = []
    for g, (a, arch) in enumerate(archs.items()):
        fit = fits[a]
        fitted = fit.fitted if not req.shared_e else fit.fitted[fit.data.group == g]
        # a joint fit's shared E is counted once, with the first architecture
        num_params = fit.law.group_params(g)
        groups.append(Group(np.log(arch.loss), fitted, arch.cell, num_params, robust=objective is not Objective.L2,
                            run=arch.run))
    try:
        noise = estimate_noise(groups, req.noise_sd, req.run_sd)
    except ValueError as exc:
        raise ConfigError("points", f"{exc}: add sizes or seeds, or give the noise with --noise-sd") from None
    if noise.warning:
        warnings.warn(FitWarning(noise.warning))
    return noise


def _bootstrap(archs: dict[str, Arch], fits: dict[str, LawFit], z: dict[str, np.ndarray]) -> dict[str, Curve]:
    first = next(iter(fits.values()))
    if all(f is first for f in fits.values()) and first.law.shared_e:  # one joint fit
        targets = first.fitted[None, :] + np.concatenate([z[a] for a in archs], axis=1)
        draws = first.refit(targets)
        return {a: Curve(first.law, first.theta, draws, g) for g, a in enumerate(archs)}
    return {a: Curve(fits[a].law, fits[a].theta, fits[a].refit(fits[a].fitted[None, :] + z[a])) for a in archs}


def _fit_summary(arch: Arch, fit: LawFit, curve: Curve, req: FitRequest, axis: str, other: float | None) -> dict:
    point = {k: float(v[0]) for k, v in curve.law.natural(curve.theta[None, :], curve.group).items()}
    draws = curve.law.natural(curve.draws, curve.group)
    ci = {}
    for k, v in draws.items():
        lo, hi, _ = interval(v[:, None], req.level)
        ci[k] = [float(lo[0]), float(hi[0])]
    grid = np.geomspace(arch.x.min() / 1.5, arch.x.max() * 2.0, 60)
    band = curve.loss(grid, other, axis, boot=True)
    b_lo, b_hi, _ = interval(band, req.level)
    cells = []
    fitted = np.exp(fit.fitted if not req.shared_e else fit.fitted[fit.data.group == curve.group])
    for c in np.unique(arch.cell):
        mask = arch.cell == c
        cells.append({"x": float(arch.x[mask][0]), "other": float(arch.other[mask][0]),
                      "loss": arch.loss[mask].tolist(), "fitted": float(fitted[mask][0]),
                      "residual": float(np.mean(np.log(arch.loss[mask]) - np.log(fitted[mask])))})
    return {"params": point, "ci": ci, "se": {k: float(np.std(v)) for k, v in draws.items()},
            "n_points": len(arch.x), "x_range": [float(arch.x.min()), float(arch.x.max())],
            "diagnostics": fit.diagnostics(), "points": cells,
            "band": {"x": grid.tolist(), "loss": _list(curve.loss(grid, other, axis)), "lo": _list(b_lo), "hi": _list(b_hi)}}


def _holdout(points: pd.DataFrame, req: FitRequest, axis: Axis) -> dict:
    """Refit without each architecture's largest size (or D) and predict it, with its CI."""
    if req.law_form.joint_nd:
        one_variable = " or ".join(f.name for f in law_forms() if not f.joint_nd)
        raise ConfigError("holdout", f"is for the one-variable laws (--form {one_variable})")
    col = "tokens" if axis is Axis.D else x_column(req)
    finals = points[points["point"] == "final"] if axis is Axis.N else points
    largest = finals.groupby("arch")[col].transform("max")
    held = finals[finals[col] >= largest]
    try:
        with warnings.catch_warnings():  # the reduced fit's caveats (its own ratios) are not this report's
            warnings.simplefilter("ignore", FitWarning)
            reduced = _analyse(points.drop(index=held.index), replace(req, holdout=False, at=(), axis=axis))
    except ConfigError as exc:
        raise ConfigError("holdout", f"too few points once the largest is held out ({exc.message})") from None
    x_axis = "N" if axis is Axis.N else "D"
    noise = reduced.noise
    # the quantile of the observation noise: Student's t when its sd is estimated (dof), else normal
    q = 1 - (1 - req.level) / 2
    quantile = float(t_dist.ppf(q, noise["dof"]) if noise.get("dof") else norm.ppf(q))
    out = {}
    for arch, curve in reduced.curves.items():
        rows = held[held["arch"] == arch]
        if req.tune:  # a tuned study's observation at the held-out size: its best candidate
            key = rows[list(req.tune)].astype(str).agg("|".join, axis=1)
            rows = rows[key == np.log(rows["loss"].astype(float)).groupby(key).mean().idxmin()]
        x, observed = float(rows[col].iloc[0]), float(rows["loss"].mean())
        predicted = float(curve.loss(np.array([x]), None, x_axis)[0])
        band = curve.loss(np.array([x]), None, x_axis, boot=True)
        band = band[np.isfinite(band[:, 0])]  # a draw whose curve is undefined there says nothing about the loss
        b_lo, b_hi, _ = interval(band, req.level)
        # The observed value is a mean of len(rows) runs, not the curve: the prediction interval
        # combines each side of the curve's band (log space) with the noise of that mean (run-level sd
        # over the runs averaged, plus the size-level sd), as independent errors.
        obs = quantile * float(np.sqrt(noise.get("between_sd", 0.0) ** 2 + noise["sd"] ** 2 / len(rows)))
        lo = [predicted * np.exp(-np.hypot(np.log(predicted / b_lo[0]), obs))]
        hi = [predicted * np.exp(np.hypot(np.log(b_hi[0] / predicted), obs)) if np.isfinite(b_hi[0]) else np.inf]
        out[arch] = {"x": x, "observed": observed, "runs": len(rows), "predicted": predicted,
                     "lo": float(lo[0]), "hi": float(hi[0]), "curve_lo": float(b_lo[0]), "curve_hi": float(b_hi[0]),
                     "error": predicted - observed, "relative_error": (predicted - observed) / observed,
                     "inside_prediction_interval": bool(lo[0] <= observed <= hi[0])}
    return {"held_out": "largest", "interval": "prediction", "predictions": out}


# -- helpers ----------------------------------------------------------------------------------

def _f(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def _list(a: np.ndarray) -> list:
    return [_f(v) for v in np.asarray(a, float)]
