"""The closed choices of a scaling fit, as StrEnums (the options of ``diffsweep fit``).

This module imports nothing but the standard library, so the CLI can use the enums as Typer
options without loading numpy or scipy for ``diffsweep --help``. What each choice *does* lives
elsewhere. The law forms are not here: they are a registry (``diffsweep.scaling.laws``), which
lists their names without importing numpy too.
"""

from __future__ import annotations

from enum import StrEnum


class Objective(StrEnum):
    """How residuals r = log L̂ - log L are penalised (summed over points, never averaged)."""

    L2 = "l2"  # r²/2: least squares in log space (default for designed sweeps)
    HUBER = "huber"  # Huber_δ(r), δ = 1e-3: Hoffmann et al. / Epoch AI's approach 3
    # Epoch AI's final estimator: the Huber likelihood with a free scale σ (diffsweep.scaling.fitting.mle);
    # bootstrap refits use the summed Huber loss, as Epoch's bootstrap does
    HUBER_MLE = "huber_mle"


class Axis(StrEnum):
    """What the loss is fitted against."""

    AUTO = "auto"  # N for a size ladder, D for a token scan
    N = "N"  # parameters
    D = "D"  # training tokens


class Count(StrEnum):
    """Which parameters N counts (Pearce & Song 2024: total parameters with an offset law)."""

    TOTAL = "total"
    NON_EMBEDDING = "non_embedding"


class TokenPoints(StrEnum):
    """Which evaluations give D points."""

    AUTO = "auto"  # final evaluations if there are ≥ 3 token budgets, else checkpoints
    FINAL = "final"  # one point per run: its final evaluation
    CHECKPOINTS = "checkpoints"  # every evaluation after warmup (the paper's Fig. 3b reading)


class Holdout(StrEnum):
    """Which points a held-out check leaves out of the fit and predicts."""

    LARGEST = "largest"  # each architecture's largest size (or D)
