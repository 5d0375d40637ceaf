"""The job callable: what a Slurm array task or a local worker runs for one run of a sweep.

It is submitit-checkpointable. On SIGUSR2 (preemption or the time limit, ``--signal``) the
trainer finishes the step, saves a checkpoint and returns; the job then hands the signal back to
submitit, whose handler calls ``checkpoint()`` and requeues. The requeued job is this same
callable: it resumes from the run directory's **newest** checkpoint, and the trainer continues
the MLflow run named in ``run.json``, so nothing from the first submission goes stale.

The job records its state in the run directory's ``job.json`` (``diffsweep.rundir``):
at each start (how many times this job has started: Slurm requeues reuse the job id and append to
its log files, so each start also prints a marker line to both), every ``STEP_EVERY_S`` seconds
while training (the step and the measured seconds per step, for ``status`` and ``launch --wait``),
and at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit

from diffsweep.rundir import EvalRequest, now, read_job_state
from diffsweep.rundir import write_job_state as _write_job_state

STEP_EVERY_S = 10.0  # job.json's step is rewritten at most this often (a small file, read by status)


class TrainJob(submitit.helpers.Checkpointable):
    """Train one resolved config in its run directory; resumable and requeueable."""

    def __init__(self, config: dict[str, Any], run_dir: str, experiment: str, tracking_uri: str,
                 tags: dict[str, str], evals: EvalRequest | None = None, branch_from: str | None = None,
                 store: list[str] | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self.tags = tags
        self.evals = evals  # the sweep's eval: section, run once trained (``launch.submit.eval_request``)
        self.branch_from = branch_from  # a cooldown branch: the parent's checkpoint it starts from
        # a parent of cooldown branches: the sweep's ledger (``AttemptStore.spec``), whose held
        # branches it releases once it has saved their branch points (``diffsweep.launch.gates``)
        self.store = store

    def __call__(self) -> dict[str, Any]:
        from diffsweep.train.preemption import catch_early_sigterm

        catch_early_sigterm()  # first: a cancel while the imports below run must not be lost
        from diffsweep.config import config_from_dict
        from diffsweep.startup import command_process, imports_frozen
        from diffsweep.tracking.store import import_mlflow

        if _under_submitit():  # this process is the job's
            command_process()
        with imports_frozen():
            from diffsweep.train.trainer import Diverged, train

            import_mlflow(self.tracking_uri)

        run_dir = Path(self.run_dir)
        os.environ["MLFLOW_TRACKING_URI"] = self.tracking_uri
        job_id = _job_id()
        # With one task per GPU every task trains (torch.distributed); the first one speaks for the job.
        write_job_state = _write_job_state if _global_rank() == 0 else _skip_job_state
        before = read_job_state(run_dir)
        starts = before.starts + 1 if job_id is not None and before is not None and before.job_id == job_id else 1
        if _global_rank() == 0:
            _mark_start(job_id, starts)
        ident = {"job_id": job_id, "starts": starts}  # in every record: the next start counts on from it
        running = {**ident, "pid": os.getpid(), "started": now()}
        write_job_state(run_dir, "running", **running)
        try:
            config = config_from_dict(self.config)
            total = config.train.total_steps
            release = self._releaser(config.train.checkpoint_at)
            release(0, {})  # a requeued parent may have saved a branch point before it stopped
            first: list[tuple[int, float]] = []  # the first step this start trained, and when
            last = [0.0]

            def report_step(step: int, metrics: dict[str, float]) -> None:
                clock = time.monotonic()
                if not first:
                    first.append((step, clock))
                if clock - last[0] >= STEP_EVERY_S:
                    last[0] = clock
                    (step0, clock0), pace = first[0], {}
                    if step > step0:  # measured here, for launch --wait's ETA
                        pace["seconds_per_step"] = round((clock - clock0) / (step - step0), 6)
                    write_job_state(run_dir, "running", **running, step=step, total=total, **pace)

            branch_from = getattr(self, "branch_from", None)  # a job pickled before branches has none
            result = train(config, run_dir, experiment=self.experiment, tags=self.tags,
                           branch_from=Path(branch_from) if branch_from else None, callbacks=(report_step, release))
        except Diverged as exc:  # the same config diverges again: not retried (see launch.state)
            write_job_state(run_dir, "failed", **ident, reason=f"diverged: {exc}", retryable=False)
            raise
        except BaseException as exc:
            write_job_state(run_dir, "failed", **ident, reason=f"{type(exc).__name__}: {exc}"[:2000])
            raise
        if result.status == "finished":
            evaluated = self._evaluate(run_dir, write_job_state, running, result.step, total)
            write_job_state(run_dir, "finished", **ident, step=result.step, run_id=result.run_id, **evaluated)
            return {"status": "finished", "step": result.step, "run_id": result.run_id, **evaluated}
        # status shows this reason if the job is not requeued (e.g. a stray SIGTERM)
        reason = (f"stopped by {result.signal or 'a signal'} at step {result.step} after saving a checkpoint; "
                  "launch the sweep again to resume")
        write_job_state(run_dir, "preempted", **ident, step=result.step, total=result.total_steps,
                        reason=reason)
        if _global_rank() != 0:
            # The first task saves nothing more and requeues the job; the others end cleanly, so
            # srun's --kill-on-bad-exit cannot cut the first one short while it requeues.
            return {"status": "preempted", "step": result.step, "run_id": result.run_id}
        if result.signal == signal.SIGUSR2.name and _under_submitit():
            # The checkpoint is saved; submitit's handler (restored by the trainer) requeues and
            # exits. It is called here rather than signalled: with other threads running, a signal
            # to this process may be handled after the raise below, which then ends the job first.
            handler = signal.getsignal(signal.SIGUSR2)
            if callable(handler):
                handler(signal.SIGUSR2, None)
        raise Preempted(reason)

    def _releaser(self, steps: tuple[int, ...]) -> Callable[[int, dict[str, float]], None]:
        """A step callback that releases the sweep's held cooldown branches once a checkpoint of
        ``steps`` is saved (step 0: at the job's start). It never fails the run: a failed release
        is printed, and the next branch point, a relaunch or the parent's next start retries it."""
        spec = getattr(self, "store", None)
        points = set(steps)

        def release(step: int, metrics: dict[str, float]) -> None:
            if spec is None or _global_rank() != 0 or (step and step not in points):
                return
            from diffsweep.launch.gates import release_ready
            from diffsweep.launch.jobs.attempt import load_store

            try:
                released, errors = release_ready(load_store(spec))
            except Exception as exc:  # noqa: BLE001 (training goes on; the release is retried)
                errors, released = [f"{type(exc).__name__}: {exc}"], []
            for line in errors:
                print(f"could not release the cooldown branches: {line}", file=sys.stderr, flush=True)
            if released:
                print(f"released {len(released)} cooldown branch(es) at step {step}", flush=True)

        return release

    def _evaluate(self, run_dir: Path, write_job_state: Any, running: dict[str, Any], step: int, total: int
                  ) -> dict[str, Any]:
        """The sweep's probes on the trained run (first task only; each is skipped if already in the
        store, so a requeue goes on where it stopped). A probe that fails does not fail the run:
        the error is printed and recorded as ``eval_error`` in ``job.json``; ``diffsweep eval
        SWEEP`` runs what is missing."""
        evals = getattr(self, "evals", None)  # a job pickled before evaluation requests has none
        if not evals or _global_rank() != 0:
            return {}
        from diffsweep.eval.probe import sweep_requests
        from diffsweep.eval.runner import evaluate_run

        write_job_state(run_dir, "running", **running, step=step, total=total, evaluating=list(evals.probes))
        try:
            requests = sweep_requests(list(evals.probes), evals.settings, "the sweep")
            done = evaluate_run(run_dir, requests, list(evals.steps), uri=self.tracking_uri,
                                echo=lambda line: print(line, flush=True))
        except Exception as exc:  # noqa: BLE001 (the run trained; its evaluation is retried by diffsweep eval)
            print(f"evaluation failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return {"eval_error": f"{type(exc).__name__}: {exc}"[:2000]}
        return {"evaluated": sorted({e.probe for e in done})}

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Requeue this same job: its state lives in the run directory, not in this object."""
        return submitit.helpers.DelayedSubmission(self)


class Preempted(RuntimeError):
    """The job stopped after saving a checkpoint and was not requeued by submitit."""


def _mark_start(job_id: str | None, starts: int) -> None:
    """A line in both log files at each start, so that ``diffsweep logs`` shows where a requeue begins."""
    again = f", start {starts} (after {starts - 1} requeue{'s' if starts > 2 else ''})" if starts > 1 else ""
    line = f"==> diffsweep: job {job_id} started at {now()} on {socket.gethostname()}{again} <=="
    for stream in (sys.stdout, sys.stderr):
        print(line, file=stream, flush=True)


def _under_submitit() -> bool:
    try:
        submitit.JobEnvironment()
    except RuntimeError:
        return False
    return True


def _skip_job_state(*args: Any, **kwargs: Any) -> None:
    """Tasks other than the first leave ``job.json`` to it."""


def _global_rank() -> int:
    return submitit.JobEnvironment().global_rank if _under_submitit() else 0


def _job_id() -> str | None:
    if not _under_submitit():
        return None
    return submitit.JobEnvironment().job_id
