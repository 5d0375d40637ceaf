"""One law fitted to one set of points: the estimate, its diagnostics and refits of bootstrap draws."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.optimize import (
    Data,
    Objective,
    Solution,
    multistart,
    solve_batch,
)

FEW_AT_BEST = (3, 0.05)  # fewer starts than this (count, or share of a grid of >= 10) reaching the best value
NEAR_SINGULAR = 0.99999  # |correlation| of two parameters above which the data cannot tell them apart


@dataclass(frozen=True)
class LawFit:
    """``law`` fitted to ``data`` by ``objective``: the multi-start solution and its residuals."""

    law: Law
    data: Data
    objective: Objective
    solution: Solution

    @property
    def theta(self) -> np.ndarray:
        return self.solution.theta

    @property
    def fitted(self) -> np.ndarray:
        """Fitted log loss at the data points."""
        return self.data.predict(self.law, self.theta[None, :])[0][0]

    @property
    def residuals(self) -> np.ndarray:
        """Observed minus fitted log loss (≈ relative loss error)."""
        return self.data.y - self.fitted

    @property
    def dof(self) -> int:
        return len(self.data.y) - self.law.num_params

    def correlation(self) -> np.ndarray:
        """Parameter correlations from the Gauss-Newton curvature JᵀJ (log-space parameters)."""
        _, jac = self.data.predict(self.law, self.theta[None, :])
        cov = np.linalg.pinv(jac[0].T @ jac[0])
        sd = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
        return np.clip(cov / np.outer(sd, sd), -1.0, 1.0)

    def refit(self, targets: np.ndarray) -> np.ndarray:
        """Refit every row of ``targets`` (B, n log losses): (B, p).

        Each draw is refitted from the estimate (warm start) and from the extra starts the law's
        form gives for that draw (``LawForm.refit_starts``: for the offset law, the best start of
        its E-fraction grid for the draw's own values), by default the grid start and other local
        optima the estimate's search found, keeping the best. Warm-started alone, ~20% of draws on
        5 noisy sizes stopped in the estimate's basin while their optimum lay in another (E -> 0,
        or E near the floor), up to 300x worse in objective (tests/scaling/test_bootstrap.py)."""
        b = targets.shape[0]
        extra = self.law.definition.refit_starts(self, targets)
        if extra is None:
            basins = self.solution.basins if self.solution.basins is not None else self.solution.start[None, :]
            extra = np.repeat(basins[None], b, axis=0)
        starts = np.concatenate([np.repeat(self.theta[None, None, :], b, axis=0), extra], axis=1)
        k = starts.shape[1]
        data, weight = self.data, None
        if self.objective is Objective.L2:  # replicate points (seeds) -> their means, weighted: same minimiser
            data, weight, targets = self._collapsed(targets)
        theta, value = solve_batch(self.law, data, starts.reshape(b * k, -1), self.objective,
                                   y=np.repeat(targets, k, axis=0), max_iter=100, weights=weight)
        value = np.where(np.isfinite(value), value, np.inf).reshape(b, k)
        return theta.reshape(b, k, -1)[np.arange(b), np.argmin(value, axis=1)]

    def _collapsed(self, targets: np.ndarray) -> tuple[Data, np.ndarray, np.ndarray]:
        """The data with replicate points (same u, v, group) merged: means and counts."""
        d = self.data
        keys = np.column_stack([d.u, np.zeros_like(d.u) if d.v is None else d.v,
                                np.zeros_like(d.u) if d.group is None else d.group])
        uniq, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inv = inv.ravel()
        counts = np.bincount(inv).astype(float)
        merged = Data(u=d.u[first], y=np.bincount(inv, d.y) / counts, v=None if d.v is None else d.v[first],
                      group=None if d.group is None else d.group[first])
        return merged, counts, (targets @ np.eye(len(uniq))[inv]) / counts

    def diagnostics(self) -> dict:
        s = self.solution
        return {
            "objective": self.objective.value,
            "value": s.value,
            "starts": s.num_starts,
            "starts_at_best": s.num_at_best,
            "on_bound": list(s.on_bound),
            "equals_start": s.equals_start,
            "grad_norm": s.grad_norm,
            "converged": s.converged,
            "residual_sd": float(np.sqrt(np.mean(self.residuals ** 2))),
            "max_abs_residual": float(np.max(np.abs(self.residuals))),
            "dof": self.dof,
            "correlation": {"names": list(self.law.names), "matrix": self.correlation().round(4).tolist()},
        }


    def warnings(self, who: str) -> list[str]:
        """What the diagnostics show that a reader must not miss, said of ``who``: a parameter on its
        bound, few starts at the optimum, a near-singular fit."""
        out = []
        s, lo = self.solution, self.law.bounds()[0]
        for i, name in enumerate(self.law.names):
            if name not in s.on_bound:
                continue
            side = "lower" if s.theta[i] <= lo[i] + 1e-9 else "upper"
            param = self.law.param(name)
            value = float(np.exp(s.theta[i])) if param.log else float(s.theta[i])
            out.append(f"{who}: the fitted {param.label} sits on its {side} bound ({value:.2g}), so the law is not "
                       f"identified by these points and every ratio using it rests on a boundary fit")
        if s.num_starts >= 10 and (s.num_at_best < FEW_AT_BEST[0] or s.num_at_best < FEW_AT_BEST[1] * s.num_starts):
            out.append(f"{who}: only {s.num_at_best} of {s.num_starts} starts reached the best fit, so the optimum "
                       f"is fragile (another start could find a different law)")
        corr = np.abs(self.correlation())
        np.fill_diagonal(corr, 0.0)  # pairs only (a degenerate direction's own entry can read -1)
        if corr.max() > NEAR_SINGULAR:
            i, j = (int(k) for k in np.unravel_index(np.argmax(corr), corr.shape))
            out.append(f"{who}: near-singular fit ({self.law.names[i]} and {self.law.names[j]} have |correlation| "
                       f"{corr.max():.6f}), so those parameters are not separately determined")
        return out


def fit_law(law: Law, data: Data, objective: Objective = Objective.L2) -> LawFit:
    """Best fit of ``law`` to ``data`` from its grid of starts."""
    return LawFit(law=law, data=data, objective=objective, solution=multistart(law, data, objective))
