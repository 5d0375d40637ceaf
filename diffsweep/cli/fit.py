"""``diffsweep fit``: scaling laws and efficiency ratios with bootstrap CIs from finished runs."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import JsonOpt, choice, flag_keys, handle_errors, name_choice, print_json
from diffsweep.config import ConfigError
from diffsweep.scaling.choices import Axis, Count, Holdout, Objective, TokenPoints
from diffsweep.scaling.laws import DEFAULT as DEFAULT_FORM
from diffsweep.scaling.laws import law_form_names
from diffsweep.scaling.schema import CSV_SCHEMA

_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_amount(text: str, flag: str = "--at") -> float:
    """'11B', '830M', '1.4e9', '360B' -> a number."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", text, flags=re.IGNORECASE)
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()] if m else math.nan
    if not 0 < value < math.inf:
        raise ConfigError(flag, f"expected a positive size like 11B, 830M or 1.4e9, got '{text}'")
    return value


# The FitRequest fields (or run_fit arguments) named otherwise than the options that set them (the
# others are the options' own: ``handle_errors``).
FLAGS = {"sweep": "--sweep"}  # the request's sweep name; ``sweep`` here is the sweep file


@handle_errors
def fit(
    sweep: Annotated[Path | None, typer.Argument(help="Sweep YAML whose runs to fit (its experiment and name).",
                                                 show_default=False)] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", help="MLflow experiment (default: the sweep's).",
                                                   show_default=False)] = None,
    sweep_name: Annotated[str | None, typer.Option("--sweep", help="Only runs launched by this sweep (its name).",
                                                   show_default=False)] = None,
    sets: Annotated[list[str] | None, typer.Option("--set", help="The --set overrides the sweep was launched with "
                                                   "(with a sweep file; repeatable).", show_default=False)] = None,
    where: Annotated[list[str] | None, typer.Option("--where", help="Filter runs: config.key=value, key!=value or "
                                                    "tags.name=value (repeatable).", show_default=False)] = None,
    csv: Annotated[Path | None, typer.Option("--csv", help="Fit a table instead (e.g. a frozen points.csv). "
                                             + CSV_SCHEMA, show_default=False)] = None,
    baseline: Annotated[str, typer.Option("--baseline", help="The reference architecture.")] = "transformer",
    candidates: Annotated[list[str] | None, typer.Option("--candidate", help="Architecture(s) compared with the "
                                                        "baseline (default: all others).", show_default=False)] = None,
    axis: Annotated[Axis, choice(Axis, "--axis", "auto | N (parameters) | D (tokens).")] = Axis.AUTO,
    form: Annotated[str, name_choice(law_form_names, "--form", "offset: E + A·x^-α | pure: A·x^-α (Kaplan) | "
                                     "chinchilla: E + A/N^α + B/D^β.")] = DEFAULT_FORM,
    objective: Annotated[Objective | None, choice(Objective, "--objective", "l2 | huber (δ=1e-3) on log loss | "
                                                  "huber_mle: Epoch AI's Huber likelihood with a free scale (its final "
                                                  "Chinchilla estimate) (default: huber for chinchilla, else l2).",
                                                  show_default=False)] = None,
    count: Annotated[Count, choice(Count, "--count", "N counts: total | non_embedding parameters.")] = Count.TOTAL,
    at: Annotated[list[str] | None, typer.Option("--at", help="Extra reference size for the ratios, e.g. 11B "
                                                 "(repeatable).", show_default=False)] = None,
    shared_e: Annotated[bool, typer.Option("--shared-e", help="One irreducible loss E for all architectures.")] = False,
    holdout: Annotated[Holdout | None, choice(Holdout, "--holdout", "largest: also fit without the largest size "
                                              "and check its observed loss against a prediction interval.",
                                              show_default=False)] = None,
    token_points: Annotated[TokenPoints, choice(TokenPoints, "--token-points", "D points: auto | final | "
                                                "checkpoints (every evaluation after warmup).")] = TokenPoints.AUTO,
    n_boot: Annotated[int, typer.Option("--boot", help="Bootstrap draws.")] = 1000,
    level: Annotated[float, typer.Option("--level", help="Confidence level.")] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Bootstrap seed.")] = 0,
    noise_sd: Annotated[float | None, typer.Option("--noise-sd", help="Known sd of log loss of one evaluation, "
                                                   "independent per point; on a size ladder (one point per run) the "
                                                   "run-to-run sd (default: from seeds, else residuals).",
                                                   show_default=False)] = None,
    run_sd: Annotated[float | None, typer.Option("--run-sd", help="Known sd of log loss of a per-run offset shared "
                                                 "by all evaluations of one run (a token scan of checkpoints; default: "
                                                 "from >= 2 runs per architecture, else the CI is curve-fit only).",
                                                 show_default=False)] = None,
    tune: Annotated[list[str] | None, typer.Option("--tune", help="Tuning column of the points (lr, warmup_steps, "
                                                  "batch_tokens, ...; repeatable): each architecture and size is fitted "
                                                  "at its best value, the choice redone in every bootstrap draw "
                                                  "(default: a tuned sweep's tune: keys).", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (default: fits/<sweep>-<axis>).",
                                             show_default=False)] = None,
    no_log: Annotated[bool, typer.Option("--no-log", help="Do not log the fit as an MLflow run.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Fit scaling laws per architecture and report how many parameters (tokens) each candidate
    needs relative to the baseline for the same loss, with bootstrap confidence intervals."""
    from diffsweep.scaling.analysis import FitRequest
    from diffsweep.scaling.pipeline import resolve_source, run_fit, tune_columns
    from diffsweep.scaling.report import print_terminal

    flags = FLAGS | _sweep_keys(sweep, experiment, sweep_name)
    with flag_keys(flags):  # every number is checked by FitRequest (diffsweep/scaling/request.py)
        request = FitRequest(
            baseline=baseline, candidates=tuple(candidates or ()), axis=axis, form=form, objective=objective,
            count=count, at=tuple(parse_amount(a) for a in at or ()), shared_e=shared_e,
            holdout=holdout is Holdout.LARGEST, token_points=token_points, n_boot=n_boot, level=level, seed=seed,
            noise_sd=noise_sd, run_sd=run_sd, tune=tuple(tune) if tune else tune_columns(sweep, sets))
    source = resolve_source(sweep, experiment, sweep_name, where, csv, log=not no_log, sets=sets)
    with flag_keys(flags):
        outcome = run_fit(source, request, out, log=not no_log)
    if json_out:
        print_json(outcome.result | {"outputs": {k: str(v) for k, v in outcome.files.items()},
                                     "mlflow_run_id": outcome.mlflow_run_id,
                                     "mlflow_run_reused": outcome.mlflow_run_reused})
        return
    outputs = {k: str(v) for k, v in outcome.files.items() if k in ("report", "plots")}
    if outcome.mlflow_run_id:
        reused = ", the earlier run of this identical fit" if outcome.mlflow_run_reused else ""
        outputs["MLflow fit run"] = f"{outcome.mlflow_run_id} (browse: diffsweep ui{reused})"
    print_terminal(outcome.result, outputs)


def _sweep_keys(sweep: Path | None, experiment: str | None, sweep_name: str | None) -> dict[str, str]:
    """With a sweep file, the experiment and sweep name come from it unless a flag gives them: an
    error about them names the file, not a flag the user did not type."""
    if sweep is None:
        return {}
    return ({} if experiment else {"experiment": str(sweep)}) | ({} if sweep_name else {"sweep": str(sweep)})
