"""The offset law L = E + A·x^-α (the default; Chinchilla-style irreducible loss) in N or D.

In log space log L = LSE(e, a - α log x) (Hoffmann et al. 2022, approach 3's parameterisation).
It is the one form that can share E across architectures (``--shared-e``): θ is then
(e, a0, alpha0, a1, alpha1, ...).
"""

from __future__ import annotations

import numpy as np

from diffsweep.scaling.fitting.optimize import Shaped, penalty
from diffsweep.scaling.laws.base import (
    EXPONENT,
    LOG_E,
    Fitted,
    LawForm,
    coefficient,
    exponent,
    ols,
)

# The start grid: E at these fractions of the lowest loss (0: far below it), then for each the
# rest is a line in log-log space (variable projection in spirit, Czech et al.), plus these exponents.
START_FRACTIONS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98)
START_ALPHAS = (0.05, 0.15, 0.3, 0.5, 1.0)


class OffsetLaw(LawForm):
    """L = E + A·x^-α."""

    name = "offset"
    params = (coefficient("e", LOG_E), coefficient("a"), exponent("alpha", "α"))
    formula = "L = E + A·{x}^-α"
    words = "a power law with an irreducible loss"
    shared_e = True
    pure_comparison = True
    shift_model = True

    def predict(self, law: Shaped, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None,
                group: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        batch, n = theta.shape[0], u.shape[0]
        jac = np.zeros((batch, n, law.num_params))
        if law.shared_e:  # each point's own group's (a, α) columns
            assert group is not None
            a_col, alpha_col = 1 + 2 * group, 2 + 2 * group
        else:
            a_col, alpha_col = np.ones(n, int), np.full(n, 2)
        rows = np.arange(n)
        e = theta[:, :1]
        power = theta[:, a_col] - theta[:, alpha_col] * u
        log_loss = np.logaddexp(e, power)
        w_e, w_power = np.exp(e - log_loss), np.exp(power - log_loss)
        jac[:, :, 0] = w_e
        jac[:, rows, a_col] = w_power
        jac[:, rows, alpha_col] = -u * w_power
        return log_loss, jac

    def starts(self, law: Shaped, u: np.ndarray, y: np.ndarray, v: np.ndarray | None,
               group: np.ndarray | None) -> np.ndarray:
        loss = np.exp(y)
        groups = np.zeros(len(u), int) if group is None else group
        n_groups = law.n_groups if law.shared_e else 1
        floor = loss.min()
        starts = []
        for fraction in START_FRACTIONS:
            e = np.log(fraction * floor) if fraction > 0 else np.log(floor) - 8.0
            row = [e]
            for g in range(n_groups):
                mask = groups == g
                alpha, a = ols(u[mask], np.log(np.maximum(loss[mask] - fraction * floor, 1e-12)))
                row += [a, float(np.clip(alpha, 0.0, EXPONENT[1]))]
            starts.append(row)
            for alpha in START_ALPHAS:
                row = [e]
                for g in range(n_groups):
                    mask = groups == g
                    resid = np.log(np.maximum(loss[mask] - fraction * floor, 1e-12))
                    row += [float(np.mean(resid + alpha * u[mask])), alpha]
                starts.append(row)
        return np.array(starts)

    def refit_starts(self, fit: Fitted, targets: np.ndarray) -> np.ndarray | None:
        """One law per architecture: the best start of the E-fraction grid for each draw's own
        values (vectorised over draws); a joint (shared-E) fit: the estimate's basins."""
        if fit.law.shared_e:
            return None
        return grid_best(fit, targets)[:, None, :]

    def along(self, p: dict[str, np.ndarray], other: float | None, axis: str) -> tuple[np.ndarray, ...]:
        return p["E"], p["A"], p["alpha"]


def grid_best(fit: Fitted, targets: np.ndarray, chunk: int = 256) -> np.ndarray:
    """The start grid (as ``OffsetLaw.starts``) for each draw, vectorised: (B, p), the start with
    the lowest objective per draw. Scored on the mean log loss per distinct x (weighted by its
    count): the same ranking for least squares, at the cost of the sizes rather than the points."""
    uniq, inv = np.unique(fit.data.u, return_inverse=True)
    counts = np.bincount(inv.ravel()).astype(float)
    y = (targets @ np.eye(len(uniq))[inv.ravel()]) / counts  # (B, m) mean log loss per x
    b = len(y)
    loss = np.exp(y)
    floor = loss.min(axis=1)
    w = counts / counts.sum()
    mean_u = float(w @ uniq)
    uc = uniq - mean_u
    alpha_hi = fit.law.bounds()[1][fit.law.names.index("alpha")]
    rows = []
    for fraction in START_FRACTIONS:
        e = np.log(fraction * floor) if fraction > 0 else np.log(floor) - 8.0
        resid = np.log(np.maximum(loss - fraction * floor[:, None], 1e-12))
        slope = resid @ (w * uc) / max(float(w @ uc ** 2), 1e-300)
        intercept = resid @ w - slope * mean_u
        rows.append(np.stack([e, intercept, np.clip(-slope, 0.0, alpha_hi)], axis=1))
        for alpha in START_ALPHAS:
            rows.append(np.stack([e, (resid + alpha * uniq) @ w, np.full(b, alpha)], axis=1))
    grid = np.stack(rows, axis=1)  # (B, S, 3)
    s = grid.shape[1]
    best = np.empty((b, 3))
    for i in range(0, b, chunk):
        g = grid[i:i + chunk]
        pred, _ = fit.law.predict(g.reshape(-1, 3), uniq)
        values = (penalty(fit.objective, pred.reshape(len(g), s, -1) - y[i:i + chunk, None, :]) * counts).sum(axis=2)
        best[i:i + chunk] = g[np.arange(len(g)), np.argmin(np.where(np.isfinite(values), values, np.inf), axis=1)]
    return best

