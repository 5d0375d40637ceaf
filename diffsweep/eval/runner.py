"""Run probes on one trained checkpoint; each probe's findings become an MLflow run linked to the
training run.

Each evaluation is one MLflow run nested under the training run (``mlflow.parentRunId``), tagged
``diffsweep.kind = eval`` (never an input to a fit or a sweep comparison of training runs) and with
what it measured (``diffsweep.eval.*``: source run, step, checkpoint, probe, settings, ...). Its key
(``diffsweep.eval.key``, from ``diffsweep.eval.identity``) digests everything the result depends on:
an evaluation whose key already has a FINISHED run is reused unless ``force``. Each evaluation is
said in one line (``Evaluation.line``; notes and details: ``Detail`` lines); metrics are logged at
the checkpoint's step, tables and files as artifacts and beside the checkpoints. See docs/eval.md,
'Commands'.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from diffsweep.eval.identity import code_digest, eval_key
from diffsweep.eval.loading import Trained
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, settings_dict
from diffsweep.fsutil import publish
from diffsweep.tracking import tags as tag
from diffsweep.tracking.provenance import source_tags
from diffsweep.tracking.results import find_run, result_run
from diffsweep.tracking.store import (
    check_tracking,
    ensure_experiment,
    mlflow_client,
    retry_busy,
    tracking_uri,
)
from diffsweep.tracking.tags import tag_is
from diffsweep.train.run_record import run_tracking_uri

DEFAULT_EXPERIMENT = "diffsweep"  # where a checkpoint whose training run is not in the store is evaluated


class Detail(str):
    """A line ``evaluate`` echoes that only ``diffsweep eval --verbose`` shows (a probe's note)."""


@dataclass
class Evaluation:
    """One probe on one checkpoint: ``ran`` (False: reused from the MLflow run ``mlflow_run_id``,
    logged at ``logged`` by code ``code``; ``result`` is None). ``headline``: the probe's headline
    metric and ``value`` its value (None if the result has none); ``capped``: setting -> what the
    data capped it to (``Capped`` as text); ``notes``: the probe's and the loading's notes."""

    probe: str
    settings: dict[str, Any]
    step: int
    mlflow_run_id: str
    ran: bool
    result: ProbeResult | None
    seconds: float
    out_dir: Path | None
    run_name: str = ""
    headline: str = ""
    value: float | None = None
    code: str = ""
    logged: str = ""
    capped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The evaluation as ``diffsweep eval --json`` prints it."""
        return {"run": self.run_name, "probe": self.probe, "settings": self.settings, "step": self.step,
                "ran": self.ran, "headline": self.headline, "value": self.value, "code": self.code,
                "logged": self.logged, "capped": self.capped, "notes": self.notes, "mlflow_run_id": self.mlflow_run_id,
                "seconds": self.seconds, "out_dir": str(self.out_dir) if self.out_dir else None,
                "metrics": self.result.metrics if self.result else None,
                "tables": self.result.tables if self.result else None}

    def line(self) -> str:
        """The one line that says this evaluation: run, step, probe, headline, evaluated or reused."""
        value = f"{self.value:.6g}" if self.value is not None else "(not measured)"
        head = f"{self.run_name} step {self.step} {self.probe}: {self.headline or 'result'} = {value}"
        if self.ran:
            how = f"evaluated in {self.seconds:.1f} s (MLflow run {self.mlflow_run_id})"
        else:  # the key holds the code digest: a reused result was computed by this same code
            how = (f"reused: logged {self.logged or 'at an unknown time'} by this same code ({self.code}) "
                   f"(MLflow run {self.mlflow_run_id}; --force evaluates again)")
        capped = "".join(f"; capped {self.probe}.{k}: {v}" for k, v in self.capped.items())
        return f"{head}; {how}{capped}"


def store_of(trained: Trained) -> str:
    """The store the run was tracked in (its ``run.json``), else ``MLFLOW_TRACKING_URI`` or ./mlflow.db."""
    uri = run_tracking_uri(trained.run_dir) if trained.run_dir is not None else tracking_uri()
    check_tracking(uri)
    return uri


def evaluate(trained: Trained, probes: list[tuple[Probe, Any]], *, uri: str | None = None, force: bool = False,
             echo: Callable[[str], None] = print) -> list[Evaluation]:
    """Run each ``(probe, settings)`` on ``trained`` unless its evaluation is already in the store
    (see the module); returns one ``Evaluation`` per probe, in order. Every probe's settings are
    checked against the run's config first: one that cannot run raises before anything runs."""
    for probe, settings in probes:
        probe.check(settings, trained.config)
    uri = uri or store_of(trained)
    client = mlflow_client(uri)
    source = find_run(client, trained.mlflow_run_id)
    exp_id = source.info.experiment_id if source is not None else ensure_experiment(uri, DEFAULT_EXPERIMENT)
    for note in trained.notes:
        echo(Detail(f"note: {note}"))
    train_name = (source.data.tags.get(tag.RUN_NAME) if source is not None else None) or _run_name(trained)
    done = []
    for probe, settings in probes:
        code = code_digest(probe)
        key = eval_key(trained, probe, settings, code)
        query = f"{tag_is(tag.EVAL_KEY, key)} and attributes.status = 'FINISHED'"
        same = retry_busy(partial(client.search_runs, [exp_id], query, max_results=1))
        if same and not force:
            e = _reused(same[0], trained, probe, settings, train_name, code)
        else:
            e = _run_one(client, exp_id, source, trained, probe, settings, key, code, train_name, echo)
        e.notes[:0] = trained.notes
        echo(e.line())
        done.append(e)
    return done


def _run_name(trained: Trained) -> str:
    """The run's name where the store does not have it: its directory's name."""
    return trained.run_dir.name if trained.run_dir is not None else trained.checkpoint.parent.parent.name


def _reused(run: Any, trained: Trained, probe: Probe, settings: Any, train_name: str, code: str) -> Evaluation:
    """The evaluation an earlier MLflow run ``run`` logged, as this command reports it."""
    tags = run.data.tags
    headline = probe.headline_metric(settings)
    ended = run.info.end_time or run.info.start_time
    logged = datetime.fromtimestamp(ended / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC") if ended else ""
    try:
        capped = {str(k): str(v) for k, v in json.loads(tags.get(tag.EVAL_CAPPED, "{}")).items()}
    except (json.JSONDecodeError, AttributeError):  # a tag edited by hand: said as unknown, not trusted
        capped = {"?": "the run's diffsweep.eval.capped tag is unreadable"}
    out_dir = None
    if trained.run_dir is not None:
        kept = trained.run_dir / "eval" / f"step_{trained.step:08d}" / probe.name
        out_dir = kept if kept.is_dir() else None
    return Evaluation(probe.name, settings_dict(settings), trained.step, run.info.run_id, False, None, 0.0, out_dir,
                      run_name=train_name, headline=headline, value=run.data.metrics.get(headline),
                      code=tags.get(tag.EVAL_CODE, code), logged=logged, capped=capped)


def _run_one(client: Any, exp_id: str, source: Any, trained: Trained, probe: Probe, settings: Any, key: str,
             code: str, train_name: str, echo: Callable[[str], None]) -> Evaluation:
    source_tags_ = source.data.tags if source is not None else {}
    plain = settings_dict(settings)
    tags = source_tags() | {
        tag.KIND: tag.EVAL_KIND,
        tag.EVAL_KEY: key,
        tag.EVAL_CODE: code,
        tag.EVAL_PROBE: probe.name,
        tag.EVAL_SETTINGS: json.dumps(plain, sort_keys=True),
        tag.EVAL_STEP: str(trained.step),
        tag.EVAL_CHECKPOINT: str(trained.checkpoint.absolute()),
        tag.EVAL_RUN_KEY: trained.run_key,
        tag.EVAL_RUN_NAME: train_name,
        tag.EVAL_ATTENTION_KIND: trained.config.model.attention.kind,
    }
    for name, copy in ((tag.SWEEP, tag.EVAL_SWEEP), (tag.SWEEP_RUN, tag.EVAL_SWEEP_RUN)):  # for ``compare``
        if name in source_tags_:
            tags[copy] = source_tags_[name]
    if source is not None:
        tags |= {tag.EVAL_SOURCE_RUN: source.info.run_id, tag.PARENT_RUN: source.info.run_id}
    with (tempfile.TemporaryDirectory(prefix=f"diffsweep-eval-{probe.name}-") as tmp,
          result_run(client, exp_id, f"eval {probe.name} {train_name} step {trained.step}", tags) as run):
        started = time.monotonic()
        out_dir = Path(tmp)
        ctx = EvalContext(model=trained.model, config=trained.config, tokenizer=trained.tokenizer,
                          val_tokens=trained.dataset.split("val"), device=trained.device,
                          autocast_dtype=trained.autocast_dtype, out_dir=out_dir, seed=trained.config.train.seed)
        result = probe.run(ctx, settings)
        seconds = time.monotonic() - started
        for name, rows in result.tables.items():
            (out_dir / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
        metrics = [(k, v, trained.step) for k, v in result.metrics.items()]
        metrics.append(("eval/seconds", seconds, trained.step))
        metrics += [(k, v, int(i)) for k, curve in result.series.items() for i, v in curve.items()]
        params = {f"{probe.name}.{k}": json.dumps(v) if not isinstance(v, str) else v for k, v in plain.items()}
        params |= {"step": str(trained.step), "probe": probe.name}
        params |= {f"{probe.name}.{k}.used": json.dumps(c.used) for k, c in result.capped.items()}
        capped = {k: str(c) for k, c in result.capped.items()}
        if capped:
            run.set_tag(tag.EVAL_CAPPED, json.dumps(capped))
        run.log(metrics, params)
        if result.notes:
            run.set_tag(tag.NOTE, "\n".join(result.notes))
        run.attach(out_dir)
        kept = _keep(out_dir, trained, probe.name)
    run_id = run.run_id
    for note in result.notes:
        echo(Detail(f"{probe.name}: note: {note}"))
    headline = probe.headline_metric(settings)
    ended = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return Evaluation(probe.name, plain, trained.step, run_id, True, result, seconds, kept, run_name=train_name,
                      headline=headline, value=result.metrics.get(headline), code=code, logged=ended,
                      capped=capped, notes=[f"{probe.name}: {note}" for note in result.notes])


def _keep(out_dir: Path, trained: Trained, probe: str) -> Path | None:
    """A copy of the probe's files beside the checkpoints (``<run dir>/eval/step_XXXXXXXX/<probe>``),
    replacing an earlier one; None when the run directory is unknown or not writable."""
    if trained.run_dir is None:
        return None
    target = trained.run_dir / "eval" / f"step_{trained.step:08d}" / probe
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{probe}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(out_dir, tmp)
        publish(tmp, target)
    except OSError:
        return None
    return target





def evaluate_run(run_dir: Path, probes: list[tuple[Probe, Any]], steps: list[int] | tuple[int, ...] = (), *,
                 uri: str | None = None, force: bool = False, echo: Callable[[str], None] = print) -> list[Evaluation]:
    """``evaluate`` on a run directory's newest checkpoint, then on its checkpoints of ``steps``
    (those still kept: a missing one is said, not an error)."""
    from diffsweep.eval.loading import load_trained
    from diffsweep.train.checkpoint import checkpoint_path, list_checkpoints

    newest = load_trained(run_dir)
    done = evaluate(newest, probes, uri=uri, force=force, echo=echo)
    kept = {p.name.removesuffix(".pt"): p for p in list_checkpoints(run_dir / "checkpoints")}
    for step in sorted(set(steps) - {newest.step}):
        path = kept.get(checkpoint_path(run_dir / "checkpoints", step).name)
        if path is None:
            echo(f"step {step}: no checkpoint kept (train.checkpoint_every and train.keep_checkpoints decide which "
                 "are); not evaluated")
            continue
        done += evaluate(load_trained(path), probes, uri=uri, force=force, echo=echo)
    return done
