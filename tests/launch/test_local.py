"""The local executor end to end, through the CLI: launch, wait, relaunch (nothing resubmitted),
status, logs, preemption with SIGUSR2 (requeued, same MLflow run, contiguous steps), cancel, Ctrl-C.

The CLI runs in this process (``tests.helpers.cli.run``); the queue and the jobs it starts are
processes of their own, as for a user. A test that signals a job has it wait at a step
(``tests.helpers.held.StepHold``), then holds it with SIGSTOP until the signal is pending (``held``),
so it stops mid-run whatever the machine's speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diffsweep.lockfile import pid_alive
from tests.helpers.cli import run as cli
from tests.helpers.held import StepHold
from tests.launch.conftest import attempts, held_at, in_mask, ledger, metric_steps, pending, wait_for, write_sweep

# A signal is sent while the job waits at step HOLD_AT (or PREEMPT_AT); the run goes on past it.
STEPS, HOLD_AT, PREEMPT_AT = 12, 4, 8


def test_a_launch_hands_its_runs_to_the_running_queue_and_a_finished_sweep_is_not_resubmitted(tmp_path, text_dataset,
                                                                                              store):
    """One run launched; while its job is held (SIGSTOP, so the queue is certainly still running
    it), the sweep grows by a row and is launched again: the new run goes to the same queue, and
    max_parallel 1 holds across both launches. Once both are done: MLflow runs finished with every
    step, the jobs imported the launch-time code snapshot, a relaunch submits nothing, status and
    logs say done. The queue and jobs are processes that outlive each (in-process) launch."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, kinds=("transformer",), extra="launch: {max_parallel: 1}\n")
    out = tmp_path / "runs" / "t"
    hold = StepHold(tmp_path / "hold", 2)
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store | hold.env())
    assert r.returncode == 0 and "launched 1 runs on the local queue" in r.stdout, r.stdout + r.stderr
    (pid,) = hold.wait()  # the queue stays alive while the second launch hands it a run
    sweep.write_text(sweep.read_text().replace("[transformer]", "[transformer, diff_v1]"))
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    hold.release()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skip transformer-tiny-xs-s0: running" in r.stdout and "launched 1 runs on the local queue" in r.stdout
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("] 2 done"), r.stdout + r.stderr
    entries = ledger(out)["entries"].values()
    assert len({e["attempts"][0]["queue_pid"] for e in entries}) == 1  # one queue for the sweep

    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert sorted(run.data.tags["diffsweep.sweep_run"] for run in runs) == ["diff_v1-tiny-xs-s0",
                                                                             "transformer-tiny-xs-s0"]
    # max_parallel 1 held across both launches: the MLflow runs did not overlap in time
    spans = sorted((run.info.start_time, run.info.end_time) for run in runs)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    for run in runs:
        assert run.info.status == "FINISHED"
        assert metric_steps(store["MLFLOW_TRACKING_URI"], run.info.run_id) == list(range(1, 9))
        code = Path(run.data.tags["diffsweep.code"])  # the job imported the launch-time snapshot
        assert code.parent == out / "code" and (code / "diffsweep" / "launch" / "jobs" / "job.py").is_file()

    before = attempts(out)
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "nothing to submit (2 done)" in r.stdout
    assert attempts(out) == before  # no new attempt

    r = cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
    status = json.loads(r.stdout)
    assert status["counts"] == {"done": 2}

    r = cli("logs", "diff_v1-tiny-xs-s0", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "finished 8 steps" in r.stdout


def _queue_gone(out: Path, run_dir: Path) -> None:
    """Wait until the queue of the run's latest attempt has exited, so that the next launch starts a
    queue of its own, with that launch's environment (its ``StepHold``), for the run's next job."""
    queue = ledger(out)["entries"][run_dir.name[-12:]]["attempts"][-1]
    wait_for(lambda: not pid_alive(queue["queue_pid"], queue["queue_start"]), 60, "the queue to exit", poll=0.05)


def test_a_sigterm_while_the_job_starts_is_not_lost_a_cancel_then_relaunch_resumes_and_preemption_requeues(
        tmp_path, text_dataset, store):
    """One run, launched three times (the same processes the three stories need, two jobs fewer).
    A SIGTERM reaching the job as it starts (before the trainer's handlers are up) is not lost: the
    job stops, preempted at step 0, and status says failed (resubmittable). Launched again, and
    cancelled while held at step HOLD_AT: the cancel's SIGTERM stops it there, its MLflow run KILLED.
    Launched again, it resumes; SIGUSR2 while it is held at step PREEMPT_AT: the job saves, requeues
    itself and trains on to the end in the same MLflow run, each step logged once, with no new
    attempt; a launch meanwhile leaves it alone; ``logs --follow`` (a process of its own, following
    the job as it runs) ends by itself when the job has ended."""
    # submitit ignores SIGTERM ("bypassing"); until the trainer's handlers were up, a cancel or a
    # stray SIGTERM reaching a starting job was dropped and the run trained to its end.
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=STEPS, kinds=("transformer",))
    out = tmp_path / "runs" / "t"
    uri = store["MLFLOW_TRACKING_URI"]

    def counts():
        r = cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
        return json.loads(r.stdout)["counts"]

    hold = StepHold(tmp_path / "hold", 0)  # as the job calls the trainer, before its handlers are up
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store | hold.env()).returncode == 0
    (pid,) = hold.wait()
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pending(pid, signal.SIGTERM), 60, "the SIGTERM to be handled", poll=0.005)
    hold.release()
    job_file = next((out / "runs").glob("*/job.json"))
    run_dir = job_file.parent
    wait_for(lambda: json.loads(job_file.read_text())["state"] != "running", 120, "the job to stop")
    job = json.loads(job_file.read_text())
    assert job["state"] == "preempted" and job["step"] == 0, job
    wait_for(lambda: counts() == {"failed": 1}, 60, "the job to exit")  # resubmittable, with its reason

    # launched again, then cancelled while its job is held at step HOLD_AT
    _queue_gone(out, run_dir)
    hold = StepHold(tmp_path / "hold-cancel", HOLD_AT)
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store | hold.env()).returncode == 0
    with held_at(hold) as pid:
        r = cli("cancel", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
        assert r.returncode == 0 and "cancelled 1 runs" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: pending(pid, signal.SIGTERM), 60, "the cancel's SIGTERM to reach the job", poll=0.05)

    # "running (cancelling)" while the job saves its checkpoint and exits; a launch now would skip it
    wait_for(lambda: counts() == {"cancelled": 1}, 60, "the job to stop")
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(uri).get_run(run_id).info.status == "KILLED"
    assert max(metric_steps(uri, run_id)) == HOLD_AT

    # launched again: it resumes; SIGUSR2 (held until it arrives) while it waits at step PREEMPT_AT
    _queue_gone(out, run_dir)
    hold = StepHold(tmp_path / "hold-preempt", PREEMPT_AT)
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store | hold.env()).returncode == 0
    assert len(ledger(out)["entries"][run_dir.name[-12:]]["attempts"]) == 3
    with held_at(hold) as pid:
        follow = subprocess.Popen([sys.executable, "-m", "diffsweep", "logs", "transformer-tiny-xs-s0", "--follow"],
                                  cwd=tmp_path, env={**os.environ, **store}, stdout=subprocess.PIPE, text=True)
        os.kill(pid, signal.SIGUSR2)  # Slurm's before preemption

    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skip transformer-tiny-xs-s0: running" in r.stdout  # left alone while it requeues, not resubmitted
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == run_id
    assert metric_steps(uri, run_id) == list(range(1, STEPS + 1))  # each step once
    log = cli("logs", "transformer-tiny-xs-s0", cwd=tmp_path, env=store).stdout
    assert f"preempted by SIGUSR2 at step {PREEMPT_AT}" in log and "Requeued job" in log
    assert f"finished {STEPS} steps" in log
    followed, _ = follow.communicate(timeout=60)  # --follow ends by itself once the job has ended
    assert follow.returncode == 0 and "Requeued job" in followed and f"finished {STEPS} steps" in followed
    assert len(ledger(out)["entries"][run_dir.name[-12:]]["attempts"]) == 3  # the requeue is no new attempt


def _sigint_default() -> None:
    """In the child: SIGINT raises KeyboardInterrupt, as at a terminal, even when this test runs in the
    background of a shell (which starts it, and so its children, with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_during_wait_stops_the_runs_at_a_checkpoint_and_a_relaunch_resumes_them(tmp_path, text_dataset,
                                                                                       store):
    """A real ``launch`` process, for the signal. Ctrl-C (twice) while ``launch --executor local --wait`` waits: the running run saves a
    checkpoint and stops, the queued one is not started (max_parallel 1); one line on stderr, exit
    130, no traceback; status says cancelled at once; launching again resumes the run (each step once)."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=STEPS, extra="launch: {max_parallel: 1}\n")
    out = tmp_path / "runs" / "t"
    hold = StepHold(tmp_path / "hold", HOLD_AT)
    proc = subprocess.Popen([sys.executable, "-m", "diffsweep", "launch", str(sweep), "--executor", "local",
                             "--wait"], cwd=tmp_path, env={**os.environ, **store, **hold.env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    try:
        (pid,) = hold.wait(alive=[proc])
        run_dir = next(d for d in out.glob("runs/*")
                       if (d / "job.json").exists() and json.loads((d / "job.json").read_text())["pid"] == pid)
        with held_at(hold):
            proc.send_signal(signal.SIGINT)
            # launch ignores SIGINT once it is stopping the runs: a second Ctrl-C then must not cut that short
            wait_for(lambda: in_mask(proc.pid, signal.SIGINT, "SigIgn"), 60, "launch to start stopping", poll=0.05)
            proc.send_signal(signal.SIGINT)
            wait_for(lambda: pending(pid, signal.SIGTERM), 60, "launch's SIGTERM to reach the job", poll=0.05)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines() == [("launch: interrupted; 1 run(s) stopped after saving a checkpoint, 1 queued run(s) "
                                 "not started; launch again to resume")], err
    # stopped by the time launch exited: status says so at once, and a launch now resubmits both
    r = cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
    assert json.loads(r.stdout)["counts"] == {"cancelled": 2}, r.stdout + r.stderr
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(store["MLFLOW_TRACKING_URI"]).get_run(run_id).info.status == "KILLED"
    assert max(metric_steps(store["MLFLOW_TRACKING_URI"], run_id)) == HOLD_AT

    r = cli("launch", str(sweep), "--executor", "local", "--wait", "--max-parallel", "2", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "launched 2 runs" in r.stdout and "2 done" in r.stdout, r.stdout + r.stderr
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, STEPS + 1))  # resumed, not restarted
    assert len(ledger(out)["entries"][run_dir.name[-12:]]["attempts"]) == 2
