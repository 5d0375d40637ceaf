"""The local scheduler's queue (``diffsweep.launch.local_scheduler``): a detached process (started
by ``launch``) that starts its queued runs through submitit's ``LocalExecutor``, at most N at a
time, records each job in the ledger, and exits when all have ended. A later launch of the same sweep hands its runs to a live queue, so
N holds for the sweep. Usage (internal): ``python -m diffsweep.launch.local_queue OUT N``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import submitit

from diffsweep.launch.job import TrainJob
from diffsweep.launch.ledger import locked, read_ledger, write_ledger
from diffsweep.launch.local_scheduler import LOCAL_TIMEOUT_MIN, closed_marker
from diffsweep.lockfile import proc_start
from diffsweep.rundir import read_launch_config, read_launch_eval

POLL_S = 1.0


def main(out: Path, parallel: int) -> None:
    me = os.getpid()
    # Started with PYTHONPATH=<launch's code snapshot>:<the user's>; each job gets its own attempt's.
    user_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)[1:]
    closed_marker(out, me).unlink(missing_ok=True)  # left by an earlier queue that had this pid
    executor = submitit.LocalExecutor(folder=out / "jobs" / "%j", max_num_timeout=100)
    executor.update_parameters(timeout_min=LOCAL_TIMEOUT_MIN)
    running: dict[str, submitit.Job] = {}
    while True:
        running = {k: j for k, j in running.items() if not j.done()}
        with locked(out):
            ledger = read_ledger(out)
            assert ledger is not None
            queued = [(key, e) for key, e in ledger.entries.items()
                      if e.latest is not None and e.latest.state == "queued" and e.latest.queue_pid == me]
            if not queued and not running:
                closed_marker(out, me).touch()
                return
            for key, entry in queued[: max(0, parallel - len(running))]:
                tags = {"diffsweep.sweep": ledger.sweep, "diffsweep.sweep_run": entry.name}
                a = entry.latest
                assert a is not None  # a queued entry's latest attempt is the queued one
                os.environ["PYTHONPATH"] = os.pathsep.join([a.code_dir, *user_path])
                try:
                    job = executor.submit(TrainJob(read_launch_config(Path(entry.run_dir)), entry.run_dir, ledger.experiment,
                                                   ledger.tracking_uri, tags, evals=read_launch_eval(Path(entry.run_dir))))
                except Exception as exc:  # noqa: BLE001 (one bad run must not strand the others)
                    a.state = "failed-to-start"
                    print(f"could not start {entry.name}: {type(exc).__name__}: {exc}", flush=True)
                else:
                    a.state, a.job_id, a.job_start = "submitted", job.job_id, proc_start(int(job.job_id))
                    a.folder, a.stdout, a.stderr = str(job.paths.folder), str(job.paths.stdout), str(job.paths.stderr)
                    running[key] = job
                    print(f"started {entry.name} as local job {job.job_id}", flush=True)
                write_ledger(out, ledger)  # at once: the job exists now
        time.sleep(POLL_S)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
