"""Efficiency ratios: how much of the baseline's N (or D) a candidate needs for the same loss.

For a reference x_ref, L* = L̂_base(x_ref) and the candidate's curve is inverted at L*:
ρ = x_cand(L*) / x_ref. ρ is undefined when L* is at or below the candidate's floor (E);
see docs/references.md §3.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diffsweep.scaling.fitting.forms import Law


@dataclass(frozen=True)
class Curve:
    """One architecture's fitted law: the estimate (p,) and its bootstrap draws (B, p)."""

    law: Law
    theta: np.ndarray
    draws: np.ndarray
    group: int = 0  # column block of a joint (shared-E) law

    def loss(self, x: np.ndarray, other: float | None = None, axis: str = "N", boot: bool = False) -> np.ndarray:
        theta = self.draws if boot else self.theta[None, :]
        out = self.law.loss_at(theta, x, self.group, other, axis)
        return out if boot else out[0]

    def invert(self, loss: np.ndarray, other: float | None = None, axis: str = "N", boot: bool = False) -> np.ndarray:
        """x reaching ``loss``: (k,) from the estimate, or (B, k) per draw (``loss`` (B, k))."""
        if boot:
            return self.law.invert(self.draws, loss, self.group, other, axis)
        return self.law.invert(self.theta[None, :], np.atleast_2d(loss), self.group, other, axis)[0]


def ratio(base: Curve, cand: Curve, refs: np.ndarray, other: float | None = None, axis: str = "N",
          boot: bool = False) -> np.ndarray:
    """ρ at each reference x: (k,) from the estimates, (B, k) from paired bootstrap draws."""
    refs = np.asarray(refs, float)
    target = base.loss(refs, other, axis, boot)
    return cand.invert(target, other, axis, boot) / refs


def per_point(base: Curve, x: np.ndarray, loss: np.ndarray, other: float | None = None, axis: str = "N") -> np.ndarray:
    """Per-point multipliers: a candidate measured at x with ``loss`` against the baseline size
    that the baseline's curve says reaches the same loss (x / x_base_equivalent)."""
    return np.asarray(x, float) / base.invert(np.asarray(loss, float), other, axis)
