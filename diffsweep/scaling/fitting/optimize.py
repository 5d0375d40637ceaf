"""Fitting a law: objectives, a batched Levenberg-Marquardt solver and a multi-start search.

Two solvers, each with one job:

- ``solve_batch`` refines many parameter vectors at once (every start of a grid, or every
  bootstrap draw warm-started at the estimate): a Levenberg-Marquardt step per row, vectorised
  with numpy, with iteratively re-weighted least squares for the Huber objective. This is what
  makes 1,000 bootstrap refits take a fraction of a second.
- ``multistart`` runs it over the starting grid and then polishes the best distinct solutions
  with scipy's L-BFGS-B at tight tolerances (SciPy's default ``ftol`` is relative to max(|f|, 1)
  and stops early on objectives ~1e-3; see docs/references.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
from scipy.optimize import minimize

# Objective's home is the numpy-free choices module (the CLI's options); re-exported here
from diffsweep.scaling.choices import Objective

HUBER_DELTA = 1e-3  # Hoffmann et al. 2022, approach 3
BLOCK_ELEMENTS = 65_536  # rows x points refined at once by solve_batch (a 2.5 MiB Jacobian for 5 parameters)


class Predicts(Protocol):
    """What the local solver needs of a law: its bounds and its prediction with the Jacobian
    (a registered form's ``Law``, or the joint size-multiplier model of shift.py)."""

    def bounds(self) -> tuple[np.ndarray, np.ndarray]: ...

    def predict(self, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None = None,
                group: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]: ...


class Shaped(Predicts, Protocol):
    """What the multi-start search and the law forms need of a ``Law`` (``diffsweep.scaling.fitting.forms``,
    which imports the forms, so they name this instead): θ's columns, their grouping, its starts."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def n_groups(self) -> int: ...

    @property
    def shared_e(self) -> bool: ...

    @property
    def num_params(self) -> int: ...

    def starts(self, u: np.ndarray, y: np.ndarray, v: np.ndarray | None = None,
               group: np.ndarray | None = None) -> np.ndarray: ...
MAX_BASINS = 2  # local optima of the grid besides the best kept as extra bootstrap starts


def penalty(objective: Objective, r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    if objective is Objective.L2:
        return 0.5 * r * r
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _weight(objective: Objective, r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    """IRLS weights: penalty'(r)/r (1 for least squares)."""
    if objective is Objective.L2:
        return np.ones_like(r)
    return np.minimum(1.0, delta / np.maximum(np.abs(r), 1e-300))


@dataclass(frozen=True)
class Data:
    """What a law is fitted to: u = log x (or log N), v = log D, y = log loss, group index."""

    u: np.ndarray
    y: np.ndarray
    v: np.ndarray | None = None
    group: np.ndarray | None = None

    def predict(self, law: Predicts, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return law.predict(theta, self.u, self.v, self.group)


def objective_value(law: Predicts, data: Data, theta: np.ndarray, objective: Objective,
                    y: np.ndarray | None = None) -> np.ndarray:
    log_loss, _ = data.predict(law, np.atleast_2d(theta))
    return penalty(objective, log_loss - (data.y if y is None else y)).sum(axis=1)


def solve_batch(law: Predicts, data: Data, theta: np.ndarray, objective: Objective, y: np.ndarray | None = None,
                max_iter: int = 200, tol: float = 1e-13,
                weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Refine each row of ``theta`` (B, p) against ``y`` (n,) or per-row targets (B, n).

    ``weights`` (n,) or (B, n) multiply each point's penalty: least squares on the means of
    replicate points weighted by their number has the same minimiser as on the points, and a
    case-resampling draw is the data with each point counted as often as it was drawn.
    Returns the refined parameters and their objective values (B,).

    Rows are independent, and refined a block at a time: a block's (rows, n, p) Jacobian stays
    in the CPU's cache (the 4,500-start Chinchilla grid on 240 points: 11.3 CPU-s in one block,
    5.6 in blocks of 256 rows, the same bits; analysis/benchmarks/RESULTS.md)."""
    theta = np.atleast_2d(np.asarray(theta, float))
    rows = max(1, BLOCK_ELEMENTS // max(len(data.u), 1))
    target = data.y if y is None else np.asarray(y, float)
    count = None if weights is None else np.asarray(weights, float)
    thetas, values = [], []
    for i in range(0, theta.shape[0], rows):
        block = slice(i, i + rows)
        t, f = _solve_block(law, data, theta[block], objective, target if target.ndim == 1 else target[block],
                            count if count is None or count.ndim == 1 else count[block], max_iter, tol)
        thetas.append(t)
        values.append(f)
    if not thetas:
        return theta.copy(), np.zeros(0)
    return np.concatenate(thetas), np.concatenate(values)


def _solve_block(law: Predicts, data: Data, theta: np.ndarray, objective: Objective, target: np.ndarray,
                 count: np.ndarray | None, max_iter: int, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """``solve_batch`` on one block of rows. The rows still refining are kept together
    (compacted when some finish), so that an iteration costs what its active rows cost."""
    lo, hi = law.bounds()
    theta = np.clip(theta, lo, hi)
    batch, p = theta.shape
    log_loss, jac = data.predict(law, theta)
    r = log_loss - target
    f = _weighted(penalty(objective, r), count).sum(axis=1)
    out_theta, out_f = theta.copy(), f.copy()
    rows = np.arange(batch)  # the rows of the output that the working arrays hold
    damping = np.full(batch, 1e-3)
    on_diagonal = np.arange(p)
    least_squares = objective is Objective.L2  # every IRLS weight is 1: W is the points' counts
    for _ in range(max_iter):
        if rows.size == 0:
            break
        if least_squares:
            jw_t = (jac if count is None else jac * count[..., None]).transpose(0, 2, 1)
        else:
            jw_t = (jac * _weighted(_weight(objective, r), count)[:, :, None]).transpose(0, 2, 1)
        grad = (jw_t @ r[:, :, None])[:, :, 0]
        lhs = jw_t @ jac
        diag = lhs[:, on_diagonal, on_diagonal]  # a copy: JᵀWJ's diagonal before damping
        lhs[:, on_diagonal, on_diagonal] += damping[:, None] * (diag + 1e-12)
        try:
            step = -np.linalg.solve(lhs, grad[:, :, None])[:, :, 0]
        except np.linalg.LinAlgError:
            step = -grad / (diag + 1e-12)
        trial = np.clip(theta + step, lo, hi)
        t_log_loss, t_jac = data.predict(law, trial)
        t_r = t_log_loss - target
        t_f = _weighted(penalty(objective, t_r), count).sum(axis=1)
        better = np.isfinite(t_f) & (t_f <= f)
        gain = np.where(better, f - t_f, 0.0)
        moved = np.abs(trial - theta).max(axis=1)
        if better.all():
            theta, f, r, jac = trial, t_f, t_r, t_jac
            damping = np.maximum(damping * 0.3, 1e-12)
        else:
            np.copyto(theta, trial, where=better[:, None])  # in place: the working arrays are this loop's own
            np.copyto(f, t_f, where=better)
            np.copyto(r, t_r, where=better[:, None])
            np.copyto(jac, t_jac, where=better[:, None, None])
            damping = np.where(better, np.maximum(damping * 0.3, 1e-12), damping * 8.0)
        converged = (better & ((gain <= tol * np.maximum(f, 1e-300)) | (moved < 1e-12))) | (damping > 1e12)
        if converged.any():
            out_theta[rows[converged]], out_f[rows[converged]] = theta[converged], f[converged]
            keep = ~converged
            rows, theta, f, r, jac, damping = rows[keep], theta[keep], f[keep], r[keep], jac[keep], damping[keep]
            if target.ndim == 2:
                target = target[keep]
            if count is not None and count.ndim == 2:
                count = count[keep]
    out_theta[rows], out_f[rows] = theta, f
    return out_theta, out_f


def _weighted(values: np.ndarray, count: np.ndarray | None) -> np.ndarray:
    return values if count is None else values * count


@dataclass(frozen=True)
class Solution:
    """The best fit of a multi-start search, with what is needed to judge it."""

    theta: np.ndarray  # (p,)
    value: float
    start: np.ndarray  # the grid start that led to it
    num_starts: int
    num_at_best: int  # starts whose refined objective is within 1e-6 (relative) of the best
    grad_norm: float
    on_bound: tuple[str, ...]  # parameters sitting on a box constraint
    equals_start: bool  # the optimiser never moved away from its start
    converged: bool
    # the grid start and other local optima (distinct basins, best first) the grid reached: the
    # bootstrap refits each draw from these too (a warm start alone misses the basin a draw's
    # optimum is in, e.g. E -> 0, in ~20% of draws on 5 noisy sizes)
    basins: np.ndarray | None = None


def multistart(law: Shaped, data: Data, objective: Objective, polish: int | None = None) -> Solution:
    """Best fit from the law's starting grid: batched refinement, then L-BFGS-B polishing of the
    ``polish`` best distinct solutions (default: 1 for least squares, where Gauss-Newton has
    already converged; 5 for the L1-like Huber objective, whose refinement is slower)."""
    if polish is None:
        polish = 1 if objective is Objective.L2 else 5
    starts = law.starts(data.u, data.y, data.v, data.group)
    refined, values = solve_batch(law, data, starts, objective, max_iter=80)
    values = np.where(np.isfinite(values), values, np.inf)
    order = np.argsort(values)
    lo, hi = law.bounds()
    best: tuple[float, np.ndarray, np.ndarray, bool] | None = None
    tried: list[np.ndarray] = []
    for i in order:
        if len(tried) >= polish or not np.isfinite(values[i]):
            break
        if any(np.allclose(refined[i], t, rtol=1e-6, atol=1e-8) for t in tried):
            continue
        tried.append(refined[i])
        result = minimize(_value_and_grad, refined[i], args=(law, data, objective), jac=True, method="L-BFGS-B",
                          bounds=list(zip(lo, hi)),
                          options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 20000, "maxfun": 40000})
        theta, value = (result.x, float(result.fun)) if result.fun <= values[i] else (refined[i], float(values[i]))
        if best is None or value < best[0]:
            best = (value, theta, starts[i], bool(result.success))
    assert best is not None, "no finite objective at any start"
    value, theta, start, success = best
    basins = [start]
    for i in order:
        if len(basins) > MAX_BASINS or not np.isfinite(values[i]):
            break
        if all(np.abs(refined[i] - b).max() > 1e-3 for b in [theta, *basins[1:]]):
            basins.append(refined[i])
    scale = max(abs(value), 1e-300)
    num_at_best = int(np.sum(values <= value + 1e-6 * scale + 1e-15))
    _, grad = _value_and_grad(theta, law, data, objective)
    free = (theta > lo + 1e-9) & (theta < hi - 1e-9)  # the gradient need not vanish on a bound
    on_bound = tuple(n for n, f in zip(law.names, free) if not f)
    return Solution(theta=theta, value=value, start=start, num_starts=len(starts), num_at_best=max(num_at_best, 1),
                    grad_norm=float(np.linalg.norm(grad[free])), on_bound=on_bound,
                    equals_start=bool(np.allclose(theta, start, rtol=0, atol=1e-8)), converged=success,
                    basins=np.array(basins))


def _value_and_grad(theta: np.ndarray, law: Shaped, data: Data, objective: Objective) -> tuple[float, np.ndarray]:
    log_loss, jac = data.predict(law, theta[None, :])
    r = log_loss[0] - data.y
    value = float(penalty(objective, r).sum())
    dpen = r * _weight(objective, r)  # penalty'(r)
    return value, jac[0].T @ dpen
