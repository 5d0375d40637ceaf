"""Run states from a ledger attempt, the scheduler's answer and the job's own report (pure logic:
the scheduler answers are given as data here; tests/launch/test_slurm.py runs the real thing)."""

from __future__ import annotations

import os
import subprocess
import sys

from diffsweep.launch.ledger import Attempt, Entry, Ledger
from diffsweep.launch.state import attempt_state, run_state
from diffsweep.lockfile import pid_alive, proc_start
from diffsweep.rundir import JobRecord, write_job_state


def attempt(**kw) -> Attempt:
    return Attempt(**{"executor": "slurm", "submitted": "t", "code_dir": "c", "folder": "f", "job_id": "7_1", **kw})


def test_active_jobs_are_pending_or_running_whatever_the_job_last_said():
    for sched in ("RUNNING", "COMPLETING"):
        s = attempt_state(attempt(), JobRecord(state="preempted", step=40), {"7_1": sched})
        assert s.state == "running" and not s.blocked
    assert attempt_state(attempt(), None, {"7_1": "COMPLETING"}).detail == "COMPLETING"
    s = attempt_state(attempt(), JobRecord(state="running", step=40, total=400), {"7_1": "RUNNING"})
    assert (s.state, s.detail) == ("running", "step 40/400")
    s = attempt_state(attempt(), None, {"7_1": "PENDING (JobArrayTaskLimit)"})
    assert (s.state, s.detail, s.blocked) == ("pending", "JobArrayTaskLimit", "")
    s = attempt_state(attempt(), JobRecord(state="preempted", step=40), {"7_1": "PENDING (BeginTime)"})
    assert (s.state, s.detail) == ("pending", "BeginTime, requeued at step 40")
    assert attempt_state(attempt(), None, {"7_1": "REQUEUE_HOLD (JobHeldUser)"}).detail == "REQUEUE_HOLD, JobHeldUser"


def test_a_job_stopped_by_a_stray_signal_shows_its_recorded_reason_and_is_resubmittable():
    reason = "stopped by SIGTERM at step 40 after saving a checkpoint; launch the sweep again to resume"
    s = attempt_state(attempt(), JobRecord(state="preempted", step=40, reason=reason), {"7_1": "FAILED"})
    assert (s.state, s.detail, s.blocked) == ("failed", reason, "")


def test_a_cancelled_job_that_is_still_stopping_blocks_a_resubmission():
    s = attempt_state(attempt(state="cancelled"), JobRecord(state="running"), {"7_1": "COMPLETING"})
    assert (s.state, s.detail) == ("running", "cancelling") and s.blocked
    assert attempt_state(attempt(state="cancelled"), None, {"7_1": "CANCELLED by 0"}).state == "cancelled"


def test_unknown_jobs_are_never_resubmitted_blindly():
    s = attempt_state(attempt(), None, {})
    assert s.state == "unknown" and "cancel it" in s.blocked


def test_failures():
    assert attempt_state(attempt(), JobRecord(state="failed", reason="OOM"), {"7_1": "FAILED"}).detail == "OOM"
    assert attempt_state(attempt(), None, {"7_1": "TIMEOUT"}).detail == "TIMEOUT"
    s = attempt_state(attempt(), JobRecord(state="running"), {"7_1": "COMPLETED"})
    assert (s.state, s.detail) == ("failed", "the job ended without finishing the run")
    s = attempt_state(attempt(), JobRecord(state="failed", reason="diverged: loss nan", retryable=False),
                      {"7_1": "FAILED"})
    assert s.state == "failed" and "diverged" in s.blocked


def test_a_finished_run_submitted_again_to_evaluate_is_active_until_its_new_job_ends(tmp_path):
    """``diffsweep eval --launch`` submits a done run's job again: until that job starts and writes
    its own job.json, the old "finished" must not make the run look done (``--wait`` would return
    at once); once the scheduler no longer has it, the run is done as before."""
    write_job_state(tmp_path, "finished", step=8)
    updated = (tmp_path / "job.json").read_text().split('"updated": "')[1][:25]
    old = attempt(submitted="2000-01-01T00:00:00+00:00", job_id="5_0")
    again = attempt(submitted="2999-01-01T00:00:00+00:00")
    ledger = Ledger("s", "s", "uri", {"k": Entry("k", "r", str(tmp_path), {}, [old])})
    assert run_state("k", "r", tmp_path, ledger, {"5_0": "COMPLETED"}, None).state == "done"
    ledger.entries["k"].attempts.append(again)
    for sched, state in (("PENDING (Priority)", "pending"), ("RUNNING", "running"), ("COMPLETED", "done"),
                         ("FAILED", "done")):
        s = run_state("k", "r", tmp_path, ledger, {"7_1": sched}, None)
        assert s.state == state, (sched, s)
        assert (s.detail.startswith("evaluating") if state != "done" else s.detail == "8 steps"), s
    # the same second as the submission: the job wrote it, the run is done
    ledger.entries["k"].attempts[-1] = attempt(submitted=updated)
    assert run_state("k", "r", tmp_path, ledger, {"7_1": "RUNNING"}, None).state == "done"


def test_local_queue_states():
    queued = attempt(executor="local", job_id=None, state="queued", queue_pid=os.getpid(),
                     queue_start=proc_start(os.getpid()))
    assert (attempt_state(queued, None, {}).state, attempt_state(queued, None, {}).detail) == ("pending", "local queue")
    gone = attempt(executor="local", job_id=None, state="queued", queue_pid=os.getpid(), queue_start=1)
    assert attempt_state(gone, None, {}).state == "failed"  # a pid reused by another process


def test_pid_alive_tells_reused_pids_and_zombies_apart():
    me = os.getpid()
    assert pid_alive(me) and pid_alive(me, proc_start(me)) and not pid_alive(me, proc_start(me) + 1)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while True:  # wait until it has exited but is not reaped: a zombie
        try:
            state = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[-1].split()[0]
        except OSError:
            break
        if state == "Z":
            assert not pid_alive(child.pid)
            break
    child.wait()
    assert not pid_alive(child.pid)
