"""A law to fit: one registered form over ``n_groups`` architectures, optionally sharing E.

``Law`` is what the solvers, the bootstrap and the ratios hold. Everything that depends on the
form is asked of its definition (``diffsweep.scaling.laws``); ``Law`` adds only the grouping of a
joint fit and the shapes (``predict`` is batched: ``theta`` (B, p) -> log loss (B, n), Jacobian
(B, n, p)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diffsweep.config import ConfigError
from diffsweep.scaling.laws import law_form, law_forms
from diffsweep.scaling.laws.base import LawForm, Param

__all__ = ["Law"]


@dataclass(frozen=True)
class Law:
    """One form over ``n_groups`` architectures; with ``shared_e`` all groups share E.

    ``form`` is a registered form's name (``diffsweep.scaling.laws``)."""

    form: str
    n_groups: int = 1
    shared_e: bool = False
    definition: LawForm = field(init=False, repr=False, compare=False)
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        definition = law_form(self.form)
        if self.shared_e and not definition.shared_e:
            can = " or ".join(f"--form {d.name}" for d in law_forms() if d.shared_e)
            raise ConfigError("shared_e", f"a shared E needs {can}, not {definition.name}")
        object.__setattr__(self, "definition", definition)
        object.__setattr__(self, "names", definition.names(self.n_groups, self.shared_e))

    @property
    def num_params(self) -> int:
        return len(self.names)

    def group_params(self, group: int = 0) -> int:
        """How many θ columns one group's points determine: all of them for a law of its own; in a
        joint fit the group's own columns, plus the shared ones counted once, with group 0."""
        if not self.shared_e:
            return self.num_params
        suffixes = [n[len(n.rstrip("0123456789")):] for n in self.names]
        return suffixes.count(str(group)) + (suffixes.count("") if group == 0 else 0)

    def param(self, column: str) -> Param:
        """The form's parameter behind a θ column (``alpha1`` -> alpha)."""
        return self.definition.param(column)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = [self.param(n).bounds for n in self.names]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    def predict(self, theta: np.ndarray, u: np.ndarray, v: np.ndarray | None = None,
                group: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Log loss (B, n) and Jacobian (B, n, p) at ``theta`` (B, p); u = log x (or log N), v = log D."""
        return self.definition.predict(self, theta, u, v, group)

    def starts(self, u: np.ndarray, y: np.ndarray, v: np.ndarray | None = None,
               group: np.ndarray | None = None) -> np.ndarray:
        """A grid of starting points (S, p); ``y`` is the observed log loss."""
        return np.asarray(self.definition.starts(self, u, y, v, group), float)

    def natural(self, theta: np.ndarray, group: int = 0) -> dict[str, np.ndarray]:
        """E, A, α (and B, β) of one group, for each row of ``theta`` (B, p)."""
        return self.definition.natural(self, theta, group)

    def loss_at(self, theta: np.ndarray, x: np.ndarray | float, group: int = 0,
                other: float | None = None, axis: str = "N") -> np.ndarray:
        """Predicted loss (B, len(x)) at x; for a joint L(N, D) law ``other`` is the fixed N or D."""
        x = np.atleast_1d(np.asarray(x, float))[None, :]
        return self.definition.loss_at(self.natural(theta, group), x, other, axis)

    def invert(self, theta: np.ndarray, loss: np.ndarray, group: int = 0,
               other: float | None = None, axis: str = "N") -> np.ndarray:
        """x at which the law reaches ``loss`` (B, k); NaN where it never does (loss ≤ the floor)."""
        return self.definition.invert(self.natural(theta, group), np.asarray(loss, float), other, axis)

