"""A scaling-law form from the user's own package (an entry point in the group
``diffsweep.law_forms``): Kaplan et al.'s own parameterisation of the pure law, L = (N_c / x)^α,
fitted as (c = log N_c, α). One file and one registration (pyproject.toml), as docs/extending.md says."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from diffsweep.scaling.laws.base import EXPONENT, LawForm, Param


class KaplanNc(LawForm):
    name: ClassVar[str] = "kaplan_nc"
    params = (Param("c", (0.0, 120.0), "Nc", "N_c", log=True), Param("alpha", EXPONENT, "alpha", "α", log=False))
    formula = "L = (N_c/{x})^α"
    words = "a pure power law in Kaplan et al.'s parameterisation"

    def predict(self, law, theta, u, v, group):
        c, alpha = theta[:, :1], theta[:, 1:2]
        log_loss = alpha * (c - u)  # log L = α (log N_c - log x)
        return log_loss, np.stack([np.broadcast_to(alpha, log_loss.shape), c - u], axis=2)

    def starts(self, law, u, y, v, group):
        return np.array([[c, alpha] for c in (10.0, 20.0, 30.0, 40.0) for alpha in (0.05, 0.1, 0.3)])

    def along(self, p, other, axis):
        return np.zeros_like(p["alpha"]), p["Nc"] ** p["alpha"], p["alpha"]
