"""``diffsweep suggest``: which runs would narrow the efficiency ratio's CI the most per GPU-hour."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from diffsweep.cli.common import JsonOpt, flag_keys, handle_errors, print_json
from diffsweep.config import ConfigError

# What a GPU-hour buys for runs the sweep does not plan (extra sizes, more seeds) when no --profile
# says otherwise: slurm/profiles/h100-example.yaml (989 dense bf16 TFLOP/s at an assumed 40% MFU).
DEFAULT_PEAK_TFLOPS, DEFAULT_MFU = 989.0, 0.40

# The library's fields named otherwise than the options that set them (the others are the
# options' own: ``handle_errors``); those the sweep or fit file sets are named by it.
FLAGS = {"candidates": "--candidate", "n_boot": "--boot", "only": "--launch",
         "points": "SWEEP_OR_FIT", "shared_e": "SWEEP_OR_FIT", "noise_sd": "SWEEP_OR_FIT", "baseline": "SWEEP_OR_FIT"}


@handle_errors
def suggest(
    source: Annotated[Path, typer.Argument(help="A fit folder (fits/<name>/, from diffsweep fit), a points CSV, or "
                                           "a sweep YAML (its finished runs in MLflow; its unfinished runs are "
                                           "candidates).", show_default=False, metavar="SWEEP_OR_FIT")],
    candidate: Annotated[str | None, typer.Option("--candidate", help="Whose ratio to narrow (default: the first "
                                                  "candidate architecture).", show_default=False)] = None,
    at: Annotated[str | None, typer.Option("--at", help="The reference size (or token count) of the ratio, e.g. "
                                           "11B (default: the largest measured).", show_default=False)] = None,
    sizes: Annotated[list[str] | None, typer.Option("--sizes", help="Extra sizes (tokens on a token axis) to "
                                                    "consider for both architectures, e.g. 20B (repeatable, or "
                                                    "comma-separated).", show_default=False)] = None,
    no_seeds: Annotated[bool, typer.Option("--no-seeds", help="Do not consider another seed of a measured "
                                           "point (or run family).")] = False,
    cooldown: Annotated[float | None, typer.Option("--cooldown", help="A new cooldown branch's decay, as a fraction "
                                                   "of its tokens, to price it (default: the sweep's branches: "
                                                   "cooldown or cooldown_length, else 0.2).",
                                                   show_default=False)] = None,
    budget: Annotated[float | None, typer.Option("--budget", help="GPU-hours: pick the best set of runs within it "
                                                 "(greedy).", show_default=False)] = None,
    max_runs: Annotated[int, typer.Option("--max-runs", help="With --budget: pick at most this many runs.")] = 64,
    draws: Annotated[int, typer.Option("--draws", help="Simulated outcomes per candidate.")] = 64,
    boot: Annotated[int, typer.Option("--boot", help="Bootstrap draws of the current fit.")] = 400,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap and the simulations.")] = 0,
    profile: Annotated[str | None, typer.Option("--profile", help="Cluster profile whose GPU prices runs the "
                                                "sweep does not plan (default: the sweep's if it has GPUs, else "
                                                "an H100 at 40% MFU).", show_default=False)] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", help="MLflow experiment of a sweep's runs "
                                                   "(default: the sweep's).", show_default=False)] = None,
    tune: Annotated[list[str] | None, typer.Option("--tune", help="Tuning column of a CSV's points (lr, ...; "
                                                  "repeatable): fit each cell at its best candidate, as fit --tune "
                                                  "does (default: a tuned sweep's tune: keys, a fit folder's own).",
                                                  show_default=False)] = None,
    top: Annotated[int, typer.Option("--top", help="Rows of the ranked table shown (--json: all).")] = 15,
    launch: Annotated[bool, typer.Option("--launch", help="Submit the planned runs chosen within --budget through "
                                         "the normal launcher (a sweep only; extra sizes and seeds are not in the "
                                         "sweep and are listed, not launched).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Rank candidate runs by how much they are expected to narrow the CI of the efficiency ratio
    at the reference, per GPU-hour (a preposterior analysis of the current fit); with --budget,
    pick a set greedily."""
    from diffsweep.cli.fit import parse_amount
    from diffsweep.scaling import candidates
    from diffsweep.scaling import suggest as sg
    from diffsweep.scaling.points import x_column

    # --boot and --seed: FitRequest (diffsweep/scaling/request.py); --at, --sizes: parse_amount
    if draws < 8:
        raise ConfigError("--draws", f"expected at least 8 simulated outcomes, got {draws}")
    if budget is not None and not (math.isfinite(budget) and budget > 0):  # NaN fails both
        raise ConfigError("--budget", f"expected a positive number of GPU-hours, got {budget}")
    if max_runs < 1:
        raise ConfigError("--max-runs", f"expected at least 1 run, got {max_runs}")
    if top < 1:
        raise ConfigError("--top", f"expected at least 1 row, got {top}")
    if cooldown is not None and not (0 < cooldown <= 1):  # NaN fails it
        raise ConfigError("--cooldown", f"expected a fraction of the branch's tokens in (0, 1], got {cooldown}")
    if launch and budget is None:
        raise ConfigError("--launch", "submits the runs chosen within a budget; give --budget GPU-hours")
    if launch and source.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError("--launch", "submits a sweep's planned runs; give the sweep YAML, not a fit folder or CSV")
    ref = parse_amount(at, "--at") if at is not None else None
    extra_sizes = [parse_amount(s, "--sizes") for part in sizes or () for s in part.split(",") if s.strip()]
    flags = FLAGS | ({} if experiment else {"experiment": str(source)}) | {"sweep": str(source)}
    with flag_keys(flags):
        points, request, label, planned_runs, rate, sweep_cooldown = _inputs(source, boot, seed, experiment, profile)
    with flag_keys(FLAGS):
        if ref is not None:  # the fit's own bootstrap CI at that reference too (refused far outside the data)
            request = replace(request, at=(ref,))
        if tune:
            request = replace(request, tune=tuple(tune))
        design, result = sg.design_from_points(points, request, candidate, ref, draws)
        assert result.points is not None
        pool = list(planned_runs(design, rate))
        pool += candidates.extra_candidates(result.points, design, x_column(request), rate, extra_sizes,
                                            seeds=not no_seeds,
                                            cooldown=cooldown or sweep_cooldown or candidates.DEFAULT_COOLDOWN)
        extend = candidates.beyond_edges(result.tuning, result.points, design, x_column(request), rate)
        if not pool and not extend:
            raise ConfigError("sizes", "no candidate runs: the sweep plans none unfinished; add --sizes or drop "
                              "--no-seeds")
        width_now, ranked = sg.rank(design, pool, seed) if pool else (sg.current_width(design), [])
        first = _extend_first(extend, budget)
        left = None if budget is None else budget - sum(c.gpu_hours for c in first)
        choice = sg.choose_within(design, pool, left, seed, max_runs) if left is not None and pool else None
    row = next((r for r in result.ratios if abs(r["at"] - design.ref) <= 1e-9 * design.ref), None)
    out: dict[str, Any] = {
        "source": label, "baseline": design.baseline, "candidate": design.candidate, "axis": design.axis,
        "reference": design.ref, "level": design.level,
        "current": {"ratio": row["ratio"] if row else None, "lo": row["lo"] if row else None,
                    "hi": row["hi"] if row else None,
                    "bootstrap_width": (row["hi"] - row["lo"]) if row and row["hi"] is not None
                    and row["lo"] is not None else None,
                    "linearised_width": sg._finite(width_now)},
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
    if budget is not None:
        out["budget"] = choice.to_dict() if choice is not None else {
            "method": "greedy", "budget_gpu_hours": left, "spent_gpu_hours": 0.0, "stopped": "no gain",
            "expected_width_after": sg._finite(width_now), "runs": []}
        out["budget"]["extend_first"] = [c.label for c in first]
        out["budget"]["budget_gpu_hours"] = budget
        out["budget"]["spent_gpu_hours"] += sum(c.gpu_hours for c in first)
    if launch:  # grid extensions are not in the sweep: listed, not launched (like extra sizes)
        steps = choice.steps if choice is not None else []
        out["launched"] = _launch(source, profile, [s.candidate.name for s in steps
                                                     if s.candidate.origin == "planned"], budget, json_out)
    if json_out:
        print_json(out)
        return
    _render(out, top)


def _extend_first(extend: list, budget: float | None) -> list:
    """The grid extensions a budget pays for before any ranked run, in order, while it lasts."""
    if budget is None:
        return []
    taken, spent = [], 0.0
    for c in extend:
        if spent + c.gpu_hours <= budget:
            taken.append(c)
            spent += c.gpu_hours
    return taken


def _launch(sweep: Path, profile: str | None, names: list[str], budget: float | None, quiet: bool) -> list[str]:
    """Submit the planned runs ``names`` with ``launch_sweep`` (``--only`` their exact names)."""
    import re

    from diffsweep.launch.api import SweepTarget, launch_sweep
    from diffsweep.sweep import load_sweep

    if not names:
        return []
    only = "^(?:" + "|".join(re.escape(n) for n in names) + ")$"
    say = (lambda _m: None) if quiet else typer.echo
    report = launch_sweep(SweepTarget(load_sweep(sweep, ()), profile=profile, only=only), budget=budget,
                          warn=lambda m: typer.echo(f"warning: {m}", err=True), echo=say)
    return [row.run.name for row, _ in report.submitted]


def _render(out: dict, top: int) -> None:
    from diffsweep.config.units import human
    from diffsweep.scaling.report import arch_name

    cur = out["current"]
    ref = human(out["reference"]) + (" tokens" if out["axis"] == "D" else "")
    typer.echo(f"{arch_name(out['candidate'])} vs {arch_name(out['baseline'])}, ratio at {ref}: "
               + (f"{cur['ratio']:.1%} (CI {_pct(cur['lo'])}-{_pct(cur['hi'])}, width {_pct(cur['bootstrap_width'])}); "
                  if cur["ratio"] is not None else "")
               + f"linearised width now {_pct(cur['linearised_width'])}")
    typer.echo(f"method: {out['method']}\n")
    if out["extend"]:
        typer.echo(f"first, extend the tuning grid: {len(out['extend'])} cell(s) have their best at an end of the "
                   "grid, so the fit's optimum there may lie outside it (not ranked: whether the next value beats "
                   "the best is what the run finds out):")
        for c in out["extend"]:
            typer.echo(f"  {c['candidate']}  {_gpu_h(c['gpu_hours'])} GPU-h")
        typer.echo("")
    header = f"{'candidate':<44} {'GPU-h':>10} {'width after':>12} {'reduction/GPU-h':>16}"
    typer.echo(header)
    for r in out["candidates"][:top]:
        typer.echo(f"{r['candidate'][:44]:<44} {_gpu_h(r['gpu_hours']):>10} {_pct(r['expected_width_after']):>12} "
                   f"{_per(r['reduction_per_gpu_hour']):>16}")
    if len(out["candidates"]) > top:
        typer.echo(f"... {len(out['candidates']) - top} more (--top, --json)")
    if out["run_sd"] > 0:
        typer.echo(f"\nthe points of a run and its cooldown branches (or checkpoints) share the run's offset (sd "
                   f"{out['run_sd']:.2g} of log loss): a new branch of a run adds a point at that offset for its "
                   "cooldown's cost; another seed of a run is a new run with its own offset and all of its points")
    if any(r["origin"] == "branch" for r in out["candidates"]):
        typer.echo("a new branch starts from its run's checkpoint at its branch point: add its budget to the sweep's "
                   "branches: before the run passes that point (a finished run kept no checkpoint there)")
    b = out.get("budget")
    if b is not None:
        typer.echo(f"\nwithin {b['budget_gpu_hours']:,.1f} GPU-hours (greedy: best reduction per GPU-hour given the "
                   "runs already picked, not an optimal set):")
        for c in b["extend_first"]:
            typer.echo(f"  first: {c}")
        for i, r in enumerate(b["runs"], 1):
            typer.echo(f"  {i}. {r['candidate']}  {_gpu_h(r['gpu_hours'])} GPU-h -> width {_pct(r['expected_width_after'])}")
        typer.echo(f"  spent {_gpu_h(b['spent_gpu_hours'])} GPU-h; expected width {_pct(cur['linearised_width'])} -> "
                   f"{_pct(b['expected_width_after'])}" if b["runs"] else "  no affordable run narrows the CI")
        left = b["budget_gpu_hours"] - b["spent_gpu_hours"]
        if b["runs"] and b["stopped"] == "no gain":
            typer.echo(f"  stopped with {left:,.1f} GPU-h left: no affordable run is expected to narrow the CI further")
        elif b["stopped"] == "max runs":
            typer.echo(f"  stopped at --max-runs ({len(b['runs'])}) with {left:,.1f} GPU-h left")
    if "launched" in out:
        extras = [*(b or {}).get("extend_first", []),
                  *(r["candidate"] for r in (b or {}).get("runs", []) if r["origin"] != "planned")]
        typer.echo(f"\nlaunched {len(out['launched'])} run(s): {', '.join(out['launched']) or 'none'}"
                   + (f"; not in the sweep, so not launched: {', '.join(extras)}" if extras else ""))


def _gpu_h(v: float) -> str:
    """GPU-hours as the table shows them: 0.1 and up to one decimal, less to 2 significant digits
    (a tiny CPU model's run is 1e-8 GPU-h, not 0.0)."""
    return f"{v:,.1f}" if v >= 0.1 or v == 0 else f"{v:.2g}"


def _pct(v: float | None) -> str:
    return "∞" if v is None else f"{v:.1%}"


def _per(v: float | None) -> str:
    return "∞" if v is None else f"{v * 100:.3g} pp"


def _inputs(source: Path, boot: int, seed: int, experiment: str | None, profile: str | None):
    """The points, the fit request, a label, the planned-run candidates (a function of the design
    and the GPU rate), the FLOPs one GPU-hour buys and a sweep's branch cooldown (None: no branches)."""
    from diffsweep.scaling.analysis import FitRequest
    from diffsweep.scaling.folder import read_fit
    from diffsweep.scaling.table import from_csv

    rate = _rate(profile)
    if source.is_dir():  # every field read back is checked (diffsweep/scaling/folder.py)
        points, saved = read_fit(source)
        return points, saved.request(boot, seed), str(source), _no_planned, rate, None
    if not source.exists():
        raise ConfigError("SWEEP_OR_FIT", f"{source}: no such file or folder")
    if source.suffix.lower() == ".csv":
        return from_csv(source), FitRequest(n_boot=boot, seed=seed), str(source), _no_planned, rate, None
    if source.suffix.lower() in (".yaml", ".yml"):
        return _sweep_inputs(source, boot, seed, experiment, profile)
    raise ConfigError("SWEEP_OR_FIT", f"{source}: expected a fit folder, a CSV or a sweep YAML")


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


def _sweep_inputs(sweep: Path, boot: int, seed: int, experiment: str | None, profile: str | None):
    """A sweep: its finished runs in MLflow (as ``diffsweep fit SWEEP`` reads them), and its planned
    runs that launch would submit (new, changed, failed, cancelled) and that are not among them as
    candidates, priced by the planner."""
    from diffsweep.launch.api import SweepTarget, plan_sweep
    from diffsweep.launch.plan import SUBMITTABLE
    from diffsweep.scaling.analysis import FitRequest
    from diffsweep.scaling.pipeline import load_points, resolve_source, tune_columns
    from diffsweep.scaling.suggest import Candidate
    from diffsweep.sweep import load_sweep

    request = FitRequest(n_boot=boot, seed=seed, tune=tune_columns(sweep))  # a tuned sweep: its winners
    src = resolve_source(sweep, experiment, None, None, None, log=False)
    points = load_points(src, request)
    # A run finished in MLflow is measured, not a candidate, even where launch has no record of it
    # (logged from another machine, its run directory gone): its key is among the points.
    measured = set(points["run_key"].astype(str)) if "run_key" in points else set()
    spec = load_sweep(sweep, ())
    plan = plan_sweep(SweepTarget(spec, profile=profile))
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
