"""The job callable: what a Slurm array task or a local worker runs for one run of a sweep.

It is submitit-checkpointable. On SIGUSR2 (preemption or the time limit, ``--signal``) the
trainer finishes the step, saves a checkpoint and returns; the job then hands the signal back to
submitit, whose handler calls ``checkpoint()`` and requeues. The requeued job is this same
callable: it resumes from the run directory's **newest** checkpoint, and the trainer continues
the MLflow run named in ``run.json``, so nothing from the first submission goes stale.

The job records its state in the run directory's ``job.json`` (``diffsweep.launch.jobfile``).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import submitit

from diffsweep.launch.jobfile import write_job_state as _write_job_state


class TrainJob(submitit.helpers.Checkpointable):
    """Train one resolved config in its run directory; resumable and requeueable."""

    def __init__(self, config: dict[str, Any], run_dir: str, experiment: str, tracking_uri: str,
                 tags: dict[str, str]) -> None:
        self.config = config
        self.run_dir = run_dir
        self.experiment = experiment
        self.tracking_uri = tracking_uri
        self.tags = tags

    def __call__(self) -> dict[str, Any]:
        from diffsweep.config import config_from_dict
        from diffsweep.train.trainer import Diverged, train

        run_dir = Path(self.run_dir)
        os.environ["MLFLOW_TRACKING_URI"] = self.tracking_uri
        job_id = _job_id()
        # With one task per GPU every task trains (torch.distributed); the first one speaks for the job.
        write_job_state = _write_job_state if _global_rank() == 0 else _skip_job_state
        write_job_state(run_dir, "running", job_id=job_id, pid=os.getpid())
        try:
            config = config_from_dict(self.config)
            result = train(config, run_dir, experiment=self.experiment, tags=self.tags)
        except Diverged as exc:  # the same config diverges again: not retried (see launch.state)
            write_job_state(run_dir, "failed", job_id=job_id, reason=f"diverged: {exc}", retryable=False)
            raise
        except BaseException as exc:
            write_job_state(run_dir, "failed", job_id=job_id, reason=f"{type(exc).__name__}: {exc}"[:2000])
            raise
        if result.status == "finished":
            write_job_state(run_dir, "finished", job_id=job_id, step=result.step, run_id=result.run_id)
            return {"status": "finished", "step": result.step, "run_id": result.run_id}
        write_job_state(run_dir, "preempted", job_id=job_id, step=result.step, reason=result.reason)
        if _global_rank() != 0:
            # The first task saves nothing more and requeues the job; the others end cleanly, so
            # srun's --kill-on-bad-exit cannot cut the first one short while it requeues.
            return {"status": "preempted", "step": result.step, "run_id": result.run_id}
        if result.signal == signal.SIGUSR2.name and _under_submitit():
            # The checkpoint is saved; let submitit's handler (restored by the trainer) requeue.
            os.kill(os.getpid(), signal.SIGUSR2)
        raise Preempted(f"stopped by {result.signal} at step {result.step} after saving a checkpoint; "
                        "launch the sweep again to resume")

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """Requeue this same job: its state lives in the run directory, not in this object."""
        return submitit.helpers.DelayedSubmission(self)


class Preempted(RuntimeError):
    """The job stopped after saving a checkpoint and was not requeued by submitit."""


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
