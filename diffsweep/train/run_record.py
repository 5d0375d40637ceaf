"""The MLflow run of a run directory: ``run.json`` (``diffsweep.rundir``, written when the run is
created) names the run and its store, so a resume from any working directory continues the same
run in the same store; ``start_tracking`` resumes that run, or creates it, with this attempt
recorded (see ``diffsweep.tracking.logger``)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import torch

from diffsweep.config import ConfigError, dump_yaml, to_dict
from diffsweep.config.identity import flatten, run_key, run_name
from diffsweep.model import counting
from diffsweep.rundir import RUN_FILE, read_run_file, write_run_file  # noqa: F401  (RUN_FILE: re-exported)
from diffsweep.tracking import tags as tag
from diffsweep.tracking.logger import MlflowTracker, NullTracker, Tracker
from diffsweep.tracking.provenance import source_tags
from diffsweep.tracking.store import ensure_experiment, tracking_uri
from diffsweep.train.distributed import World


def run_tracking_uri(run_dir: Path) -> str:
    """Where this run is tracked: the store its ``run.json`` names (so a resume from another
    working directory finds it), unless ``MLFLOW_TRACKING_URI`` names another one (an error)."""
    run_file = read_run_file(run_dir)
    if run_file is None:
        return tracking_uri()
    recorded = run_file.tracking_uri
    asked = os.environ.get("MLFLOW_TRACKING_URI")
    if asked and asked != recorded:
        raise ConfigError("MLFLOW_TRACKING_URI", f"{asked} is not where {run_dir} is tracked ({recorded}); "
                          "unset it or set it to that store")
    return recorded


def start_tracking(config, run_dir, uri, experiment, state, resume_path, world: World, extra_tags) -> Tracker:
    """The run's tracker: the checkpoint's (or run.json's) MLflow run resumed, or a new one; either
    way with this attempt recorded."""
    if world.rank != 0:
        return NullTracker()
    source = source_tags()
    attempt = {key.removeprefix("diffsweep."): value for key, value in source.items() if key.startswith("diffsweep.")}
    attempt |= {"first_step": str(state["step"] + 1 if state else 1), "processes": str(world.world_size),
                "threads": str(torch.get_num_threads()),
                "started": datetime.now(UTC).isoformat(timespec="seconds")}
    if resume_path is not None:
        attempt["checkpoint"] = str(resume_path.absolute())
    run_file = read_run_file(run_dir)
    run_id = state["mlflow_run_id"] if state else None
    if run_id is None and run_file is not None:
        run_id = run_file.run_id
    if run_id is not None:
        tracker = MlflowTracker(uri, run_id=run_id)
        tracker.resume(source, attempt)
        return tracker
    tracker = MlflowTracker(uri, experiment_id=ensure_experiment(uri, experiment))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(str(run_dir), f"cannot create the run directory ({exc.strerror})") from exc
    params = {k: str(v) for k, v in flatten(to_dict(config)).items()}
    tags = source | {
        tag.ARCH: config.model.attention.kind,
        tag.SIZE: config.model.size or "custom",
        tag.PARAMS: str(counting.num_params(config.model)),
        tag.NON_EMBEDDING_PARAMS: str(counting.num_non_embedding_params(config.model)),
        tag.FLOPS_PER_TOKEN: str(counting.train_flops_per_token(config.model, config.train.seq_len)),
        tag.RUN_KEY: run_key(config),
        tag.TOKENIZER: config.data.tokenizer.value,
        tag.RUN_DIR: str(run_dir.absolute()),
        tag.PROCESSES: str(world.world_size),  # training processes (GPUs) when the run started
        tag.THREADS: str(torch.get_num_threads()),  # CPU threads per process (OMP_NUM_THREADS)
    } | extra_tags
    tracker.start(run_name(config), params, tags, dump_yaml(config), attempt)
    assert tracker.run_id is not None  # start created the run
    write_run_file(run_dir, tracker.run_id, uri, run_key(config))
    return tracker
