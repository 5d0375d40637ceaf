"""Sweeps on a real Slurm cluster (slurm/start-cluster.sh: slurmctld + slurmd + slurmdbd on
localhost, fake GPUs). Marked ``slurm``; they skip without a reachable controller, except where
DIFFSWEEP_REQUIRE_SLURM=1 (CI), where a missing cluster is a failure."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from diffsweep.train.checkpoint import list_checkpoints
from tests.launch.conftest import attempts, cli, ledger, metric_steps, wait_for, write_sweep

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster():
    ok = shutil.which("sinfo") is not None and subprocess.run(
        ["sinfo", "-h"], capture_output=True, timeout=30).returncode == 0
    if not ok:
        reason = "no reachable Slurm controller (start one: bash slurm/start-cluster.sh && source /tmp/diffsweep-slurm/env.sh)"
        if os.environ.get("DIFFSWEEP_REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


def launch(sweep, tmp_path, store, *extra):
    return cli("launch", str(sweep), "--profile", "localhost", *extra, cwd=tmp_path, env=store)


def status(sweep, tmp_path, store) -> dict:
    r = cli("status", str(sweep), "--profile", "localhost", "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_slurm_sweep_end_to_end_and_idempotent_relaunch(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    out = tmp_path / "runs" / "t"
    start = time.monotonic()
    r = launch(sweep, tmp_path, store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert time.monotonic() - start < 60  # submit and exit: never waits for the jobs
    assert "submitted 2 runs as Slurm array" in r.stdout
    entries = ledger(out)["entries"].values()
    job_ids = [e["attempts"][0]["job_id"] for e in entries]
    assert sorted(j.split("_")[1] for j in job_ids) == ["0", "1"] and len({j.split("_")[0] for j in job_ids}) == 1

    wait_for(lambda: status(sweep, tmp_path, store)["counts"] == {"done": 2}, 240, "both runs done")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert len(runs) == 2
    for run in runs:
        assert run.info.status == "FINISHED"
        assert run.data.tags["diffsweep.slurm_array_job_id"] == job_ids[0].split("_")[0]
        assert metric_steps(store["MLFLOW_TRACKING_URI"], run.info.run_id) == list(range(1, 9))
    def sacct() -> str:
        return subprocess.run(["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(job_ids)],
                              capture_output=True, text=True).stdout

    # the run reports done before its Slurm job exits; the jobs then complete normally
    wait_for(lambda: sacct().count("COMPLETED") == 2, 60, "both Slurm jobs COMPLETED")

    before = attempts(out)
    r = launch(sweep, tmp_path, store)
    assert r.returncode == 0 and "nothing to submit (2 done)" in r.stdout
    assert attempts(out) == before  # nothing resubmitted
    r = cli("logs", "transformer-tiny-xs-s0", cwd=tmp_path, env=store)
    assert "finished 8 steps" in r.stdout


def test_slurm_preemption_requeues_from_the_current_checkpoint(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=400, kinds=("diff_v1",))
    out = tmp_path / "runs" / "t"
    assert launch(sweep, tmp_path, store).returncode == 0
    (entry,) = ledger(out)["entries"].values()
    job_id = entry["attempts"][0]["job_id"]
    run_dir = tmp_path / "runs" / "t" / "runs" / f"{entry['name']}-{entry['key']}"
    wait_for(lambda: len(list_checkpoints(run_dir / "checkpoints")) >= 3, 180, "checkpoints")
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)  # what Slurm does on preemption

    wait_for(lambda: status(sweep, tmp_path, store)["counts"] == {"done": 1}, 300, "the requeued run to finish")
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == run_id  # same MLflow run
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, 401))  # contiguous, once each
    log = cli("logs", entry["name"], cwd=tmp_path, env=store).stdout
    assert "preempted by SIGUSR2" in log and "Requeued job" in log, log
    resumed = [line for line in log.splitlines() if line.startswith("resum")]
    assert resumed, log  # the second start resumed from a checkpoint, not step 0
    assert len(ledger(out)["entries"][entry["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted


def test_slurm_cancel_reconcile_and_relaunch(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=400)
    out = tmp_path / "runs" / "t"
    assert launch(sweep, tmp_path, store).returncode == 0
    entries = {e["name"]: e for e in ledger(out)["entries"].values()}
    dirs = {n: out / "runs" / f"{n}-{e['key']}" for n, e in entries.items()}

    def checkpointed(name: str) -> None:  # each run is stopped as soon as it has two checkpoints: the
        d = dirs[name]  # other may start late (2 CPUs), and this one must not finish its 400 steps first
        wait_for(lambda: len(list_checkpoints(d / "checkpoints")) >= 2, 180, f"checkpoints in {d}")

    checkpointed("transformer-tiny-xs-s0")
    r = cli("cancel", str(sweep), "--profile", "localhost", "--only", "^transformer", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "cancelled transformer-tiny-xs-s0" in r.stdout, r.stdout + r.stderr
    # the other job's process dies without reporting (SIGKILL: no handler runs, job.json says running)
    checkpointed("diff_v1-tiny-xs-s0")
    os.kill(json.loads((dirs["diff_v1-tiny-xs-s0"] / "job.json").read_text())["pid"], signal.SIGKILL)

    def settled():
        s = status(sweep, tmp_path, store)
        return s if s["counts"] == {"cancelled": 1, "failed": 1} else None

    s = settled() or wait_for(settled, 120, "cancelled + failed")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    killed = json.loads((dirs["diff_v1-tiny-xs-s0"] / "run.json").read_text())["run_id"]
    run = client.get_run(killed)
    assert run.info.status == "FAILED"
    assert "ended as FAILED without reporting" in run.data.tags["diffsweep.end_reason"]
    cancelled = json.loads((dirs["transformer-tiny-xs-s0"] / "run.json").read_text())["run_id"]
    assert client.get_run(cancelled).info.status == "KILLED"
    del s

    r = launch(sweep, tmp_path, store)  # resubmits both (retry budget 2), resuming their checkpoints
    assert r.returncode == 0 and "submitted 2 runs" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: status(sweep, tmp_path, store)["counts"] == {"done": 2}, 300, "both runs done")
    for run_id in (killed, cancelled):
        steps = metric_steps(store["MLFLOW_TRACKING_URI"], run_id)
        assert steps == list(range(1, 401)), (run_id, steps[:5], len(steps))
        assert client.get_run(run_id).info.status == "FINISHED"


def test_unknown_partition_is_one_line_and_leaves_nothing(tmp_path, text_dataset, store):
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\nmin_time_minutes: 60\n"
                                     "slurm: {partition: no-such-partition}\n")
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path, env=store)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == ("error: profile p: slurm.partition: 'no-such-partition' is not a partition of this "
                        "cluster; expected one of [debug]\n")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_sbatch_refusal_leaves_nothing(tmp_path, text_dataset, store):
    # something only sbatch checks: more memory than the node has
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\ncpus_per_gpu: 1\nmin_time_minutes: 60\n"
                                     "mem_per_gpu_gb: 100000\nslurm: {partition: debug}\n")
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path, env=store)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("error: slurm: sbatch refused the job array: sbatch: error: "
                                                 "Memory specification can not be satisfied")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_slurm_time_limit_requeues_and_finishes(tmp_path, text_dataset, store):
    # a 2-minute job limit with USR2 60 s before it; the run needs longer than one job
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\ncpus_per_gpu: 1\nmem_per_gpu_gb: 2\n"
                                     "min_time_minutes: 2\nmax_time_hours: 0.0334\nsignal_delay_s: 60\n"
                                     "slurm: {partition: debug}\n")
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=2500, kinds=("transformer",))
    sweep.write_text(sweep.read_text().replace("train.checkpoint_every: 2", "train.checkpoint_every: 25")
                     .replace("train.keep_checkpoints: 100", "train.keep_checkpoints: 2")
                     .replace("train.log_every: 1", "train.log_every: 50")
                     .replace("train.eval_every: 4", "train.eval_every: 500")
                     .replace("train.batch_tokens: 128", "train.batch_tokens: 1024"))  # ~3 min of work
    r = cli("launch", str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path, env=store)
    assert r.returncode == 0 and "0:02 h" in r.stdout, r.stdout + r.stderr
    out = tmp_path / "runs" / "t"
    (entry,) = ledger(out)["entries"].values()
    run_dir = out / "runs" / f"{entry['name']}-{entry['key']}"

    def done():
        r = cli("status", str(sweep), "--profile", str(tmp_path / "p.yaml"), "--json", cwd=tmp_path, env=store)
        return json.loads(r.stdout)["counts"] == {"done": 1}

    wait_for(done, 900, "the run to finish across time limits", poll=5)  # ~3.5 min quiet, ~6 under load
    log = cli("logs", entry["name"], cwd=tmp_path, env=store).stdout
    assert "this job is timed-out" in log or "Job has timed out" in log, log[-2000:]
    assert "resuming" in log
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run_id) == list(range(1, 2501))


def test_a_two_gpu_run_trains_as_two_slurm_tasks_preempted_and_requeued(tmp_path, text_dataset, store):
    """``launch.gpus_per_run: 2`` on the localhost cluster (2 fake GPUs): one job, two tasks, which
    find each other through submitit, train with FSDP2 on gloo, and make one MLflow run. Preempted
    (USR2 to both tasks, as Slurm sends it), both stop at the same step after a sharded
    checkpoint; the first requeues the job, which resumes and finishes the same run."""
    steps = 120
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=steps, kinds=("diff_v1",),
                        extra="launch: {gpus_per_run: 2}\n")
    out = tmp_path / "runs" / "t"
    r = cli("plan", str(sweep), "--profile", "localhost", "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    (planned,) = json.loads(r.stdout)["runs"]
    assert planned["gpus"] == 2 and planned["nodes"] == 1
    r = launch(sweep, tmp_path, store)
    assert r.returncode == 0, r.stdout + r.stderr
    (entry,) = ledger(out)["entries"].values()
    job_id = entry["attempts"][0]["job_id"]
    run_dir = out / "runs" / f"{entry['name']}-{entry['key']}"
    wait_for(lambda: len(list_checkpoints(run_dir / "checkpoints")) >= 2, 300, "checkpoints")
    (script,) = {p.read_text() for p in out.rglob("*_submission.sh")}  # submitit's sbatch script
    assert "--kill-on-bad-exit=1" in script  # one task dying ends the other
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)  # what Slurm does on preemption

    wait_for(lambda: status(sweep, tmp_path, store)["counts"] == {"done": 1}, 600, "the requeued run to finish")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["diffsweep.processes"] == "2"
    assert run.data.metrics["train/tokens"] == steps * 128  # the sweep's global batch, not twice it
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run.info.run_id) == list(range(1, steps + 1))
    log = cli("logs", entry["name"], cwd=tmp_path, env=store).stdout
    assert "preempted by SIGUSR2" in log and "Requeued job" in log, log
    assert any(line.startswith("resuming") and "on 2 processes" in line for line in log.splitlines()), log
    assert len(ledger(out)["entries"][entry["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted
    sacct = subprocess.run(["sacct", "-n", "-P", "--format=JobID,NTasks", "-j", job_id.split("_")[0]],
                           capture_output=True, text=True).stdout
    assert any(line.endswith("|2") for line in sacct.splitlines()), sacct  # the job step ran two tasks


def squeue_ids() -> set[str]:
    """The ids of every job and array task Slurm holds (``123_0``, as the ledger records them)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30, check=True)
    return set(out.stdout.split())


def _sigint_default() -> None:
    """In the child: SIGINT raises KeyboardInterrupt, as at a terminal, even when this test runs in the
    background of a shell (which starts it, and so its children, with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_wait_stops_waiting_and_leaves_the_jobs_on_slurm(tmp_path, text_dataset, store):
    """Ctrl-C while ``launch --wait`` waits for Slurm jobs (held in their setup by a `sleep`): one
    line on stderr saying they go on and how to follow or stop them, exit 130, no traceback; the
    jobs are still queued or running (nothing cancelled)."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    out = tmp_path / "runs" / "t"
    stdout = tmp_path / "launch.out"
    with open(stdout, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "diffsweep", "launch", str(sweep), "--profile", "localhost",
                                 "--setup", "sleep 120", "--wait"], cwd=tmp_path, env={**os.environ, **store},
                                stdout=f, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    jobs: list[str] = []
    try:
        def waiting() -> bool:  # submitted, recorded, and launch is waiting for them
            assert proc.poll() is None, f"launch exited {proc.returncode}: {stdout.read_text()}{proc.communicate()}"
            if not (out / "ledger.json").is_file():
                return False
            jobs[:] = [e["attempts"][-1]["job_id"] for e in ledger(out)["entries"].values()]
            return re.search(r"^\[\d\d:\d\d:\d\d\] ", stdout.read_text(), re.M) is not None  # its first summary

        wait_for(waiting, 120, "launch --wait to wait for its jobs", poll=0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert err.splitlines() == [(f"launch: stopped waiting; 2 run(s) still queued or running on Slurm: follow "
                                     f"with diffsweep status {sweep}, stop with diffsweep cancel {sweep}")], err
        assert len(jobs) == 2 and set(jobs) <= squeue_ids(), (jobs, squeue_ids())  # nothing cancelled
        assert status(sweep, tmp_path, store)["counts"] in ({"pending": 2}, {"running": 2},
                                                            {"pending": 1, "running": 1})
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        # leave the cluster idle: the way the line says, then whatever is left
        r = cli("cancel", str(sweep), "--profile", "localhost", cwd=tmp_path, env=store)
        left = set(jobs) & squeue_ids()
        if left:
            subprocess.run(["scancel", *left], capture_output=True, timeout=60)
        wait_for(lambda: not set(jobs) & squeue_ids(), 60, f"jobs {jobs} to leave squeue")
    assert r.returncode == 0 and "cancelled 2 runs" in r.stdout, r.stdout + r.stderr
