"""``FitRequest``: everything that shapes a fit (the options of ``diffsweep fit``), checked once.

Every number is checked here, when a request is made, whoever makes it: ``fit``'s flags, ``suggest``
(its flags, and a fit.json it reads back, whose fields go through the same bounds) and library
callers. Errors name the field (``level``); the CLI maps fields to its flags. A bound is written
``lo <= x <= hi`` so that NaN fails it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffsweep.config import ConfigError
from diffsweep.config.decode import confidence_level
from diffsweep.scaling.choices import Axis, Count, Objective, TokenPoints

if TYPE_CHECKING:
    from diffsweep.scaling.laws.base import LawForm

MIN_BOOT = 50  # fewer draws cannot place the 2.5% and 97.5% percentiles of a 95% CI (1 draw each side)
# 100,000 draws put a percentile within ~0.1% of its limit; beyond that the draws (B x points x starts
# refits) only cost memory and hours, so a larger count is a typo.
MAX_BOOT = 100_000
MAX_NOISE_SD = 1.0  # sd of log loss: a factor e of run-to-run scatter is no longer noise around a law


def check_sd(value: float, key: str) -> float:
    """A known sd of log loss in (0, MAX_NOISE_SD] (NaN and inf fail)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_NOISE_SD:
        raise ConfigError(key, f"expected a positive sd of log loss up to {MAX_NOISE_SD:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class FitRequest:
    """Everything that shapes a fit (the CLI's options); refused on construction if out of range."""

    baseline: str = "transformer"
    candidates: tuple[str, ...] = ()  # empty: every other architecture
    axis: Axis = Axis.AUTO
    form: str = "offset"  # a registered law form's name (diffsweep.scaling.laws)
    objective: Objective | None = None  # None: the form's default (huber for chinchilla, l2 otherwise)
    count: Count = Count.TOTAL
    at: tuple[float, ...] = ()
    shared_e: bool = False
    holdout: bool = False
    token_points: TokenPoints = TokenPoints.AUTO
    n_boot: int = 1000
    level: float = 0.95
    seed: int = 0
    noise_sd: float | None = None  # sd of log loss of one evaluation, independent per point
    run_sd: float | None = None  # sd of a per-run offset shared by all evaluations of one run
    # Tuning columns of the points (lr, warmup_steps, ...): each cell is fitted at its best candidate,
    # the selection redone in every bootstrap draw (diffsweep.scaling.tuning). Empty: untuned.
    tune: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.n_boot, bool) or not isinstance(self.n_boot, int) or not MIN_BOOT <= self.n_boot <= MAX_BOOT:
            raise ConfigError("n_boot", f"expected {MIN_BOOT} to {MAX_BOOT:,} bootstrap draws, got {self.n_boot!r}")
        confidence_level(self.level)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError("seed", f"expected a non-negative integer, got {self.seed!r}")
        if self.noise_sd is not None:
            check_sd(self.noise_sd, "noise_sd")
        if self.run_sd is not None:
            check_sd(self.run_sd, "run_sd")
        if not isinstance(self.tune, tuple) or not all(isinstance(c, str) and c for c in self.tune) or len(
                set(self.tune)) != len(self.tune):
            raise ConfigError("tune", f"expected distinct column names of the points, got {self.tune!r}")
        # ``at``: parsed and checked once, from the flag's text (cli/fit.py:parse_amount)

    @property
    def law_form(self) -> LawForm:
        """The registered definition of ``form``."""
        from diffsweep.scaling.laws import law_form

        return law_form(self.form)

    @property
    def resolved_objective(self) -> Objective:
        if self.objective is not None:
            return self.objective
        return self.law_form.default_objective
