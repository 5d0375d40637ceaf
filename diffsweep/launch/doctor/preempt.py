"""``diffsweep doctor --preempt``: a tiny training job goes through preemption as a sweep's would.

The job is diffsweep's own (``diffsweep.launch.jobs.job.TrainJob``, with the parameters a launch
gives it): a tiny-xs model on a byte-level dataset made here from text that ships with Python
(``pydoc_data``). Once it has saved a checkpoint it gets USR2, as Slurm sends on preemption
(``scancel --signal=USR2``); it must save, be requeued by Slurm (same job id, a second start),
resume from its checkpoint and finish the same MLflow run, with every step's loss logged once.
"""

from __future__ import annotations

import time
from pathlib import Path

from diffsweep import slurm
from diffsweep.launch.doctor.jobs import Check, doctor_executor, doctor_resources, submit
from diffsweep.launch.doctor.probe import EXPERIMENT
from diffsweep.launch.profiles import Profile
from diffsweep.rundir import read_job_state, run_info
from diffsweep.tracking import tags as tag

STEPS = 300  # long enough to be signalled mid-way; a few seconds of training on a CPU
CHECKPOINT_EVERY = 10
NAME = "preemption"


def tiny_dataset(root: Path) -> Path:
    """A byte-level dataset of CPython's pydoc topics (stdlib text), in ``root/data``."""
    import pydoc_data.topics

    from diffsweep.config import TokenizerKind
    from diffsweep.data.prepare import prepare
    from diffsweep.data.sources import Document

    source = root / "topics.txt"
    topics = sorted(pydoc_data.topics.topics.items())
    source.write_text("\n".join(text for _, text in topics))
    prepare([Document(name, text, source) for name, text in topics], root / "data", TokenizerKind.BYTES)
    return root / "data"


def tiny_config(dataset: Path) -> dict:
    """The tiny run's resolved config, as a job gets it."""
    from diffsweep.config import load_config, to_dict
    from diffsweep.data.dataset import META_FILE, read_meta

    vocab = read_meta(dataset / META_FILE).vocab_size
    overrides = [f"data.path={dataset}", "data.tokenizer=bytes", "model.size=tiny-xs", f"model.vocab_size={vocab}",
                 "train.seq_len=32", "train.batch_tokens=128", "train.micro_batch_size=2",
                 f"train.max_steps={STEPS}", "train.warmup_steps=2", f"train.eval_every={STEPS}",
                 "train.eval_tokens=256", f"train.checkpoint_every={CHECKPOINT_EVERY}", "train.keep_checkpoints=2",
                 "train.log_every=1"]
    return to_dict(load_config(None, overrides))


def check_preemption(profile: Profile, work: Path, *, timeout_s: float) -> Check:
    """Train the tiny run as a Slurm job, preempt it once it has a checkpoint, and check that it is
    requeued and finishes the same MLflow run with steps 1..STEPS logged once each."""
    from diffsweep.launch.jobs.job import TrainJob
    from diffsweep.tracking.store import check_tracking, ensure_experiment, tracking_uri

    root = work / "preempt"
    root.mkdir()
    uri = tracking_uri()
    try:
        check_tracking(uri)
        ensure_experiment(uri, EXPERIMENT)
        dataset = tiny_dataset(root)
        config = tiny_config(dataset)
    except Exception as exc:  # noqa: BLE001 (reported as the check's failure)
        return Check(NAME, False, f"could not set up the tiny run ({type(exc).__name__}: {exc})"[:400],
                     "fix the checks above (the MLflow store, the run directory); else report this as a bug")
    run_dir = root / "run"
    gpus = min(1, profile.gpus_per_node)
    executor = doctor_executor(profile, root / "jobs", doctor_resources(profile, 1, gpus), "diffsweep-doctor-preempt")
    start = time.monotonic()
    try:
        job = submit(executor, TrainJob(config, str(run_dir), EXPERIMENT, uri, {tag.KIND: tag.DOCTOR_KIND}))
    except Exception as exc:  # noqa: BLE001 (sbatch refused it)
        return Check(NAME, False, f"sbatch refused the training job: {str(exc).strip()[:300]}",
                     f"fix profile {profile.name}'s slurm: settings so sbatch accepts its jobs")

    def fail(what: str, fix: str) -> Check:
        slurm.cancel_quietly(job.job_id)
        return Check(NAME, False, f"job {job.job_id}: {what}", fix)

    logs = f"read the job's log: {job.paths.stdout} and .err"
    if not _wait(lambda: _checkpoints(run_dir) or _state(run_dir) in ("finished", "failed"), start, timeout_s):
        return fail(f"no checkpoint within {timeout_s:.0f} s ({_state(run_dir) or 'not started'})",
                    f"{logs}; or pass a longer --timeout")
    if _state(run_dir) != "running":
        return fail(f"{_state(run_dir)} before it could be preempted", logs)
    run_id = info.run_id if (info := run_info(run_dir)) else None
    slurm.send_signal(job.job_id, "USR2")
    signalled = time.monotonic()
    if not _wait(lambda: _state(run_dir) in ("finished", "failed"), start, timeout_s + 120):
        state = read_job_state(run_dir)
        return fail(f"not finished {time.monotonic() - signalled:.0f} s after USR2 (job.json: "
                    f"{state.state if state else None}, starts {state.starts if state else None})",
                    f"{logs}; a requeued job that stays PENDING (BeginTime) waits for Slurm's cred_expire and "
                    "scheduler interval; `scontrol show job ID` says why")
    state = read_job_state(run_dir)
    if state is None or state.state != "finished":
        return fail(f"{state.state if state else None}: {state.reason if state else None}"[:400], logs)
    if state.starts < 2:
        return Check(NAME, False, f"job {job.job_id} finished without being requeued (it started once)",
                     "Slurm must requeue preempted jobs: JobRequeue=1 in slurm.conf, or jobs asking --requeue "
                     f"(diffsweep's do); {logs}")
    if run_id is None or state.run_id != run_id:
        return Check(NAME, False, f"the requeued job finished MLflow run {state.run_id}, not the "
                     f"preempted job's {run_id}", f"run.json in the run directory must survive a requeue; {logs}")
    steps = _metric_steps(uri, run_id)
    if steps != list(range(1, STEPS + 1)):
        missing = sorted(set(range(1, STEPS + 1)) - set(steps))
        repeated = sorted({s for s in steps if steps.count(s) > 1})
        return Check(NAME, False, f"MLflow run {run_id} has {len(steps)} train/loss steps, missing "
                     f"{missing[:10]}, repeated {repeated[:10]}", logs)
    _delete_run(uri, run_id)
    return Check(NAME, True, f"job {job.job_id} got USR2 after a checkpoint, was requeued by Slurm, resumed and "
                 f"finished MLflow run {run_id} with steps 1..{STEPS} once each ({time.monotonic() - start:.0f} s)")


def _wait(predicate, start: float, timeout_s: float) -> bool:  # noqa: ANN001
    while time.monotonic() - start < timeout_s:
        if predicate():
            return True
        time.sleep(0.5)
    return bool(predicate())


def _checkpoints(run_dir: Path) -> bool:
    return (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("step_*"))


def _state(run_dir: Path) -> str | None:
    try:
        return state.state if (state := read_job_state(run_dir)) else None
    except Exception:  # noqa: BLE001 (a file being rewritten; asked again)
        return None


def _metric_steps(uri: str, run_id: str | None) -> list[int]:
    from diffsweep.tracking.store import mlflow_client

    if run_id is None:
        return []
    return sorted(m.step for m in mlflow_client(uri).get_metric_history(run_id, "train/loss"))


def _delete_run(uri: str, run_id: str) -> None:
    from diffsweep.tracking.store import mlflow_client

    try:
        mlflow_client(uri).delete_run(run_id)
    except Exception:  # noqa: BLE001 (a leftover doctor run is harmless)
        pass
