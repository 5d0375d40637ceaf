"""Compute-optimal allocation and token ratios from a fitted Chinchilla law L(N, D) = E + A/N^α + B/D^β.

With C ≈ 6ND, minimising L at fixed C gives (Hoffmann et al. 2022, approach 3)
N_opt(C) = G·(C/6)^a and D_opt(C) = G⁻¹·(C/6)^b, with a = β/(α+β), b = α/(α+β) and
G = (αA/(βB))^(1/(α+β)). Each output gets a percentile CI from the bootstrap draws.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diffsweep.config.units import human
from diffsweep.scaling.fitting.bootstrap import interval
from diffsweep.scaling.ratio import Curve, ratio

BUDGET_MULTIPLES = (1.0, 10.0, 100.0)  # compute budgets: the largest measured run's 6ND, and 10x, 100x it


def allocation(p: dict[str, np.ndarray], compute: np.ndarray) -> dict[str, np.ndarray]:
    """a, b, G (each (B,)) and N_opt, D_opt (B, k) at ``compute`` (k,) FLOPs for natural parameters ``p``."""
    total = p["alpha"] + p["beta"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a, b = p["beta"] / total, p["alpha"] / total
        g = (p["alpha"] * p["A"] / (p["beta"] * p["B"])) ** (1.0 / total)
        c6 = np.asarray(compute, float)[None, :] / 6.0
        n_opt = g[:, None] * c6 ** a[:, None]
        d_opt = c6 ** b[:, None] / g[:, None]
    return {"a": a, "b": b, "G": g, "N_opt": n_opt, "D_opt": d_opt}


def compute_optimal(curve: Curve, largest_compute: float, level: float) -> dict:
    """The fitted law's compute-optimal exponents and N_opt(C), D_opt(C) at stated budgets, with CIs."""
    budgets = np.array([largest_compute * m for m in BUDGET_MULTIPLES])
    point = allocation(curve.law.natural(curve.theta[None, :], curve.group), budgets)
    draws = allocation(curve.law.natural(curve.draws, curve.group), budgets)

    def summary(est: np.ndarray, d: np.ndarray) -> dict:
        lo, hi, _ = interval(d[:, None], level)
        finite = d[np.isfinite(d)]
        return {"value": _f(float(est)), "lo": _f(lo[0]), "hi": _f(hi[0]),
                "se": float(np.std(finite)) if finite.size > 1 else None}

    out: dict[str, Any] = {k: summary(point[k][0], draws[k]) for k in ("a", "b", "G")}
    out["budgets"] = []
    for i, (c, m) in enumerate(zip(budgets, BUDGET_MULTIPLES)):
        label = f"{c:.2g} FLOPs" + (" (largest measured run)" if m == 1 else f" ({m:g}x the largest run)")
        out["budgets"].append({"C": float(c), "label": label,
                               "N_opt": summary(point["N_opt"][0, i], draws["N_opt"][:, i]),
                               "D_opt": summary(point["D_opt"][0, i], draws["D_opt"][:, i])})
    return out


def token_ratios(base: Curve, cand: Curve, name: str, d_base: np.ndarray, d_cand: np.ndarray, n_ref: float,
                 level: float) -> list[dict]:
    """ρ_D rows ("axis": "D") from L(N, D) at N = ``n_ref`` (the largest N), at the baseline's largest
    measured D and the geometric mean of its D values, as ρ_N is read at the largest D."""
    distinct = np.unique(d_base)
    refs = np.array([float(distinct.max()), float(np.exp(np.log(distinct).mean()))])
    at_n = f"at N = {human(n_ref)}"
    labels = [f"{human(refs[0])} tokens (largest measured, {at_n})", f"{human(refs[1])} tokens (geometric mean, {at_n})"]
    point = ratio(base, cand, refs, n_ref, "D")
    lo, hi, undefined = interval(ratio(base, cand, refs, n_ref, "D", boot=True), level)
    rows = []
    tiny = 1e-9
    for k, ref in enumerate(refs):
        ext_ref = not distinct.min() * (1 - tiny) <= ref <= distinct.max() * (1 + tiny)
        cand_x = point[k] * ref if np.isfinite(point[k]) else None
        ext_cand = cand_x is None or not d_cand.min() * (1 - tiny) <= cand_x <= d_cand.max() * (1 + tiny)
        rows.append({"candidate": name, "axis": "D", "at": float(ref), "at_label": labels[k], "other": float(n_ref),
                     "ratio": _f(point[k]), "lo": _f(lo[k]), "hi": _f(hi[k]), "undefined_share": float(undefined[k]),
                     "extrapolated": bool(ext_ref or ext_cand), "extrapolated_reference": bool(ext_ref),
                     "extrapolated_candidate": bool(ext_cand), "candidate_x": cand_x, "pure_law": None})
    return rows


def _f(v: float) -> float | None:
    v = float(v)
    return v if np.isfinite(v) else None
