"""The joint "size-multiplier" model: one ρ shared by all sizes (docs/references.md §3).

L_cand(x) = L_base(x/ρ) with the offset law L_base(x) = E + A·x^-α: four parameters (e, a, α, log ρ)
for both architectures, against six for separate fits. When the curves really are parallel it
pins ρ far better than separate fits (CI width 0.096 against 0.22 at 11B on the notes' design);
when they are not, it reports a wrong number (0.734 for a true 0.711–0.558). So it is tested first:
a likelihood-ratio (F) test and AIC against the separate fits say whether one number summarises
the ladder at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2
from scipy.stats import f as f_dist

from diffsweep.scaling.fitting.bootstrap import interval
from diffsweep.scaling.fitting.fit import LawFit
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.optimize import Data, Objective, solve_batch
from diffsweep.scaling.laws.base import EXPONENT, LOG_COEF, LOG_E

SUPPORT_P = 0.05  # a single ρ is "supported" unless the test rejects it at 5%
_LOG_RHO = (-12.0, 12.0)
_RHO_STARTS = (-1.5, -0.75, -0.25, 0.0, 0.25, 0.75, 1.5)


@dataclass(frozen=True)
class ShiftLaw:
    """The offset law of the baseline (group 0) and the candidate (group 1) at x/ρ; duck-types ``Law``."""

    names: tuple[str, ...] = ("e", "a", "alpha", "log_rho")

    @property
    def num_params(self) -> int:
        return 4

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = (LOG_E, LOG_COEF, EXPONENT, _LOG_RHO)
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    def predict(self, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None = None,
                group: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        assert group is not None
        g = group.astype(float)[None, :]
        e, a, alpha, log_rho = (theta[:, i:i + 1] for i in range(4))
        shifted = u[None, :] - g * log_rho
        power = a - alpha * shifted
        log_loss = np.logaddexp(e, power)
        w_e, w_p = np.exp(e - log_loss), np.exp(power - log_loss)
        jac = np.stack([w_e, w_p, -shifted * w_p, g * alpha * w_p], axis=2)
        return log_loss, jac

    def starts(self, u: np.ndarray, y: np.ndarray, v: np.ndarray | None = None,
               group: np.ndarray | None = None) -> np.ndarray:
        assert group is not None
        base = Law("offset").starts(u[group == 0], y[group == 0])
        return np.array([[*row, r] for row in base for r in _RHO_STARTS])


def shift_model(base: LawFit, cand: LawFit, noise: dict, z_base: np.ndarray | None, z_cand: np.ndarray | None,
                level: float, w_base: np.ndarray | None = None, w_cand: np.ndarray | None = None) -> dict:
    """Fit the shift model to two separate least-squares offset fits' data and test it against them.

    Draws: parametric noise ``z_*`` (B, n) added to the shift model's fitted values (the same draws
    as the separate fits), or case/cluster weights ``w_*`` (B, n). Returns the contract's dict.
    Least squares on the points equals least squares on each size's mean weighted by its count plus
    the within-size sum, so the model is fitted to the (few) size means: seeds cost nothing."""
    law = ShiftLaw()
    u = np.concatenate([base.data.u, cand.data.u])
    y = np.concatenate([base.data.y, cand.data.y])
    group = np.concatenate([np.zeros(len(base.data.u), int), np.ones(len(cand.data.u), int)])
    keys, cell = np.unique(np.column_stack([u, group]), axis=0, return_inverse=True)
    cell = cell.ravel()
    k = len(keys)
    count = np.bincount(cell, minlength=k).astype(float)
    mean = np.bincount(cell, weights=y, minlength=k) / count
    data = Data(u=keys[:, 0], y=mean, group=keys[:, 1].astype(int))
    within = float(((y - mean[cell]) ** 2).sum())

    starts = law.starts(data.u, data.y, group=data.group)
    refined, values = solve_batch(law, data, starts, Objective.L2, max_iter=200,
                                  weights=np.broadcast_to(count, (len(starts), k)))
    theta = refined[int(np.nanargmin(np.where(np.isfinite(values), values, np.inf)))]
    theta, value = solve_batch(law, data, theta[None, :], Objective.L2, max_iter=500, tol=1e-15,
                               weights=count[None, :])
    theta = theta[0]
    rss_shift = 2.0 * float(value[0]) + within
    rss_sep = 2.0 * (base.solution.value + cand.solution.value)
    n, k_shift, k_sep = len(y), law.num_params, base.law.num_params + cand.law.num_params
    df = k_sep - k_shift
    extra = max(rss_shift - rss_sep, 0.0)
    # The variance the extra residual sum carries: run-to-run, plus a size-level component counted
    # once per run of a size (it moves all seeds of a size together).
    sigma2 = noise["sd"] ** 2 + (n / k) * noise.get("between_sd", 0.0) ** 2
    stat = extra / max(sigma2, 1e-300)
    if noise["source"] == "given" or noise.get("dof") is None:
        p_value = float(chi2.sf(stat, df))
    else:  # the noise sd is estimated (seeds or residuals): an F-test with its degrees of freedom
        p_value = float(f_dist.sf(stat / df, df, noise["dof"]))
    aic_shift = n * np.log(max(rss_shift, 1e-300) / n) + 2 * k_shift
    aic_sep = n * np.log(max(rss_sep, 1e-300) / n) + 2 * k_sep

    fitted = data.predict(law, theta[None, :])[0][0]
    if w_base is not None and w_cand is not None:  # case/cluster: a draw's count and mean per size
        w = np.concatenate([w_base, w_cand], axis=1)
        weights = np.stack([np.bincount(cell, weights=row, minlength=k) for row in w])
        sums = np.stack([np.bincount(cell, weights=row * y, minlength=k) for row in w])
        targets = np.where(weights > 0, sums / np.maximum(weights, 1e-300), fitted[None, :])
    else:
        assert z_base is not None and z_cand is not None
        z = np.concatenate([z_base, z_cand], axis=1)
        weights = np.broadcast_to(count, (z.shape[0], k))
        targets = fitted[None, :] + np.stack([np.bincount(cell, weights=row, minlength=k) for row in z]) / count
    start = np.repeat(theta[None, :], targets.shape[0], axis=0)
    draws, _ = solve_batch(law, data, start, Objective.L2, y=targets, max_iter=200, weights=weights)
    lo, hi, _ = interval(np.exp(draws[:, 3:4]), level)
    return {"rho": float(np.exp(theta[3])), "lo": float(lo[0]), "hi": float(hi[0]),
            "lr_stat": float(stat), "df": int(df), "p_value": p_value,
            "aic_shift": float(aic_shift), "aic_separate": float(aic_sep),
            "supported": bool(p_value >= SUPPORT_P),
            "params": {"E": float(np.exp(theta[0])), "A": float(np.exp(theta[1])), "alpha": float(theta[2])}}
