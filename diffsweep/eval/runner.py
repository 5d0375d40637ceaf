"""Run probes on one trained checkpoint; each probe's findings become an MLflow run linked to the
training run.

Each evaluation is one MLflow run, nested under the training run (``mlflow.parentRunId``), so the
UI lists a run's evaluations beneath it, and tagged with what it measured:

- ``diffsweep.kind = eval`` (never an input to a fit or a sweep comparison of training runs);
- ``diffsweep.eval.source_run`` (the training run's id), ``.step`` (the checkpoint's step),
  ``.checkpoint`` (its path), ``.probe``, ``.settings`` (JSON), ``.run_key`` (the training
  config's key), ``.sweep`` and ``.run_name`` (copied from the training run, for ``compare``);
- ``diffsweep.eval.key``: a digest of the run key, step, probe, settings and the probe's code.
  An evaluation whose key already has a FINISHED run is skipped (``force`` runs it again), so
  evaluating a sweep twice evaluates only what is new.

Metrics are logged at the checkpoint's step (evaluations of successive checkpoints form a curve);
a probe's ``series`` are logged with their own index as the step. Tables (``<name>.json``) and
files go to the run's artifacts, and to ``<run dir>/eval/step_XXXXXXXX/<probe>/`` beside the
checkpoints when the run directory is known.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from diffsweep.eval.loading import Trained
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, settings_dict
from diffsweep.store import EVAL_KIND, check_tracking, ensure_experiment, retry_busy, source_tags, tracking_uri
from diffsweep.train.run_record import run_tracking_uri

DEFAULT_EXPERIMENT = "diffsweep"  # where a checkpoint whose training run is not in the store is evaluated


@dataclass
class Evaluation:
    """One probe on one checkpoint: ``ran`` (False: an earlier run had it, ``result`` is None)."""

    probe: str
    settings: dict[str, Any]
    step: int
    mlflow_run_id: str
    ran: bool
    result: ProbeResult | None
    seconds: float
    out_dir: Path | None


def eval_key(trained: Trained, probe: Probe, settings: Any) -> str:
    """The identity of an evaluation: the training config's key, the step, the probe, its settings
    and its code (its module's source: a changed probe measures anew)."""
    h = hashlib.sha256()
    h.update(json.dumps([trained.run_key, trained.step, probe.name, settings_dict(settings)], sort_keys=True).encode())
    h.update(inspect.getsource(sys.modules[type(probe).__module__]).encode())  # the probe's module
    return h.hexdigest()[:32]


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
    from mlflow.tracking import MlflowClient

    for probe, settings in probes:
        probe.check(settings, trained.config)
    uri = uri or store_of(trained)
    client = MlflowClient(uri)
    source = _training_run(client, trained)
    exp_id = source.info.experiment_id if source is not None else ensure_experiment(uri, DEFAULT_EXPERIMENT)
    for note in trained.notes:
        echo(f"note: {note}")
    done = []
    for probe, settings in probes:
        key = eval_key(trained, probe, settings)
        query = f"tags.`diffsweep.eval.key` = '{key}' and attributes.status = 'FINISHED'"
        same = retry_busy(partial(client.search_runs, [exp_id], query, max_results=1))
        if same and not force:
            echo(f"{probe.name}: step {trained.step} already evaluated (MLflow run {same[0].info.run_id}); skipped")
            done.append(Evaluation(probe.name, settings_dict(settings), trained.step, same[0].info.run_id, False,
                                   None, 0.0, None))
            continue
        done.append(_run_one(client, exp_id, source, trained, probe, settings, key, echo))
    return done


def _training_run(client: Any, trained: Trained) -> Any:
    """The training run's MLflow run, or None if this store does not have it."""
    from mlflow.exceptions import MlflowException

    if trained.mlflow_run_id is None:
        return None
    try:
        return client.get_run(trained.mlflow_run_id)
    except MlflowException:
        return None


def _run_one(client: Any, exp_id: str, source: Any, trained: Trained, probe: Probe, settings: Any, key: str,
             echo: Callable[[str], None]) -> Evaluation:
    from mlflow.entities import Metric, Param

    source_tags_ = source.data.tags if source is not None else {}
    train_name = source_tags_.get("mlflow.runName") or trained.checkpoint.parent.parent.name
    plain = settings_dict(settings)
    tags = source_tags() | {
        "diffsweep.kind": EVAL_KIND,
        "diffsweep.eval.key": key,
        "diffsweep.eval.probe": probe.name,
        "diffsweep.eval.settings": json.dumps(plain, sort_keys=True),
        "diffsweep.eval.step": str(trained.step),
        "diffsweep.eval.checkpoint": str(trained.checkpoint.absolute()),
        "diffsweep.eval.run_key": trained.run_key,
        "diffsweep.eval.run_name": train_name,
        "diffsweep.eval.kind": trained.config.model.attention.kind.value,
    }
    for name in ("diffsweep.sweep", "diffsweep.sweep_run"):
        if name in source_tags_:
            tags[name.replace("diffsweep.", "diffsweep.eval.")] = source_tags_[name]
    if source is not None:
        tags |= {"diffsweep.eval.source_run": source.info.run_id, "mlflow.parentRunId": source.info.run_id}
    run = retry_busy(lambda: client.create_run(exp_id, run_name=f"eval {probe.name} {train_name} step {trained.step}",
                                               tags=tags))
    run_id = run.info.run_id
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"diffsweep-eval-{probe.name}-") as tmp:
        out_dir = Path(tmp)
        try:
            ctx = EvalContext(model=trained.model, config=trained.config, tokenizer=trained.tokenizer,
                              val_tokens=trained.dataset.split("val"), device=trained.device,
                              autocast_dtype=trained.autocast_dtype, out_dir=out_dir, seed=trained.config.train.seed)
            result = probe.run(ctx, settings)
            seconds = time.monotonic() - started
            for name, rows in result.tables.items():
                (out_dir / f"{name}.json").write_text(json.dumps(rows, indent=1) + "\n")
            now = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now, trained.step) for k, v in result.metrics.items()]
            metrics.append(Metric("eval/seconds", seconds, now, trained.step))
            metrics += [Metric(k, float(v), now, int(i)) for k, curve in result.series.items() for i, v in curve.items()]
            params = [Param(f"{probe.name}.{k}", json.dumps(v) if not isinstance(v, str) else v) for k, v in plain.items()]
            params += [Param("step", str(trained.step)), Param("probe", probe.name)]
            for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics a batch
                retry_busy(partial(client.log_batch, run_id, metrics=metrics[i: i + 1000],
                                   params=params if i == 0 else []))
            if result.notes:
                retry_busy(lambda: client.set_tag(run_id, "mlflow.note.content", "\n".join(result.notes)))
            if any(out_dir.iterdir()):
                retry_busy(lambda: client.log_artifacts(run_id, str(out_dir)))
            kept = _keep(out_dir, trained, probe.name)
        except BaseException as exc:
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            retry_busy(lambda: client.set_terminated(run_id, status=status))
            raise
    retry_busy(lambda: client.set_terminated(run_id, status="FINISHED"))
    for note in result.notes:
        echo(f"{probe.name}: note: {note}")
    echo(f"{probe.name}: step {trained.step} evaluated in {seconds:.1f} s (MLflow run {run_id})")
    return Evaluation(probe.name, plain, trained.step, run_id, True, result, seconds, kept)


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
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
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
