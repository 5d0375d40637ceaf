"""The points a fit uses: usable losses, the axis, which evaluations count, one ``Arch`` per architecture.

Errors name the ``FitRequest`` field at fault (the CLI maps fields to its flags).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from diffsweep.config import ConfigError
from diffsweep.scaling.choices import Axis, Count, TokenPoints
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.result import FitWarning

if TYPE_CHECKING:
    from diffsweep.scaling.request import FitRequest

# A cross-entropy in nats per token outside this range is no point on a scaling curve: above 1e6 a
# diverged run (a uniform guess over a 1e6-token vocabulary is 13.8), below 1e-6 a memorised
# validation set, or a typo (1e305, 1e-320) that would dominate a fit in log space.
LOSS_RANGE = (1e-6, 1e6)


@dataclass
class Arch:
    """One architecture's points on the chosen axis, and the run each point comes from."""

    name: str
    x: np.ndarray  # N or D per point (a joint L(N, D) form: N)
    loss: np.ndarray
    other: np.ndarray  # D per point for a joint L(N, D) form, else unused
    run: np.ndarray | None = None  # run index per point (see run_index); None: one run per point
    cell: np.ndarray = field(init=False)

    def __post_init__(self) -> None:  # a cell is one (x, other) pair: seeds of one size share it
        self.cell = np.unique(np.column_stack([self.x, self.other]), axis=0, return_inverse=True)[1].ravel()


def finite(points: pd.DataFrame) -> pd.DataFrame:
    """The points with a usable loss; the others (a diverged run, a typo) are dropped with a warning."""
    loss = points["loss"].astype(float)
    bad = ~(np.isfinite(loss) & (loss >= LOSS_RANGE[0]) & (loss <= LOSS_RANGE[1]))
    if bad.any():
        names = ", ".join(f"{n} ({v:g})" for n, v in zip(points.loc[bad, "run_name"].head(5), loss[bad].head(5)))
        what = f"non-finite, or outside [{LOSS_RANGE[0]:g}, {LOSS_RANGE[1]:g}] nats"
        if bad.all():
            raise ConfigError("loss", f"every loss is {what} (runs: {names})")
        warnings.warn(FitWarning(f"dropped {int(bad.sum())} point(s) with a loss that is {what}: {names}"))
    return points.loc[~bad]


def x_column(req: FitRequest) -> str:
    return "num_params" if req.count is Count.TOTAL else "num_non_embedding_params"


def choose_axis(points: pd.DataFrame, req: FitRequest) -> Axis:
    if req.law_form.joint_nd or req.axis is not Axis.AUTO:
        return req.axis if req.axis is not Axis.AUTO else Axis.N
    finals = points[(points["point"] == "final") & (points["arch"] == req.baseline)]
    if finals.empty:
        raise ConfigError("baseline", f"no runs of the baseline '{req.baseline}'; architectures found: "
                          f"{', '.join(sorted(points['arch'].unique()))}")
    sizes, budgets = finals[x_column(req)].nunique(), finals["tokens"].nunique()
    if sizes >= 2:
        if budgets > 1 and not proportional(finals, req):
            warnings.warn(FitWarning("the runs differ in both size and tokens; fitting loss against N at each run's "
                                     "own budget (use --form chinchilla for L(N, D))"))
        return Axis.N
    return Axis.D


def proportional(finals: pd.DataFrame, req: FitRequest) -> bool:
    per_param = finals["tokens"] / finals[x_column(req)]
    return bool(per_param.max() / per_param.min() < 1.05)


def select_points(points: pd.DataFrame, axis: Axis, req: FitRequest) -> pd.DataFrame:
    """The table with ``used`` and ``reason`` columns: which points the fit uses and why not."""
    pts = points.copy()
    pts["used"], pts["reason"] = True, ""
    checkpoints = pts["point"] != "final"
    use_checkpoints = False
    if axis is Axis.D and not req.law_form.joint_nd:
        finals = pts[~checkpoints & (pts["arch"] == req.baseline)]
        use_checkpoints = req.token_points is TokenPoints.CHECKPOINTS or (
            req.token_points is TokenPoints.AUTO and finals["tokens"].nunique() < 3)
        if use_checkpoints:
            if not checkpoints.any():
                raise ConfigError("token_points", "the runs have one token budget each and no intermediate "
                                  "evaluations were read; pass --token-points checkpoints with MLflow runs")
            warnings.warn(FitWarning(
                "D points are intermediate evaluations of each run (as in the paper's Fig. 3b); with a decaying "
                "learning rate they overstate the loss of a run trained to that D (Hägele et al. 2024)"))
    if not use_checkpoints:
        pts.loc[checkpoints, ["used", "reason"]] = [False, "intermediate evaluation"]
    else:
        step, warmup = pts["step"].astype(float), pts["warmup_steps"].astype(float)
        unknown = checkpoints & (step.isna() | warmup.isna())
        if unknown.any():
            warnings.warn(FitWarning(
                f"{int(unknown.sum())} intermediate evaluation(s) have no step or warmup_steps (columns of the CSV), "
                "so none of them can be told to be in warmup: all are used"))
        early = checkpoints & ~unknown & (step <= warmup)
        pts.loc[early, ["used", "reason"]] = [False, "in warmup"]
    return pts


def architectures(points: pd.DataFrame, axis: Axis, req: FitRequest) -> dict[str, Arch]:
    used = points[points["used"]]
    present = sorted(used["arch"].unique())
    if req.baseline not in present:
        raise ConfigError("baseline", f"no finished runs of the baseline '{req.baseline}' match; "
                          f"architectures found: {', '.join(present) or 'none'}")
    candidates = list(dict.fromkeys(req.candidates)) or [a for a in present if a != req.baseline]
    if req.baseline in candidates:
        raise ConfigError("candidates", f"'{req.baseline}' is the baseline; compare it with another architecture")
    for c in candidates:
        if c not in present:
            raise ConfigError("candidates", f"no finished runs of '{c}' match; architectures found: {', '.join(present)}")
    # only the baseline: its law is fitted and reported, with no ratio (candidates == [])
    law = Law(req.form, n_groups=1 + len(candidates), shared_e=req.shared_e)
    archs = {}
    for name in [req.baseline, *candidates]:
        rows = used[used["arch"] == name]
        x = rows[x_column(req)].to_numpy(float) if axis is Axis.N or law.definition.joint_nd else rows["tokens"].to_numpy(float)
        other = rows["tokens"].to_numpy(float) if law.definition.joint_nd else np.zeros(len(rows))
        arch = Arch(name, x, rows["loss"].to_numpy(float), other, run_index(rows))
        distinct = len(np.unique(arch.cell))
        needed = law.group_params(0)
        if distinct < needed:
            what = "sizes" if axis is Axis.N else "token counts"
            raise ConfigError("points", f"{name} has {distinct} distinct {what} but the {req.form} law has "
                              f"{needed} parameters: need at least {needed} (or a law with fewer, e.g. --form pure)")
        archs[name] = arch
    return archs


def run_index(rows: pd.DataFrame) -> np.ndarray:
    """Which run each point comes from (the unit of noise: a run's evaluations share its offset), as
    indices 0..k-1 of ``run_ids``."""
    return np.unique(run_ids(rows), return_inverse=True)[1].ravel()


def run_ids(rows: pd.DataFrame) -> np.ndarray:
    """Which run each point comes from (the unit of noise: a run's evaluations share its offset).

    A point's run is its MLflow ``run_id``, else its ``run_key``, else its ``run_name`` (not the
    table's ``row N`` placeholder for a CSV without names). A cooldown branch (``parent``: its
    parent's run key) is its parent's run: it trained the parent's steps up to its branch point, so
    the two share the run's offset (seed, data order). A CSV with none of them: the
    evaluations of a token scan read from checkpoints (``point`` = checkpoint rows among them) are
    one run per (arch, num_params, seed) (a CSV without ``seed`` has seed 0: one run per
    architecture and size), and every other row (a final evaluation) is a run of its own."""
    ids = rows["run_id"].astype(str).where(rows["run_id"].astype(str) != "", rows["run_key"].astype(str))
    parents = rows["parent"].astype(str) if "parent" in rows.columns else pd.Series("", index=rows.index)
    if (parents != "").any():  # families: a branch and its parent are one run (named by the parent's key)
        keys = rows["run_key"].astype(str)
        ids = parents.where(parents != "", keys.where(keys != "", ids))
    names = rows["run_name"].astype(str)
    ids = ids.where(ids != "", names.where(~names.str.fullmatch(r"row \d+"), ""))
    if (rows["point"] != "final").any():
        fallback = rows["arch"].astype(str) + "|" + rows["num_params"].astype(str) + "|" + rows["seed"].astype(str)
    else:
        fallback = pd.Series([f"row {i}" for i in range(len(rows))], index=rows.index)
    return ids.where(ids != "", fallback).to_numpy(str)
