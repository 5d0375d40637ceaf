"""``diffsweep suggest`` from its request to its report: the current fit read from a fit folder, a
points CSV or a sweep (its finished runs in MLflow, its unfinished runs as candidates), the
candidate runs priced in GPU-hours, ranked (``suggest.rank``), a budget's greedy set
(``suggest.choose_within``) and, with ``launch``, the chosen planned runs submitted. The report is
a JSON-ready dict, what ``--json`` prints and the terminal table is drawn from."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.config.errors import rekeyed

# What a GPU-hour buys for runs the sweep does not plan (extra sizes, more seeds) when no profile
# says otherwise: slurm/profiles/h100-example.yaml (989 dense bf16 TFLOP/s at an assumed 40% MFU).
DEFAULT_PEAK_TFLOPS, DEFAULT_MFU = 989.0, 0.40


@dataclass(frozen=True, kw_only=True)
class SuggestRequest:
    """What to suggest runs for: ``source`` (a fit folder, a CSV or a sweep YAML), whose ratio
    (``candidate``, default the first candidate architecture) at which reference (``ref``, default
    the largest measured), which candidates (``extra_sizes``, another seed of a measured point
    unless not ``seeds``, a new cooldown branch's decay ``cooldown``), and the budget's greedy set."""

    source: Path
    candidate: str | None = None
    ref: float | None = None
    extra_sizes: tuple[float, ...] = ()
    seeds: bool = True
    cooldown: float | None = None
    budget: float | None = None
    max_runs: int = 64
    draws: int = 64
    boot: int = 400
    seed: int = 0
    profile: str | None = None
    experiment: str | None = None
    tune: tuple[str, ...] = ()
    launch: bool = False

    def __post_init__(self) -> None:  # the bootstrap's own settings are checked by FitRequest
        if self.draws < 8:
            raise ConfigError("draws", f"expected at least 8 simulated outcomes, got {self.draws}")
        if self.budget is not None and not (math.isfinite(self.budget) and self.budget > 0):  # NaN fails both
            raise ConfigError("budget", f"expected a positive number of GPU-hours, got {self.budget}")
        if self.max_runs < 1:
            raise ConfigError("max_runs", f"expected at least 1 run, got {self.max_runs}")
        if self.cooldown is not None and not (0 < self.cooldown <= 1):  # NaN fails it
            raise ConfigError("cooldown", f"expected a fraction of the branch's tokens in (0, 1], got {self.cooldown}")
        if self.launch and self.budget is None:
            raise ConfigError("launch", "submits the runs chosen within a budget; give --budget GPU-hours")
        if self.launch and self.source.suffix.lower() not in (".yaml", ".yml"):
            raise ConfigError("launch", "submits a sweep's planned runs; give the sweep YAML, not a fit folder or CSV")


def suggest_runs(req: SuggestRequest, echo: Callable[[str], None] = print,
                 warn: Callable[[str], None] = print) -> dict[str, Any]:
    """The report of ``req`` (``echo`` and ``warn``: what launching says, with ``req.launch``)."""
    from diffsweep.scaling.points import x_column
    from diffsweep.scaling.suggest import candidates
    from diffsweep.scaling.suggest import preposterior as sg

    try:
        points, request, label, planned_runs, rate, sweep_cooldown = _inputs(req)
    except ConfigError as exc:  # the experiment and sweep name a sweep file gives: an error names the file
        given_by_file = ({} if req.experiment else {"experiment": str(req.source)}) | {"sweep": str(req.source)}
        raise rekeyed(exc, given_by_file) from None
    if req.ref is not None:  # the fit's own bootstrap CI at that reference too (refused far outside the data)
        request = replace(request, at=(req.ref,))
    if req.tune:
        request = replace(request, tune=req.tune)
    design, result = sg.design_from_points(points, request, req.candidate, req.ref, req.draws)
    assert result.points is not None
    pool = list(planned_runs(design, rate))
    pool += candidates.extra_candidates(result.points, design, x_column(request), rate, list(req.extra_sizes),
                                        seeds=req.seeds,
                                        cooldown=req.cooldown or sweep_cooldown or candidates.DEFAULT_COOLDOWN)
    extend = candidates.beyond_edges(result.tuning, result.points, design, x_column(request), rate)
    if not pool and not extend:
        raise ConfigError("sizes", "no candidate runs: the sweep plans none unfinished; add --sizes or drop --no-seeds")
    width_now, ranked = sg.rank(design, pool, req.seed) if pool else (sg.current_width(design), [])
    first = _extend_first(extend, req.budget)
    left = None if req.budget is None else req.budget - sum(c.gpu_hours for c in first)
    choice = sg.choose_within(design, pool, left, req.seed, req.max_runs) if left is not None and pool else None
    row = next((r for r in result.ratios if abs(r["at"] - design.ref) <= 1e-9 * design.ref), None)
    out: dict[str, Any] = {
        "source": label, "baseline": design.baseline, "candidate": design.candidate, "axis": design.axis,
        "reference": design.ref, "level": design.level,
        "current": {"ratio": row["ratio"] if row else None, "lo": row["lo"] if row else None,
                    "hi": row["hi"] if row else None,
                    "bootstrap_width": (row["hi"] - row["lo"]) if row and row["hi"] is not None
                    and row["lo"] is not None else None,
                    "linearised_width": sg.finite(width_now)},
        "method": (f"preposterior: each candidate's outcome simulated from {len(design.draws[design.baseline])} "
                   "bootstrap draws of the fit plus its noise, laws refitted, CI width by the delta method on "
                   "log ratio (t quantile) with and without the candidate at the refitted laws, median over the "
                   "draws of the difference"),
        "noise_sd": design.sd,
        "run_sd": design.run_sd,
        "extend": [{"candidate": c.label, "arch": c.arch, "origin": c.origin, "num_params": c.num_params,
                    "tokens": c.tokens, "gpu_hours": c.gpu_hours} for c in extend],
        "candidates": [s.to_dict() for s in ranked],
    }
    if req.budget is not None:
        out["budget"] = choice.to_dict() if choice is not None else {
            "method": "greedy", "budget_gpu_hours": left, "spent_gpu_hours": 0.0, "stopped": "no gain",
            "expected_width_after": sg.finite(width_now), "runs": []}
        out["budget"]["extend_first"] = [c.label for c in first]
        out["budget"]["budget_gpu_hours"] = req.budget
        out["budget"]["spent_gpu_hours"] += sum(c.gpu_hours for c in first)
    if req.launch:  # grid extensions are not in the sweep: listed, not launched (like extra sizes)
        steps = choice.steps if choice is not None else []
        out["launched"] = _launch(req, [s.candidate.name for s in steps if s.candidate.origin == "planned"],
                                  echo, warn)
    return out


def _extend_first(extend: Sequence[Any], budget: float | None) -> list:
    """The grid extensions a budget pays for before any ranked run, in order, while it lasts."""
    if budget is None:
        return []
    taken, spent = [], 0.0
    for c in extend:
        if spent + c.gpu_hours <= budget:
            taken.append(c)
            spent += c.gpu_hours
    return taken


def _launch(req: SuggestRequest, names: list[str], echo: Callable[[str], None],
            warn: Callable[[str], None]) -> list[str]:
    """Submit the planned runs ``names`` with ``launch_sweep`` (``only`` their exact names)."""
    import re

    from diffsweep.launch.api import SweepTarget, launch_sweep
    from diffsweep.sweep import load_sweep

    if not names:
        return []
    only = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
    report = launch_sweep(SweepTarget(load_sweep(req.source, ()), profile=req.profile, only=only),
                          budget=req.budget, warn=warn, echo=echo)
    return [row.run.name for row, _ in report.submitted]


def _inputs(req: SuggestRequest):
    """The points, the fit request, a label, the planned-run candidates (a function of the design
    and the GPU rate), the FLOPs one GPU-hour buys and a sweep's branch cooldown (None: no branches)."""
    from diffsweep.scaling.analysis import FitRequest
    from diffsweep.scaling.folder import read_fit
    from diffsweep.scaling.table import from_csv

    source = req.source
    rate = _rate(req.profile)
    if source.is_dir():  # every field read back is checked (diffsweep/scaling/folder.py)
        points, saved = read_fit(source)
        return points, saved.request(req.boot, req.seed), str(source), _no_planned, rate, None
    if not source.exists():
        raise ConfigError("source", f"{source}: no such file or folder")
    if source.suffix.lower() == ".csv":
        return from_csv(source), FitRequest(n_boot=req.boot, seed=req.seed), str(source), _no_planned, rate, None
    if source.suffix.lower() in (".yaml", ".yml"):
        return _sweep_inputs(req)
    raise ConfigError("source", f"{source}: expected a fit folder, a CSV or a sweep YAML")


def _no_planned(design: Any, rate: float) -> list:
    """A fit folder or a CSV plans no runs."""
    return []


def _rate(profile: str | None) -> float:
    """FLOPs per GPU-hour: the profile's GPU at its assumed MFU, else the default H100."""
    if profile is None:
        return DEFAULT_PEAK_TFLOPS * 1e12 * DEFAULT_MFU * 3600
    from diffsweep.launch.profile_choice import load_profile

    gpu = load_profile(profile).gpu
    return gpu.peak_tflops * 1e12 * gpu.mfu * 3600


def _sweep_inputs(req: SuggestRequest):
    """A sweep: its finished runs in MLflow (as ``diffsweep fit SWEEP`` reads them), and its planned
    runs that launch would submit (new, changed, failed, cancelled) and that are not among them as
    candidates, priced by the planner."""
    from diffsweep.launch.api import SweepTarget, plan_sweep
    from diffsweep.launch.plan import SUBMITTABLE
    from diffsweep.scaling.analysis import FitRequest
    from diffsweep.scaling.pipeline import load_points, resolve_source, tune_columns
    from diffsweep.scaling.suggest.preposterior import Candidate
    from diffsweep.sweep import load_sweep

    sweep = req.source
    request = FitRequest(n_boot=req.boot, seed=req.seed, tune=tune_columns(sweep))  # a tuned sweep: its winners
    points = load_points(resolve_source(sweep, req.experiment, None, None, None, log=False), request)
    # A run finished in MLflow is measured, not a candidate, even where launch has no record of it
    # (logged from another machine, its run directory gone): its key is among the points.
    measured = set(points["run_key"].astype(str)) if "run_key" in points else set()
    spec = load_sweep(sweep, ())
    plan = plan_sweep(SweepTarget(spec, profile=req.profile))
    gpu = plan.profile.gpu
    rate = gpu.peak_tflops * 1e12 * gpu.mfu * 3600 if plan.profile.gpus_per_node > 0 else _rate(None)

    def planned(design: Any, rate_: float) -> list[Candidate]:
        out: list[Candidate] = []
        for r in plan.runs:
            if (r.state.state not in SUBMITTABLE or r.run.key in measured
                    or r.run.kind not in (design.baseline, design.candidate)):
                continue
            x = float(r.run.num_params) if design.axis == "N" else float(r.run.tokens)
            branch = r.run.branch
            cost = r.estimate.gpu_hours or r.run.flops / rate_  # the planner's FLOPs: a branch's cooldown only
            out.append(Candidate(r.run.kind, x, float(cost), float(r.run.num_params), float(r.run.tokens),
                                 other=float(r.run.tokens) if design.other_ref is not None else 0.0,
                                 name=r.run.name, origin="planned",
                                 family=branch.parent_key if branch is not None else r.run.key))
        return out

    return points, request, str(sweep), planned, rate, _cooldown(spec.branches, plan.runs)


def _cooldown(settings: Any, runs: list) -> Any:
    """How a sweep's branches decay, for pricing a new branch: their share, or the tokens of their
    cooldown length (in steps: at the runs' median batch); None without branches."""
    import numpy as np

    if settings is None:
        return None
    if not settings.cooldown_length:
        return settings.cooldown
    length = float(settings.cooldown_length)
    if settings.steps:
        length *= float(np.median([r.run.config.train.batch_tokens for r in runs]))
    return lambda tokens: min(length, tokens)
