"""``diffsweep eval``: the paper's probes on a trained run's checkpoint, logged to MLflow."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from diffsweep.cli.common import handle_errors, name_choice
from diffsweep.cli.sweep import ExecutorOpt, OnlyOpt, OutOpt, ProfileOpt, SweepSetOpt
from diffsweep.config import ConfigError
from diffsweep.eval.probe import probe_names

FLAGS = {"probe_settings": "--probe-set", "json": "--json"}  # fields named otherwise than their options


@handle_errors(flags=FLAGS)
def eval_(
    target: Annotated[Path, typer.Argument(help="A run directory (its newest checkpoint), one checkpoint "
                                           "(RUN_DIR/checkpoints/step_XXXXXXXX), or a sweep YAML (every "
                                           "finished run's newest checkpoint).", show_default=False)],
    probes: Annotated[list[str] | None, name_choice(
        probe_names, "--probe", "A probe to run (repeat for several): {choices}.", metavar="PROBE",
        show_default=False)] = None,
    settings: Annotated[list[str] | None, typer.Option(
        "--probe-set", help="A probe's setting, PROBE.KEY=VALUE (repeatable), e.g. needle.samples=10; "
        "docs/eval.md lists them.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Run probes already logged for this checkpoint again.")
                     ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the evaluations as JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print each evaluation's notes and main "
                                          "metrics (all of them are in its files and MLflow run).")] = False,
    out: OutOpt = None,
    only: OnlyOpt = None,
    sets: SweepSetOpt = None,
    launch: Annotated[bool, typer.Option("--launch", help="A sweep: evaluate as jobs of its scheduler (Slurm "
                                         "arrays, or the local queue) with each run's training resources, "
                                         "instead of one after another here; returns once submitted "
                                         "(see --wait).")] = False,
    wait: Annotated[bool, typer.Option("--wait", help="With --launch: wait until the evaluation jobs end, "
                                       "then say what each evaluated (exit 1 if a job or a probe failed).")
                    ] = False,
    profile: ProfileOpt = None,
    executor: ExecutorOpt = None,
) -> None:
    """Run probes on a trained checkpoint: each is an MLflow run nested under the training run.

    One line per run and probe: its headline metric, and whether it was evaluated or reused (a
    probe already logged for the same checkpoint, settings and code; see --force). Its tables and
    plots are the MLflow run's artifacts, also kept in RUN_DIR/eval/step_XXXXXXXX/PROBE/.
    Exit status: 0 done, 2 bad input (nothing runs), 3 a missing package or GPU.
    """
    from diffsweep.eval.probe import probe_requests

    requests = probe_requests(probes or [], settings or [])  # before torch: bad input fails in a blink
    _check_target(target, launch=launch, wait=wait, force=force, as_json=as_json, profile=profile,
                  executor=executor, only=only, out=out, sets=sets)

    from diffsweep.launch.api import eval_target

    echo, plain = _echoes(as_json, verbose)
    if launch:
        _launch(target, requests, wait=wait, profile=profile, executor=executor, only=only, out=out, sets=sets,
                echo=echo)
        return
    done, num_runs, waiting = eval_target(target, requests, force=force, echo=echo, only=only, out=out, sets=sets)
    if verbose:
        for e in done:
            _details(e, plain)
    else:  # each distinct note once (the same note on every run of a sweep is one line)
        for note in dict.fromkeys(n for e in done for n in e.notes):
            plain(f"note: {note}")
    plain(counts(done, num_runs, waiting))
    if as_json:
        typer.echo(json.dumps([e.to_dict() for e in done], indent=1))


def _echoes(as_json: bool, verbose: bool) -> tuple[Callable[[str], None], Callable[[str], None]]:
    """What prints the runner's lines (the details: notes, metrics, a sweep's run headers only with
    --verbose), and what prints the command's own (on stderr with --json)."""
    from diffsweep.eval.runner import Detail

    plain = (lambda line: typer.echo(line, err=True)) if as_json else typer.echo

    def echo(line: str) -> None:
        if verbose or not isinstance(line, Detail):
            plain(line)

    return echo, plain


def _check_target(target: Path, *, launch: bool, wait: bool, force: bool, as_json: bool, **sweep_only: Any) -> None:
    """Refuse a TARGET that is not a run directory, a checkpoint or a sweep YAML, and the options
    that do not go with it or with each other: the one place TARGET, --launch, --wait,
    --force with --launch, --json with --launch and the sweep-only options are validated."""
    is_sweep = target.suffix in (".yaml", ".yml")
    if not target.exists():
        raise ConfigError(str(target), "not found; expected a run directory, a checkpoint (step_XXXXXXXX) or a "
                          "sweep YAML")
    if not is_sweep and not target.is_dir() and target.suffix != ".pt":
        raise ConfigError(str(target), "is a file that is not a sweep YAML; expected a run directory, a checkpoint "
                          "(step_XXXXXXXX) or a sweep YAML")
    if (launch or sweep_only["profile"] or sweep_only["executor"]) and not is_sweep:
        raise ConfigError("launch", "--launch, --profile and --executor are for a sweep YAML; a run directory or "
                          "checkpoint is evaluated here")
    given = [f"--{k}" if k != "sets" else "--set" for k in ("only", "out", "sets") if sweep_only[k]]
    if given and not is_sweep:
        raise ConfigError(given[0], "is for a sweep YAML; a run directory or checkpoint is evaluated as it is")
    if wait and not launch:
        raise ConfigError("wait", "only with --launch (without it, evaluation runs here and the command returns "
                          "when it is done)")
    if launch and force:
        raise ConfigError("force", "not with --launch: launched jobs skip what the store already has; "
                          "run diffsweep eval SWEEP --force here to evaluate again")
    if launch and as_json:
        raise ConfigError("json", "not with --launch (it prints what was submitted, and with --wait what each job "
                          "evaluated); run diffsweep eval SWEEP --json here once they are done")


def counts(done: list[Any], num_runs: int, waiting: list[str]) -> str:
    """The closing line: how many evaluations were asked for, evaluated, reused and capped."""
    ran = sum(e.ran for e in done)
    capped = sum(bool(e.capped) for e in done)
    line = (f"{len(done)} evaluation{'s' if len(done) != 1 else ''} of {num_runs} finished "
            f"run{'s' if num_runs != 1 else ''}: {ran} evaluated, {len(done) - ran} reused")
    if capped:
        line += f", {capped} with a setting capped by the data"
    if waiting:
        line += f"; {len(waiting)} run{'s' if len(waiting) != 1 else ''} not finished yet (run this again once they are)"
    return line


def _details(e: Any, echo: Callable[[str], None]) -> None:
    """--verbose: an evaluation's main metrics (up to 24) and where its files are."""
    if e.result is None:
        return
    echo(f"{e.run_name} step {e.step} {e.probe}:")
    shown = {k: v for k, v in e.result.metrics.items() if k.count("/") <= 2 and "layer_" not in k}
    for name, value in list(shown.items())[:24]:
        echo(f"  {name} = {value:.6g}")
    if e.out_dir is not None:
        echo(f"  files: {e.out_dir}")


def _launch(sweep: Path, requests: list, *, wait: bool, echo: Callable[[str], None], **choices: Any) -> None:
    """``--launch``: the finished runs' jobs submitted again with these probes; with ``wait``,
    until they end, then what each evaluated."""
    from diffsweep.cli.common import fail
    from diffsweep.cli.sweep_wait import wait_for_sweep
    from diffsweep.eval.probe import settings_dict
    from diffsweep.launch.api import SweepTarget, launch_eval
    from diffsweep.rundir import read_job_state

    target = SweepTarget.load(sweep, **choices)
    names = [probe.name for probe, _ in requests]
    plain = {probe.name: settings_dict(s) for probe, s in requests}
    submitted, waiting = launch_eval(target, tuple(names), plain, echo=echo)
    typer.echo(f"submitted {len(submitted)} evaluation jobs ({', '.join(names)})" + (
        f"; {len(waiting)} runs not finished yet" if waiting else "") + (
        "" if wait else f"; follow them with diffsweep status {sweep}, then see the evaluations in MLflow "
        "(diffsweep ui)"))
    if not wait or not submitted:
        return
    wait_for_sweep(target, sweep)  # exits 1 if a job did not finish
    failed = []
    for name, run_dir in submitted.items():
        job = read_job_state(run_dir)
        if job is not None and job.eval_error:
            failed.append(name)
            typer.echo(f"{name}: evaluation failed: {job.eval_error}")
        else:
            typer.echo(f"{name}: evaluated {', '.join(job.evaluated if job else ()) or 'nothing'}")
    if failed:
        fail(f"{len(failed)} of {len(submitted)} evaluation jobs failed a probe ({', '.join(failed)}); see "
             f"`diffsweep logs {sweep} RUN`, then run `diffsweep eval {sweep} --probe ...` for what is missing", 1)
