"""What ``diffsweep doctor``'s probe jobs run (``diffsweep.launch.doctor``): in each task, report
the host, the GPUs Slurm and torch show, and the task's view of the run directory; all-reduce
across the tasks (NCCL when every task sees a GPU, else gloo); write a metric to the MLflow store
from the first task. Failures are reported in the result, not raised: the login node turns them
into the checks' lines.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Any

EXPERIMENT = "diffsweep-doctor"  # the MLflow experiment of doctor's runs (deleted once read back)
METRIC = "doctor/probe"


def probe(work: str, token: str, uri: str | None) -> dict[str, Any]:
    """What a doctor job runs in each task: reports its host, GPUs, view of ``work``; all-reduces
    across the tasks if there are several; writes a metric to ``uri`` (first task) if given."""
    import submitit
    import torch

    env = submitit.JobEnvironment()
    rank = env.global_rank
    mine = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    wrote = Path(work) / f"job-{env.job_id}-{rank}.token"
    wrote.write_text(mine)
    login = Path(work) / "login.token"
    report: dict[str, Any] = {
        "host": socket.gethostname(), "rank": rank, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_devices": torch.cuda.device_count(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "saw_token": login.is_file() and login.read_text() == token, "wrote": str(wrote), "token": mine,
    }
    if env.num_tasks > 1:
        report.update(_all_reduce(env))
    if uri is not None and rank == 0:
        report.update(_write_metric(uri))
    return report


def _all_reduce(env: Any) -> dict[str, Any]:
    import datetime

    import torch
    import torch.distributed as dist
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    cuda = torch.cuda.device_count() > env.local_rank
    backend = "nccl" if cuda else "gloo"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
        value = torch.tensor([env.global_rank + 1.0], device=f"cuda:{env.local_rank}" if cuda else "cpu")
        dist.all_reduce(value)
        dist.destroy_process_group()
        return {"backend": backend, "all_reduce": value.item()}
    except Exception as exc:  # noqa: BLE001 (reported as the check's failure)
        return {"backend": backend, "all_reduce_error": f"{type(exc).__name__}: {exc}"[:500]}


def _write_metric(uri: str) -> dict[str, Any]:
    try:
        from diffsweep.tracking import tags as tag
        from diffsweep.tracking.results import result_run
        from diffsweep.tracking.store import ensure_experiment, mlflow_client

        experiment = ensure_experiment(uri, EXPERIMENT)
        tags = {tag.KIND: tag.DOCTOR_KIND, tag.HOST: socket.gethostname()}
        value = float(secrets.randbelow(10**6))
        with result_run(mlflow_client(uri), experiment, None, tags) as run:
            run.log([(METRIC, value, 1)])
        return {"mlflow_run_id": run.run_id, "mlflow_value": value}
    except Exception as exc:  # noqa: BLE001 (reported as the check's failure)
        return {"mlflow_error": f"{type(exc).__name__}: {exc}"[:500]}
