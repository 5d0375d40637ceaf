"""The pure power law L = A·x^-α (Kaplan et al. 2020: no irreducible loss), in N or D.

Linear in log space (log L = a - α log x), so it has one optimum: one start (least squares) and
no extra starts for the bootstrap refits. The DIFF paper read its ratios off this law.
"""

from __future__ import annotations

import numpy as np

from diffsweep.scaling.fitting.optimize import Shaped
from diffsweep.scaling.laws.base import Fitted, LawForm, coefficient, exponent, ols


class PureLaw(LawForm):
    """L = A·x^-α."""

    name = "pure"
    params = (coefficient("a"), exponent("alpha", "α"))
    formula = "L = A·{x}^-α"
    words = "a pure power law (Kaplan-style)"

    def predict(self, law: Shaped, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None,
                group: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        jac = np.zeros((theta.shape[0], u.shape[0], law.num_params))
        log_loss = theta[:, :1] - theta[:, 1:2] * u
        jac[:, :, 0] = 1.0
        jac[:, :, 1] = -u
        return log_loss, jac

    def starts(self, law: Shaped, u: np.ndarray, y: np.ndarray, v: np.ndarray | None,
               group: np.ndarray | None) -> np.ndarray:
        alpha, a = ols(u, y)
        return np.array([[a, max(alpha, 0.0)]])

    def refit_starts(self, fit: Fitted, targets: np.ndarray) -> np.ndarray | None:
        # linear least squares in log space: one optimum, the warm start reaches it
        return np.empty((targets.shape[0], 0, fit.law.num_params))

    def along(self, p: dict[str, np.ndarray], other: float | None, axis: str) -> tuple[np.ndarray, ...]:
        return np.zeros_like(p["A"]), p["A"], p["alpha"]
