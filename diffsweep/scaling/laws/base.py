"""What a scaling-law form is: the one definition the rest of ``diffsweep.scaling`` asks.

A form is a subclass of ``LawForm`` holding everything the fit, the bootstrap, the ratios and the
report need to know about it: its log-space parameters and their boxes, its formula in words, its
prediction with an analytic Jacobian, its starting grid, how it reads along an axis (for loss
curves and their inversion) and which of the fit's extra outputs it supports. Code elsewhere
asks the definition; it never branches on the form's name (house rule 3a).

Every law predicts log L. Coefficients are fitted as logs (E = exp(e), A = exp(a)); exponents
as themselves. ``predict`` is batched: ``theta`` is (B, p) (B = starts or bootstrap draws) and it
returns the predicted log loss (B, n) and its Jacobian (B, n, p).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from diffsweep.scaling.choices import Objective
from diffsweep.scaling.fitting.optimize import Data, Shaped


class Fitted(Protocol):
    """What a form's bootstrap starts read of a ``LawFit`` (``diffsweep.scaling.fitting.fit``): the law,
    the points it was fitted to and the objective."""

    @property
    def law(self) -> Shaped: ...

    @property
    def data(self) -> Data: ...

    @property
    def objective(self) -> Objective: ...


# Box constraints on the log-space parameters. Exponents must be non-negative (loss falls with
# scale); the log-coefficient boxes are wide enough for any real ladder, and a solution that sits
# on one is reported as such.
LOG_COEF = (-50.0, 120.0)
LOG_E = (-30.0, 10.0)
EXPONENT = (0.0, 5.0)


@dataclass(frozen=True)
class Param:
    """One fitted parameter of a form.

    ``name`` is its column in θ (a group's copy in a joint fit gets the group's index as a
    suffix: ``a0``, ``alpha1``); ``natural`` its name in the fit's results (``E``, ``alpha``);
    ``label`` how a warning names it (``E``, ``α``); ``log``: θ holds its log (a coefficient),
    else the value itself (an exponent)."""

    name: str
    bounds: tuple[float, float]
    natural: str
    label: str
    log: bool


def coefficient(name: str, bounds: tuple[float, float] = LOG_COEF) -> Param:
    """A positive coefficient fitted as its log: ``e`` -> E."""
    return Param(name, bounds, name.upper(), name.upper(), log=True)


def exponent(name: str, label: str) -> Param:
    """A decay exponent fitted as itself, bounded to [0, 5]."""
    return Param(name, EXPONENT, name, label, log=False)


class LawForm(ABC):
    """One scaling-law form, registered once in ``diffsweep.scaling.laws``.

    Subclasses set the class attributes and implement ``predict``, ``starts`` and ``along``;
    the other methods have defaults that suit a form of the shape L = floor + coef·x^-exponent
    along each axis it is read on."""

    name: ClassVar[str]  # the --form value, e.g. "offset"
    params: ClassVar[tuple[Param, ...]]  # in θ's column order
    formula: ClassVar[str]  # for the report; "{x}" is replaced by the fitted axis (N or D)
    words: ClassVar[str]  # the formula in words, for the report's first paragraph
    # L(N, D): fitted against N with D as a second input, ratios read along both (ρ_N at the
    # largest D, ρ_D at the largest N); False: a one-variable law in N or D (--axis)
    joint_nd: ClassVar[bool] = False
    default_objective: ClassVar[Objective] = Objective.L2
    shared_e: ClassVar[bool] = False  # the form can share its irreducible loss E across architectures
    # the fit's extra outputs this form supports (each reads the form's natural parameters)
    pure_comparison: ClassVar[bool] = False  # also fit the Kaplan pure law: the paper's reading beside it
    shift_model: ClassVar[bool] = False  # the joint one-ρ model L_cand(x) = L_base(x/ρ) (offset law)
    compute_optimal: ClassVar[bool] = False  # N_opt, D_opt at C ≈ 6ND (needs E, A, B, alpha, beta)

    # -- parameters -------------------------------------------------------------------------
    def names(self, n_groups: int, shared_e: bool) -> tuple[str, ...]:
        """θ's column names; with ``shared_e``, ``e`` once and every other parameter per group."""
        if not shared_e:
            return tuple(p.name for p in self.params)
        shared = tuple(p.name for p in self.params if p.name == "e")
        return shared + tuple(f"{p.name}{g}" for g in range(n_groups) for p in self.params if p.name != "e")

    def param(self, column: str) -> Param:
        """The parameter behind a θ column name (``alpha1`` -> ``alpha``)."""
        base = column.rstrip("0123456789")
        return next(p for p in self.params if p.name == base)

    def natural(self, law: Shaped, theta: np.ndarray, group: int = 0) -> dict[str, np.ndarray]:
        """Natural parameters (E, A, α, ...) of one group, for each row of ``theta`` (B, p)."""
        columns = {n: theta[:, i] for i, n in enumerate(law.names)}
        out = {}
        for p in self.params:
            value = columns[p.name] if p.name in columns else columns[f"{p.name}{group}"]
            out[p.natural] = np.exp(value) if p.log else value
        return out

    # -- fitting ----------------------------------------------------------------------------
    @abstractmethod
    def predict(self, law: Shaped, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None,
                group: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Log loss (B, n) and Jacobian (B, n, p) at ``theta`` (B, p); u = log x (or log N), v = log D."""

    @abstractmethod
    def starts(self, law: Shaped, u: np.ndarray, y: np.ndarray, v: np.ndarray | None,
               group: np.ndarray | None) -> np.ndarray:
        """A grid of starting points (S, p); ``y`` is the observed log loss."""

    def refit_starts(self, fit: Fitted, targets: np.ndarray) -> np.ndarray | None:
        """Extra starts (B, k, p) for refitting bootstrap draws ``targets`` (B, n), besides the
        estimate itself; None: the grid start and other local optima the estimate's search found."""
        return None

    def published_starts(self) -> list[np.ndarray]:
        """Published estimates to start the Huber likelihood from (θ rows), besides the grid's best."""
        return []

    # -- reading the law along an axis ------------------------------------------------------
    @abstractmethod
    def along(self, p: dict[str, np.ndarray], other: float | None, axis: str) -> tuple[np.ndarray, ...]:
        """The law along ``axis`` (N or D) as L = floor + coef·x^-exponent: (floor, coef, exponent),
        each (B,), from natural parameters ``p``; ``other`` is the fixed value of the other axis
        (joint laws only)."""

    def loss_at(self, p: dict[str, np.ndarray], x: np.ndarray, other: float | None, axis: str) -> np.ndarray:
        """Predicted loss (B, len(x)) at ``x`` (1, k) along ``axis``."""
        floor, coef, power = self.along(p, other, axis)
        return floor[:, None] + coef[:, None] * x ** -power[:, None]

    def invert(self, p: dict[str, np.ndarray], loss: np.ndarray, other: float | None, axis: str) -> np.ndarray:
        """x at which the law reaches ``loss`` (B, k); NaN where it never does (loss ≤ the floor)."""
        floor, coef, power = self.along(p, other, axis)
        reducible = loss - floor[:, None]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_x = (np.log(coef)[:, None] - np.log(reducible)) / power[:, None]
            x = np.exp(log_x)
        return np.where((reducible > 0) & (power[:, None] > 1e-9) & np.isfinite(x), x, np.nan)


def ols(u: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Slope (as a positive decay exponent) and intercept of y ≈ a - α u."""
    if len(np.unique(u)) < 2:
        return 0.0, float(np.mean(y))
    slope, intercept = np.polyfit(u, y, 1)
    return float(-slope), float(intercept)
