"""Epoch AI's final estimator for approach 3: a Huber "likelihood" with a free scale.

Besiroglu et al. (2024, "Chinchilla Scaling: A replication attempt") report the maximum-likelihood
estimate under p(r) ∝ exp(-Huber_δ(r/σ))/σ for the log-loss residuals r, δ = 1e-3, with σ fitted
too, by BFGS from Hoffmann et al.'s unrounded values. The constant normaliser of the density does
not depend on the parameters, so the negative log-likelihood is Σ Huber_δ(r_i/σ) + n log σ.
Because the fitted σ is tiny (≈5e-6), almost every |r/σ| is far beyond δ and the estimator behaves
like least absolute deviations (docs/references.md §5.3).

Bootstrap draws are refitted on the summed Huber loss, as Epoch's bootstrap does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from diffsweep.scaling.fitting.fit import LawFit, fit_law
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.optimize import HUBER_DELTA, Data, Objective, Solution
from diffsweep.scaling.laws.chinchilla import HOFFMANN  # noqa: F401  (Epoch's start; tests use mle.HOFFMANN)


@dataclass(frozen=True)
class MleFit(LawFit):
    """A law fitted by the Huber likelihood; ``log_sigma`` is the fitted log scale."""

    log_sigma: float = 0.0
    log_likelihood: float = 0.0  # up to the density's constant normaliser

    def diagnostics(self) -> dict:
        return super().diagnostics() | {"log_sigma": self.log_sigma, "neg_log_likelihood": -self.log_likelihood}


def negative_log_likelihood(params: np.ndarray, law: Law, data: Data,
                            delta: float = HUBER_DELTA) -> tuple[float, np.ndarray]:
    """Σ Huber_δ(r/σ) + n log σ and its gradient; ``params`` is (θ..., log σ), r = y - ŷ."""
    theta, log_sigma = params[:-1], float(params[-1])
    pred, jac = data.predict(law, theta[None, :])
    sigma = np.exp(log_sigma)
    x = (data.y - pred[0]) / sigma
    inside = np.abs(x) <= delta
    huber = np.where(inside, 0.5 * x * x, delta * (np.abs(x) - 0.5 * delta))
    dhuber = np.where(inside, x, delta * np.sign(x))
    n = len(x)
    value = float(huber.sum() + n * log_sigma)
    grad = np.concatenate([jac[0].T @ (-dhuber / sigma), [n - float((dhuber * x).sum())]])
    return value, grad


def fit_huber_mle(law: Law, data: Data) -> MleFit:
    """Epoch's estimator: BFGS on the Huber likelihood from the best summed-Huber fit (approach 3,
    multi-start) and from the form's published estimates (the Chinchilla form: Hoffmann et al.'s
    values); the higher likelihood wins. Diagnostics keep the multi-start's counts."""
    grid = fit_law(law, data, Objective.HUBER)
    starts = [grid.theta] + law.definition.published_starts()
    return maximise(law, data, starts, grid.solution)


def maximise(law: Law, data: Data, starts: list[np.ndarray], grid: Solution | None = None) -> MleFit:
    """BFGS on the Huber likelihood from each start (σ starts at the mean |residual|); the best wins."""
    best = None
    for theta in starts:
        pred = data.predict(law, np.asarray(theta, float)[None, :])[0][0]
        scale = max(float(np.mean(np.abs(data.y - pred))), 1e-12)
        result = minimize(negative_log_likelihood, np.r_[theta, np.log(scale)], args=(law, data), jac=True,
                          method="BFGS", options={"gtol": 1e-10, "maxiter": 20000})
        if np.all(np.isfinite(result.x)) and (best is None or result.fun < best.fun):
            best = result
    assert best is not None, "the Huber likelihood is not finite at any start"
    lo, hi = law.bounds()
    theta = best.x[:-1]
    free = (theta > lo + 1e-9) & (theta < hi - 1e-9)
    _, grad = negative_log_likelihood(best.x, law, data)
    start = np.asarray(starts[0], float)
    solution = Solution(theta=theta, value=float(best.fun), start=grid.start if grid else start,
                        num_starts=grid.num_starts if grid else len(starts),
                        num_at_best=grid.num_at_best if grid else 1, grad_norm=float(np.linalg.norm(grad[:-1][free])),
                        on_bound=tuple(n for n, f in zip(law.names, free) if not f), equals_start=False,
                        converged=bool(best.success or np.linalg.norm(grad) < 1e-3))
    return MleFit(law=law, data=data, objective=Objective.HUBER_MLE, solution=solution,
                  log_sigma=float(best.x[-1]), log_likelihood=-float(best.fun))
