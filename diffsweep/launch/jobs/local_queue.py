"""The local scheduler's queue (``diffsweep.launch.jobs.local_scheduler``): a detached process that starts
the queued jobs of one record (a sweep's ledger, a launched prepare's ``launch.json``: an
``AttemptStore``) through submitit's ``LocalExecutor``, at most N at a time, records each job there,
and exits when all have ended. A job with a gate (a cooldown branch: its parent's checkpoint) starts
once the gate exists; one whose gate no running job can write any more fails to start. Usage
(internal): ``python -m diffsweep.launch.jobs.local_queue MODULE:STORE FOLDER N``.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

import submitit

from diffsweep.launch.jobs.attempt import load_store
from diffsweep.launch.jobs.local_scheduler import LOCAL_TIMEOUT_MIN, closed_marker
from diffsweep.lockfile import proc_start
from diffsweep.rundir import now

POLL_S = 1.0


def main(spec: list[str], parallel: int) -> None:
    store = load_store(spec)
    me = os.getpid()
    # Started with PYTHONPATH=<launch's code snapshot>:<the user's>; each job gets its own attempt's.
    user_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)[1:]
    closed_marker(store, me).unlink(missing_ok=True)  # left by an earlier queue that had this pid
    executors: dict[str, submitit.LocalExecutor] = {}
    running: dict[str, submitit.Job] = {}
    while True:
        running = {k: j for k, j in running.items() if not j.done()}
        with store.locked():
            record = store.read()
            queued = [a for a in store.latest(record) if a.state == "queued" and a.queue_pid == me]
            # a cooldown branch waits for its parent's checkpoint (its gate) to exist
            ready = [a for a in queued if a.gate is None or Path(a.gate).exists()]
            if not ready and not running:
                for a in queued:  # gated, and no job of this queue is left to write their gates: not
                    a.state = "cancelled"  # a failure of theirs (no retry spent); launching again resubmits them
                    print(f"could not start {Path(a.queue_item or '').stem}: the parent's checkpoint {a.gate} does "
                          "not exist and no job of this queue is running to write it; launch again once the "
                          "parent has trained past it", flush=True)
                if queued:
                    store.write(record)
                closed_marker(store, me).touch()
                return
            for a in ready[: max(0, parallel - len(running))]:
                item = Path(a.queue_item or "")
                name = item.stem
                os.environ["PYTHONPATH"] = os.pathsep.join([a.code_dir, *user_path])
                try:
                    with open(item, "rb") as f:
                        name, call = pickle.load(f)  # noqa: S301 (written by the launch that queued it)
                    if a.folder not in executors:
                        executors[a.folder] = submitit.LocalExecutor(folder=Path(a.folder) / "%j", max_num_timeout=100)
                        executors[a.folder].update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
                    job = executors[a.folder].submit(call)
                except Exception as exc:  # noqa: BLE001 (one bad job must not strand the others)
                    a.state = "failed-to-start"
                    print(f"could not start {name}: {type(exc).__name__}: {exc}", flush=True)
                else:
                    a.state, a.job_id, a.job_start = "submitted", job.job_id, proc_start(int(job.job_id))
                    a.folder, a.stdout, a.stderr = str(job.paths.folder), str(job.paths.stdout), str(job.paths.stderr)
                    running[job.job_id] = job
                    item.unlink(missing_ok=True)  # submitit keeps its own pickle of the job
                    a.queue_item = None
                    if a.gate is not None:
                        a.released = now()  # held until its gate existed, as on Slurm
                    print(f"started {name} as local job {job.job_id}", flush=True)
                store.write(record)  # at once: the job exists now
        time.sleep(POLL_S)


if __name__ == "__main__":
    main(sys.argv[1:3], int(sys.argv[3]))
