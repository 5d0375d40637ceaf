"""The Chinchilla law L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022, approach 3).

In log space log L = LSE(e, a - α log N, b - β log D). Fitted against N with D as a second
input; read along N at a fixed D (ρ_N) or along D at a fixed N (ρ_D), and it gives the
compute-optimal allocation at C ≈ 6ND (``diffsweep.scaling.compute_optimal``).
"""

from __future__ import annotations

from itertools import product

import numpy as np

from diffsweep.scaling.choices import Objective
from diffsweep.scaling.fitting.optimize import Shaped
from diffsweep.scaling.laws.base import LOG_E, LawForm, coefficient, exponent

# Hoffmann et al. (2022) approach 3, unrounded from the paper's TeX source (as Epoch uses them):
# log-space (e, a, b, α, β).
HOFFMANN = np.array([0.5267228, 6.0073404, 6.0179186, 0.33917084, 0.2849083])


class ChinchillaLaw(LawForm):
    """L(N, D) = E + A/N^α + B/D^β."""

    name = "chinchilla"
    params = (coefficient("e", LOG_E), coefficient("a"), coefficient("b"), exponent("alpha", "α"),
              exponent("beta", "β"))
    formula = "L = E + A/N^α + B/D^β"
    words = "the Chinchilla law in parameters and tokens"
    joint_nd = True
    default_objective = Objective.HUBER  # Hoffmann et al.'s and Epoch AI's objective for this law
    compute_optimal = True

    def predict(self, law: Shaped, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None,
                group: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        assert v is not None, "the Chinchilla law needs log D"
        batch, n = theta.shape[0], u.shape[0]
        terms = (np.broadcast_to(theta[:, :1], (batch, n)),
                 theta[:, 1:2] - theta[:, 3:4] * u,
                 theta[:, 2:3] - theta[:, 4:5] * v)
        # log-sum-exp of the three terms, and each term's share exp(term - log L) as the Jacobian
        # (written in place: this runs for every start of the 4,500-start grid at every iteration)
        top = np.maximum(np.maximum(terms[0], terms[1]), terms[2])
        total = np.exp(terms[0] - top)
        total += np.exp(terms[1] - top)
        total += np.exp(terms[2] - top)
        log_loss = np.log(total)
        log_loss += top
        jac = np.empty((batch, n, law.num_params))
        for i, term in enumerate(terms):
            np.exp(term - log_loss, out=jac[:, :, i])
        np.multiply(jac[:, :, 1], -u, out=jac[:, :, 3])
        np.multiply(jac[:, :, 2], -v, out=jac[:, :, 4])
        return log_loss, jac

    def starts(self, law: Shaped, u: np.ndarray, y: np.ndarray, v: np.ndarray | None,
               group: np.ndarray | None) -> np.ndarray:
        # Hoffmann et al.'s grid (4,500 starts): α, β ∈ {0, .5, .., 2}, e ∈ {-1, -.5, .., 1}, a, b ∈ {0, 5, .., 25}
        grid = product(np.arange(-1, 1.01, 0.5), np.arange(0, 26, 5), np.arange(0, 26, 5),
                       np.arange(0, 2.01, 0.5), np.arange(0, 2.01, 0.5))
        return np.array(list(grid), dtype=float)

    def published_starts(self) -> list[np.ndarray]:
        return [HOFFMANN]

    def along(self, p: dict[str, np.ndarray], other: float | None, axis: str) -> tuple[np.ndarray, ...]:
        assert other is not None, "the Chinchilla law is read along one axis at a fixed value of the other"
        if axis == "N":
            return p["E"] + p["B"] * other ** -p["beta"], p["A"], p["alpha"]
        return p["E"] + p["A"] * other ** -p["alpha"], p["B"], p["beta"]

    def loss_at(self, p: dict[str, np.ndarray], x: np.ndarray, other: float | None, axis: str) -> np.ndarray:
        # the three terms summed in the law's own order (not floor + term: the same value, but
        # rounded differently, and fit.json is compared byte for byte across versions)
        n, d = (x, other) if axis == "N" else (other, x)
        return (p["E"][:, None] + p["A"][:, None] * n ** -p["alpha"][:, None]
                + p["B"][:, None] * d ** -p["beta"][:, None])

