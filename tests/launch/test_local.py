"""The local executor end to end, through the CLI: launch, wait, relaunch (nothing resubmitted),
status, logs, preemption with SIGUSR2 (requeued, same MLflow run, contiguous steps), cancel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from diffsweep.train.checkpoint import list_checkpoints
from tests.launch.conftest import attempts, cli, ledger, metric_steps, wait_for, write_sweep


def test_local_sweep_end_to_end(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, extra="launch: {max_parallel: 2}\n")
    out = tmp_path / "runs" / "t"
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "launched 2 runs on the local queue" in r.stdout and "2 done" in r.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert sorted(run.data.tags["diffsweep.sweep_run"] for run in runs) == ["diff_v1-tiny-xs-s0",
                                                                             "transformer-tiny-xs-s0"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert metric_steps(store["MLFLOW_TRACKING_URI"], run.info.run_id) == list(range(1, 9))
        code = Path(run.data.tags["diffsweep.code"])  # the job imported the launch-time snapshot
        assert code.parent == out / "code" and (code / "diffsweep" / "launch" / "job.py").is_file()

    before = attempts(out)
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "nothing to submit (2 done)" in r.stdout
    assert attempts(out) == before  # no new attempt

    r = cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
    status = json.loads(r.stdout)
    assert status["counts"] == {"done": 2}

    r = cli("logs", "diff_v1-tiny-xs-s0", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "finished 8 steps" in r.stdout


def test_local_preemption_requeues_and_continues_the_same_mlflow_run(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=400, kinds=("diff_v1",))
    out = tmp_path / "runs" / "t"
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    run_dir = next((out / "runs").iterdir())
    wait_for(lambda: len(list_checkpoints(run_dir / "checkpoints")) >= 2, 120, "a checkpoint")
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    follow = subprocess.Popen([sys.executable, "-m", "diffsweep", "logs", "diff_v1-tiny-xs-s0", "--follow"],
                              cwd=tmp_path, env={**os.environ, **store}, stdout=subprocess.PIPE, text=True)
    pid = json.loads((run_dir / "job.json").read_text())["pid"]
    os.kill(pid, signal.SIGUSR2)  # what Slurm sends before preemption or the time limit

    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skip diff_v1-tiny-xs-s0: running" in r.stdout  # left alone while it requeues, not resubmitted
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == run_id
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, 401))  # each step once
    log = cli("logs", "diff_v1-tiny-xs-s0", cwd=tmp_path, env=store).stdout
    assert "preempted by SIGUSR2" in log and "Requeued job" in log and "finished 400 steps" in log
    followed, _ = follow.communicate(timeout=60)  # --follow ends by itself once the job has ended
    assert follow.returncode == 0 and "Requeued job" in followed and "finished 400 steps" in followed
    assert len(ledger(out)["entries"][run_dir.name[-12:]]["attempts"]) == 1


def test_local_cancel_then_relaunch_resumes(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=400, kinds=("transformer",))
    out = tmp_path / "runs" / "t"
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store).returncode == 0
    run_dir = next((out / "runs").iterdir())
    wait_for(lambda: len(list_checkpoints(run_dir / "checkpoints")) >= 2, 120, "a checkpoint")
    r = cli("cancel", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "cancelled 1 runs" in r.stdout, r.stdout + r.stderr
    def counts():
        r = cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
        return json.loads(r.stdout)["counts"]

    # "running (cancelling)" while the job saves its checkpoint and exits; a launch now would skip it
    wait_for(lambda: counts() == {"cancelled": 1}, 60, "the job to stop")
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    from mlflow.tracking import MlflowClient

    assert MlflowClient(store["MLFLOW_TRACKING_URI"]).get_run(run_id).info.status == "KILLED"
    stopped_at = max(metric_steps(store["MLFLOW_TRACKING_URI"], run_id))
    assert 2 <= stopped_at < 400

    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, 401))
    assert len(ledger(out)["entries"][run_dir.name[-12:]]["attempts"]) == 2


def test_a_second_launch_hands_its_runs_to_the_running_queue(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=300, kinds=("transformer",),
                        extra="launch: {max_parallel: 1}\n")
    out = tmp_path / "runs" / "t"
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store).returncode == 0
    sweep.write_text(sweep.read_text().replace("[transformer]", "[transformer, diff_v1, diff_v2]"))
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    entries = ledger(out)["entries"].values()
    assert len({e["attempts"][0]["queue_pid"] for e in entries}) == 1  # one queue for the sweep
    # max_parallel 1 held across both launches: the MLflow runs did not overlap in time
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    spans = sorted((run.info.start_time, run.info.end_time) for run in runs)
    assert len(spans) == 3 and all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


def test_a_sigterm_while_the_job_starts_is_not_lost(tmp_path, text_dataset, store):
    # submitit ignores SIGTERM ("bypassing"); until the trainer's handlers were up, a cancel or a
    # stray SIGTERM reaching a starting job was dropped and the run trained to its end.
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=40, kinds=("transformer",))
    out = tmp_path / "runs" / "t"
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store).returncode == 0
    job_file = wait_for(lambda: next((out / "runs").glob("*/job.json"), None), 120, "the job to start", poll=0.005)
    pid = json.loads(job_file.read_text())["pid"]  # written as the job starts, before the trainer sets up
    os.kill(pid, signal.SIGSTOP)  # hold it at that point while the signal is sent
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGCONT)
    wait_for(lambda: json.loads(job_file.read_text())["state"] != "running", 120, "the job to stop")
    job = json.loads(job_file.read_text())
    assert job["state"] == "preempted" and job["step"] == 0, job

    def counts():
        r = cli("status", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
        return json.loads(r.stdout)["counts"]

    wait_for(lambda: counts() == {"failed": 1}, 60, "the job to exit")  # resubmittable, with its reason
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = json.loads((job_file.parent / "run.json").read_text())["run_id"]
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, 41))


def _sigint_default() -> None:
    """In the child: SIGINT raises KeyboardInterrupt, as at a terminal, even when this test runs in the
    background of a shell (which starts it, and so its children, with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_wait_stops_the_runs_at_a_checkpoint_and_a_relaunch_resumes_them(tmp_path, text_dataset,
                                                                                       store):
    """Ctrl-C (twice) while ``launch --executor local --wait`` waits: the running run saves a
    checkpoint and stops, the queued one is not started (max_parallel 1); one line on stderr, exit
    130, no traceback; status says cancelled at once; launching again resumes the run (each step once)."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=200, extra="launch: {max_parallel: 1}\n")
    out = tmp_path / "runs" / "t"
    proc = subprocess.Popen([sys.executable, "-m", "diffsweep", "launch", str(sweep), "--executor", "local",
                             "--wait"], cwd=tmp_path, env={**os.environ, **store}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    try:
        def checkpointed() -> Path | None:
            assert proc.poll() is None, f"launch exited {proc.returncode} before a run trained: {proc.communicate()}"
            return next((d for d in out.glob("runs/*") if len(list_checkpoints(d / "checkpoints")) >= 2), None)

        run_dir = wait_for(checkpointed, 120, "a run's second checkpoint", poll=0.2)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # launch is stopping the runs (a few seconds): a second Ctrl-C must not cut that short
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
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
    assert 2 <= max(metric_steps(store["MLFLOW_TRACKING_URI"], run_id)) < 200

    r = cli("launch", str(sweep), "--executor", "local", "--wait", "--max-parallel", "2", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "launched 2 runs" in r.stdout and "2 done" in r.stdout, r.stdout + r.stderr
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, 201))  # resumed, not restarted
    assert len(ledger(out)["entries"][run_dir.name[-12:]]["attempts"]) == 2
