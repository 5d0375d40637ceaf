"""``diffsweep suggest``: which runs would narrow the efficiency ratio's CI the most per GPU-hour."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import JsonOpt, flag_keys, handle_errors, print_json
from diffsweep.config import ConfigError

# The library's fields named otherwise than the options that set them (the others are the
# options' own: ``handle_errors``); those the sweep or fit file sets are named by it.
FLAGS = {"candidates": "--candidate", "n_boot": "--boot", "only": "--launch", "launch": "--launch",
         "source": "SWEEP_OR_FIT", "points": "SWEEP_OR_FIT", "shared_e": "SWEEP_OR_FIT", "noise_sd": "SWEEP_OR_FIT",
         "baseline": "SWEEP_OR_FIT"}


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
    from diffsweep.scaling.suggest.request import SuggestRequest, suggest_runs

    if top < 1:
        raise ConfigError("--top", f"expected at least 1 row, got {top}")
    with flag_keys(FLAGS):  # --boot and --seed: FitRequest (diffsweep/scaling/request.py)
        request = SuggestRequest(
            source=source, candidate=candidate, ref=parse_amount(at, "--at") if at is not None else None,
            extra_sizes=tuple(parse_amount(s, "--sizes") for part in sizes or () for s in part.split(",") if s.strip()),
            seeds=not no_seeds, cooldown=cooldown, budget=budget, max_runs=max_runs, draws=draws, boot=boot, seed=seed,
            profile=profile, experiment=experiment, tune=tuple(tune or ()), launch=launch)
        out = suggest_runs(request, echo=(lambda _m: None) if json_out else typer.echo,
                           warn=lambda m: typer.echo(f"warning: {m}", err=True))
    if json_out:
        print_json(out)
        return
    _render(out, top)


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
