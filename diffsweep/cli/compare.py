"""``diffsweep compare``: a sweep's rows against a baseline row, judged against seed noise."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from diffsweep.cli.common import JsonOpt, handle_errors, print_json
from diffsweep.config import ConfigError
from diffsweep.config.decode import confidence_level


@handle_errors  # the library's fields are named as the options that set them
def compare(
    sweep: Annotated[Path, typer.Argument(help="Sweep YAML whose finished runs to compare.", show_default=False)],
    sets: Annotated[list[str] | None, typer.Option("--set", help="The --set overrides the sweep was launched with "
                                                   "(repeatable).", show_default=False)] = None,
    metric: Annotated[str, typer.Option("--metric", help="The MLflow metric compared: each run's final value.")]
    = "val/loss",
    baseline: Annotated[str | None, typer.Option("--baseline", help="The row the others are compared with, as "
                                                 "printed (default: the sweep's first row). With --probes on a sweep "
                                                 "of several sizes the default compares each size's arms with that "
                                                 "size's arm of the first kind (e.g. its Transformer), one table per "
                                                 "size; naming an arm puts every arm in one table against it.",
                                                 show_default=False)]
    = None,
    level: Annotated[float, typer.Option("--level", help="Confidence level of the differences' CIs.")] = 0.95,
    probes: Annotated[bool, typer.Option("--probes", help="Compare the sweep's probe evaluations (`diffsweep eval "
                                         "SWEEP --probe ...`) instead: the paper's tables across arms, written to "
                                         "--out and logged as an MLflow run.")] = False,
    step: Annotated[int | None, typer.Option("--step", help="With --probes: the evaluated checkpoint step "
                                             "(default: each run's newest evaluated step).", show_default=False)]
    = None,
    out: Annotated[Path | None, typer.Option("--out", help="With --probes: output folder (default: "
                                             "compare/<sweep>-probes): new, empty, or one an earlier compare "
                                             "--probes wrote (replaced); anything else is refused.",
                                             show_default=False)] = None,
    no_log: Annotated[bool, typer.Option("--no-log", help="With --probes: do not log the comparison as an MLflow "
                                         "run.")] = False,
    untuned: Annotated[bool, typer.Option("--untuned", help="On a tuned sweep (tune:), compare every candidate "
                                          "as a row of its own instead of each cell at its best.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="On a tuned sweep: draw each cell's metric against "
                                              "its tuning value (seed CIs, best starred, diverged and spiking "
                                              "candidates marked) into this new PNG file.", show_default=False)]
    = None,
    only: Annotated[str | None, typer.Option("--only", help="Only runs whose name or key matches this regex, "
                                             "e.g. one size of a ladder: --only tiny-m.", show_default=False)]
    = None,
    json_out: JsonOpt = False,
) -> None:
    """Each row's mean over its seeds and its difference from the baseline row with a confidence
    interval from the seed-to-seed spread: within or beyond seed noise. On a tuned sweep, each cell
    (kind x size x switches) at its best candidate, the choice of the best inside the interval.
    With --probes, the same for every table of the probes the sweep was evaluated with."""
    from diffsweep.compare.runs import compare_sweep
    from diffsweep.sweep import expand, load_sweep
    from diffsweep.sweep.expand import select
    from diffsweep.tracking.store import existing_store, tracking_uri

    confidence_level(level, "--level")
    spec = load_sweep(sweep, sets or ())  # the runs of the sweep as launched, --set included
    _check_options(sweep, spec.tune, probes=probes, metric=metric, untuned=untuned, step=step, out=out, no_log=no_log,
                   plot=plot)
    runs = select(expand(spec).runs, only, sweep)
    store = existing_store(tracking_uri())
    if probes:
        _probes(store, spec, runs, baseline, step, level, out, not no_log, json_out)
    elif spec.tune and not untuned:
        _tuned(store, spec, runs, metric, baseline, level, plot, json_out)
    elif json_out:
        print_json(compare_sweep(store, spec, runs, metric=metric, baseline=baseline, level=level).to_dict())
    else:
        _print(compare_sweep(store, spec, runs, metric=metric, baseline=baseline, level=level))


def _check_options(sweep: Path, tune: object, *, probes: bool, metric: str, untuned: bool, step: int | None,
                   out: Path | None, no_log: bool, plot: Path | None) -> None:
    """Refuse the options that do not go with --probes, with each other or with the sweep (``tune``:
    its tune: section): the one place they are validated."""
    if not probes:
        for flag, given in (("--step", step is not None), ("--out", out is not None), ("--no-log", no_log)):
            if given:
                raise ConfigError(flag, "applies only with --probes")
    elif metric != "val/loss":
        raise ConfigError("--metric", "does not apply with --probes (each probe's table says what it compares)")
    elif untuned:
        raise ConfigError("--untuned", "does not apply with --probes (probes compare runs, not cells at their best)")
    if untuned and not tune:
        raise ConfigError("--untuned", f"applies only to a tuned sweep; {sweep} has no tune: (every run is a row)")
    if plot is not None:
        from diffsweep.compare.tuned_plot import check_plot_path

        if probes or untuned or not tune:
            raise ConfigError("--plot", "draws a tuned sweep's cells against their tuning values: give a sweep with "
                              "tune:, without --probes or --untuned")
        check_plot_path(plot)


def _tuned(store: Any, spec: Any, runs: list, metric: str, baseline: str | None, level: float, plot: Path | None,
           json_out: bool) -> None:
    """A tuned sweep: each cell at its best candidate against the baseline's best (and --plot)."""
    from diffsweep.compare.tuned import compare_tuned_sweep

    data = compare_tuned_sweep(store, spec, runs, metric=metric, baseline=baseline, level=level).to_dict()
    if plot is not None:
        from diffsweep.compare.tuned_plot import write_plot

        data["plot"] = str(write_plot(data, plot))
    if json_out:
        print_json(data)
    else:
        _print_tuned(data)


def _num(x: float | None, sign: str = "") -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:{sign}.4f}"


def _echo_table(title: str, header: list[str], table: list[list[str]], left: tuple[int, ...]) -> None:
    """A title line, then ``header`` and ``table`` in aligned columns (``left``: left-aligned ones)."""
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    typer.echo(title)
    for row in [header, *table]:
        typer.echo("  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    typer.echo("")


def _echo_readings(data: dict, rows: str) -> None:
    """Each row's sentence, the rows missing, and the line the verdicts rest on."""
    for r in data[rows]:
        typer.echo(r["sentence"])
    if data["missing"]:
        typer.echo(f"missing (no finished run): {', '.join(data['missing'])}")
    typer.echo(data["noise"])


def _print(result) -> None:
    data = result.to_dict()
    level = f"{data['level']:.0%}"
    header = ["row", "seeds", "mean", "seed sd", "Δ vs baseline", f"{level} CI", "verdict"]
    table = [[r["row"] + (" (baseline)" if r["row"] == data["baseline"] else ""),
              f"{r['n']}/{r['planned']}" if r["n"] < r["planned"] else str(r["n"]),
              _num(r["mean"]), _num(r["sd"]), "-" if r["row"] == data["baseline"] else _num(r["delta"], "+"),
              "-" if r["lo"] is None else f"{r['lo']:+.4f} to {r['hi']:+.4f}",
              "" if r["row"] == data["baseline"] else r["verdict"]] for r in data["rows"]]
    table += [[label, "0", "-", "-", "-", "-", "missing: no finished run"] for label in data["missing"]]
    _echo_table(f"{data['sweep']}: final {data['metric']} of each row's finished runs (experiment "
                f"{data['experiment']})", header, table, (0, 6))
    _echo_readings(data, "rows")


def _print_tuned(data: dict) -> None:
    level = f"{data['level']:.0%}"
    header = ["cell", "best", "seeds", "mean", "Δ vs baseline", f"{level} CI", "verdict"]
    table = [[c["cell"] + (" (baseline)" if c["cell"] == data["baseline"] else ""), c["winner"], str(c["n"]),
              _num(c["mean"]), "-" if c["cell"] == data["baseline"] else _num(c["delta"], "+"),
              "-" if c["lo"] is None else f"{c['lo']:+.4f} to {c['hi']:+.4f}",
              "" if c["cell"] == data["baseline"] else c["verdict"]] for c in data["cells"]]
    table += [[label, "-", "0", "-", "-", "-", "missing: no finished run"] for label in data["missing"]]
    _echo_table(f"{data['sweep']}: final {data['metric']} of each cell at its best {', '.join(data['tune'])} "
                f"(experiment {data['experiment']})", header, table, (0, 1, 6))
    typer.echo("candidates (mean over their seeds; * the best, with the share of draws in which it stayed best):")
    for c in data["cells"]:
        shown = []
        for k in c["candidates"]:
            seeds = f"{k['n']}/{k['planned']}" if k["n"] < k["planned"] else str(k["n"])
            star = "" if k["candidate"] != c["winner"] else " *" if c["kept"] is None else f" * ({c['kept']:.0%})"
            marks = [f"{k['diverged']} diverged"] if k["diverged"] else []
            marks += [f"{k['spikes']} spike{'s' if k['spikes'] != 1 else ''}"] if k["spikes"] else []
            marks += [f"{k['grad_spikes']} grad-norm spike{'s' if k['grad_spikes'] != 1 else ''}"] \
                if k["grad_spikes"] else []
            shown.append(f"{k['candidate']} {_num(k['mean'])} ({seeds}){star}"
                         + (f" [{', '.join(marks)}]" if marks else ""))
        typer.echo(f"  {c['cell']}: " + ", ".join(shown))
    typer.echo("")
    typer.echo("sensitivity:")
    for c in data["cells"]:
        typer.echo(f"  {c['sensitivity']}")
    typer.echo("")
    _echo_readings(data, "cells")
    if "plot" in data:
        typer.echo(f"written: {data['plot']}")


def _probes(uri, spec, runs, baseline, step, level, out, log, json_out) -> None:
    from diffsweep.compare.probes import compare_probes
    from diffsweep.eval.probe import get_probe

    def comparisons(name: str):
        try:
            return get_probe(name).comparisons
        except ConfigError:  # a probe of a package not installed here
            return ()

    result = compare_probes(uri, spec, runs, comparisons, baseline=baseline, step=step, level=level, out=out, log=log)
    if json_out:
        print_json(result.to_dict())
        return
    from diffsweep.compare.probe_report import group_heading, group_markdown, sections

    for tables in sections(result.tables):
        typer.echo(f"{tables[0].probe}: {tables[0].spec.title}")
        for t in tables:
            heading = group_heading(t, result)
            if heading:
                typer.echo(f"  {heading}")
            for line in group_markdown(t, result):
                typer.echo("  " + line)
        typer.echo("")
    for note in result.notes:
        typer.echo(f"note: {note}")
    typer.echo(f"written: {result.folder}/ ({', '.join(f.name for f in result.files)})")
    if result.mlflow_run_id:
        typer.echo(f"MLflow comparison run {result.mlflow_run_id} (browse: diffsweep ui)")
