"""Sweeps on a real Slurm cluster (slurm/start-cluster.sh: slurmctld + slurmd + slurmdbd on
localhost, fake GPUs). Marked ``slurm``; they skip without a reachable controller, except where
DIFFSWEEP_REQUIRE_SLURM=1 (CI), where a missing cluster is a failure.

Each test starts on an idle cluster and cancels its own jobs (``own_jobs``); each wait waits for a
state of the sweep or of Slurm, bounded only to turn a hang into a failure. The commands run in
this process (``tests.helpers.cli.run``) except where a real process is the point (Ctrl-C)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from diffsweep.rundir import read_job_state
from diffsweep.train.checkpoint import checkpoint_step, list_checkpoints
from tests.helpers.cli import run as cli
from tests.helpers.held import StepHold
from tests.launch.conftest import (
    attempts,
    held,
    ledger,
    metric_steps,
    pending,
    stopped,
    training,
    wait_for,
    write_sweep,
)
from tests.launch.slurm_jobs import counts, own_jobs, sacct_states, squeue_ids  # noqa: F401 (fixture)

pytestmark = pytest.mark.slurm


def launch(sweep, tmp_path, store, *extra):
    return cli("launch", str(sweep), "--profile", "localhost", *extra, cwd=tmp_path, env=store)


def job_state(run_dir) -> str | None:
    """The run's state in its ``job.json`` (None before there is one)."""
    job = read_job_state(run_dir)
    return job.state if job else None


def newest_step(run_dir) -> int:
    """The step of the run's newest checkpoint (0: none yet)."""
    return max((checkpoint_step(p) for p in list_checkpoints(run_dir / "checkpoints")), default=0)


def sparse(sweep):
    """``sweep`` checkpointing every 10 steps and evaluating every 20, not every 2 and 4: a saved
    checkpoint costs a tiny run as much CPU as 2-3 steps (~60 ms), and these runs train hundreds."""
    sweep.write_text(sweep.read_text().replace("train.checkpoint_every: 2\n", "train.checkpoint_every: 10\n")
                     .replace("train.eval_every: 4\n", "train.eval_every: 20\n"))
    return sweep


def signalled(pid: int) -> bool:
    """Whether a held job process has been sent USR2 (pending, or continued to handle it, or gone)."""
    try:
        return pending(pid, signal.SIGUSR2) or not stopped(pid)
    except FileNotFoundError:
        return True


# The job's second start, after Slurm requeued it (the requeue itself is proof enough: submitit's
# "Requeued job" line may never come, as `scontrol requeue` is itself killed with the job's step
# when the machine is slow to return from it; seen once in CI under load).
REQUEUED = "start 2 (after 1 requeue)"


def resumed_at(log: str) -> list[int]:
    """The steps the run's starts resumed from, as the trainer prints them."""
    return [int(s) for s in re.findall(r"^resuming \S+ at step (\d+)", log, re.M)]


def test_a_slurm_array_preempted_killed_cancelled_and_relaunched_trains_every_step_once(tmp_path, text_dataset,
                                                                                       store):
    """One array of two runs meets what a sweep meets on Slurm. ``launch`` submits both as one
    array and returns while they are queued or running. Both wait at step 30 (``StepHold``), where
    the signals land: run A, preempted (USR2, as Slurm sends it), saves, requeues itself (Slurm's
    requeue, not a resubmission) and resumes from the step it saved, in the same MLflow run. Run
    B's process dies without reporting (SIGKILL): reconciled as failed. Cancelling A trusts Slurm, not scancel's exit status: a failed scancel with the job
    still running is an error naming it, with nothing marked; a failed scancel that stopped it is
    a success. ``launch`` again resubmits both, which resume and finish, every step logged once;
    their jobs then complete, and a third ``launch`` submits nothing."""
    steps = 150
    sweep = sparse(write_sweep(tmp_path / "t.yaml", text_dataset, steps=steps))
    out = tmp_path / "runs" / "t"
    hold = StepHold(tmp_path / "hold", 30)  # both first starts wait at step 30 (after its checkpoint)
    r = launch(sweep, tmp_path, store | hold.env())
    assert r.returncode == 0 and "submitted 2 runs as Slurm array" in r.stdout, r.stdout + r.stderr
    # submit and exit: launch never waits for the jobs, which cannot have trained 150 steps yet
    now = counts(sweep, tmp_path, store)
    assert set(now) <= {"pending", "running"} and sum(now.values()) == 2, now
    entries = {e["name"]: e for e in ledger(out)["entries"].values()}
    first_ids = {n: e["attempts"][0]["job_id"] for n, e in entries.items()}
    assert sorted(j.split("_")[1] for j in first_ids.values()) == ["0", "1"]
    (array,) = {j.split("_")[0] for j in first_ids.values()}  # one array, one task per run
    a, b = "transformer-tiny-xs-s0", "diff_v1-tiny-xs-s0"
    dirs = {n: out / "runs" / f"{n}-{e['key']}" for n, e in entries.items()}

    held_pids = hold.wait(2, timeout=240)  # both wait at step 30, with 3 checkpoints saved
    pids = {n: training(dirs[n])["pid"] for n in (a, b)}
    assert sorted(pids.values()) == held_pids, (pids, held_pids)
    assert all(len(list_checkpoints(dirs[n] / "checkpoints")) >= 3 for n in (a, b))
    run_ids = {n: json.loads((dirs[n] / "run.json").read_text())["run_id"] for n in (a, b)}
    # A: preempted at step 30; it must requeue itself and resume where it saved
    subprocess.run(["scancel", "--signal=USR2", first_ids[a]], check=True)
    wait_for(lambda: hold.signalled(pids[a]), 120, f"{a} to handle USR2", poll=0.05)
    # B: its process dies without a word (SIGKILL: no handler runs, job.json says running)
    os.kill(pids[b], signal.SIGKILL)
    hold.release()

    # held (SIGSTOP) from its first step after Slurm's requeue: still running when it is cancelled below
    with held(wait_for(lambda: training(dirs[a], starts=2), 240, f"{a} requeued and training", poll=0.05)["pid"]):
        log = cli("logs", a, cwd=tmp_path, env=store).stdout
        # a failure shows the whole log (once in CI the first start ended with exit code 1, not requeued)
        assert "preempted by SIGUSR2" in log and REQUEUED in log, log
        saved = [int(s) for s in re.findall(r"preempted by SIGUSR2 at step (\d+)", log)]
        assert resumed_at(log) == saved and saved[0] >= 30, log  # from the checkpoint it saved, not step 0
        assert len(ledger(out)["entries"][entries[a]["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted

        # cancel A: scancel fails and Slurm still runs the job: an error naming it, nothing marked
        real = shutil.which("scancel")
        shims = {}
        for name, body in (("delivered", f'"{real}" "$@"\n'), ("refused", "")):
            shims[name] = tmp_path / name
            shims[name].mkdir()
            (shims[name] / "scancel").write_text(f"#!/bin/sh\n{body}echo 'scancel: error: Kill job error on job "
                                                 "id 1: Job/step already completing or completed' >&2\nexit 1\n")
            (shims[name] / "scancel").chmod(0o755)
        cancel = ("cancel", str(sweep), "--profile", "localhost", "--only", "^transformer")
        r = cli(*cancel, cwd=tmp_path, env={**store, "PATH": f"{shims['refused']}{os.pathsep}{os.environ['PATH']}"})
        assert r.returncode == 3 and r.stderr.startswith(f"error: scancel did not stop Slurm jobs {first_ids[a]} ("), \
            r.stdout + r.stderr
        assert "Job/step already completing" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert [x["state"] for x in ledger(out)["entries"][entries[a]["key"]]["attempts"]] == ["submitted"]
        # scancel fails but the job was cancelled (what was seen in 3 of 6 tries): success
        r = cli(*cancel, cwd=tmp_path,
                env={**store, "PATH": f"{shims['delivered']}{os.pathsep}{os.environ['PATH']}"})
        assert r.returncode == 0 and "cancelled transformer-tiny-xs-s0" in r.stdout, r.stdout + r.stderr
        assert [x["state"] for x in ledger(out)["entries"][entries[a]["key"]]["attempts"]] == ["cancelled"]

    # both jobs leave Slurm's queue (a cheap question asked often), then status says so
    wait_for(lambda: not set(first_ids.values()) & squeue_ids(), 120, f"jobs {sorted(first_ids.values())} to end")
    wait_for(lambda: counts(sweep, tmp_path, store) == {"cancelled": 1, "failed": 1}, 120, "cancelled + failed")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    killed = client.get_run(run_ids[b])
    assert killed.info.status == "FAILED"
    assert "ended as FAILED without reporting" in killed.data.tags["diffsweep.end_reason"]
    cancelled = client.get_run(run_ids[a])
    assert cancelled.info.status == "KILLED"
    assert cancelled.data.tags["diffsweep.slurm_array_job_id"] == array

    r = launch(sweep, tmp_path, store)  # resubmits both (retry budget 2), resuming their checkpoints
    assert r.returncode == 0 and "submitted 2 runs" in r.stdout, r.stdout + r.stderr
    # both report finished in job.json (a file read), then status says done
    wait_for(lambda: all(job_state(dirs[n]) == "finished" for n in (a, b)), 300, "both runs to finish")
    wait_for(lambda: counts(sweep, tmp_path, store) == {"done": 2}, 120, "both runs done")
    for name, run_id in run_ids.items():
        assert json.loads((dirs[name] / "run.json").read_text())["run_id"] == run_id  # the same MLflow run
        got = metric_steps(store["MLFLOW_TRACKING_URI"], run_id)
        assert got == list(range(1, steps + 1)), (name, got[:5], len(got))  # contiguous, once each
        assert client.get_run(run_id).info.status == "FINISHED"
    last_ids = [e["attempts"][-1]["job_id"] for e in ledger(out)["entries"].values()]
    # the runs report done before their Slurm jobs exit; the jobs then complete normally
    wait_for(lambda: sacct_states(last_ids) == ["COMPLETED"] * 2, 60, f"jobs {last_ids} COMPLETED")

    before = attempts(out)
    r = launch(sweep, tmp_path, store)
    assert r.returncode == 0 and "nothing to submit (2 done)" in r.stdout, r.stdout + r.stderr
    assert attempts(out) == before  # nothing resubmitted
    log = cli("logs", a, cwd=tmp_path, env=store).stdout
    assert f"finished {steps} steps" in log, log


@pytest.mark.slow
def test_slurm_time_limit_signals_the_job_which_requeues_and_resumes(tmp_path, text_dataset, store):
    """A 2-minute job (Slurm's ``--time``) with USR2 60 s before its limit: Slurm signals it
    (30-60 s in, as slurmctld checks limits every 30 s), submitit counts a time-out, the job
    saves and requeues itself, and the requeued job resumes from the step it saved, in the same
    MLflow run, and trains on. The run is longer than any job could train (nothing is sized
    against the clock), and held (SIGSTOP) while it waits for the signal; once it has trained
    past the requeue it is cancelled. (A requeued job
    finishing its run: test_a_two_gpu_run_trains_as_two_slurm_tasks_preempted_and_requeued.)"""
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\ncpus_per_gpu: 1\nmem_per_gpu_gb: 2\n"
                                     "min_time_minutes: 2\nmax_time_hours: 0.0334\nsignal_delay_s: 60\n"
                                     "executor_params: {partition: debug}\n")
    profile = ("--profile", str(tmp_path / "p.yaml"))
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=10**6, kinds=("transformer",))
    sweep.write_text(sweep.read_text().replace("train.checkpoint_every: 2", "train.checkpoint_every: 50")
                     .replace("train.keep_checkpoints: 100", "train.keep_checkpoints: 2")
                     .replace("train.eval_every: 4", "train.eval_every: 100000"))
    r = cli("launch", str(sweep), *profile, cwd=tmp_path, env=store)
    assert r.returncode == 0 and "0:02 h" in r.stdout, r.stdout + r.stderr
    out = tmp_path / "runs" / "t"
    (entry,) = ledger(out)["entries"].values()
    run_dir = out / "runs" / f"{entry['name']}-{entry['key']}"
    (script,) = {p.read_text() for p in out.rglob("*_submission.sh")}  # submitit's sbatch script
    assert "#SBATCH --time=2\n" in script and "#SBATCH --signal=USR2@60\n" in script, script
    wait_for(lambda: (run_dir / "run.json").is_file(), 180, "the run to start")
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    # Held (SIGSTOP) from its first step until Slurm signals it (Slurm continues a stopped job to
    # deliver its USR2): the minute it waits for the limit uses no CPU.
    job = wait_for(lambda: training(run_dir), 180, "the job to train", poll=0.05)
    with held(job["pid"]):
        wait_for(lambda: signalled(job["pid"]), 180, "Slurm's USR2 before the time limit")

    def resumed() -> str | None:
        log = cli("logs", entry["name"], cwd=tmp_path, env=store).stdout
        return log if resumed_at(log) else None

    # the second start in job.json (a file read), then its log says it resumed
    wait_for(lambda: training(run_dir, starts=2), 300, "the time limit's USR2, a requeue and a second start")
    log = wait_for(resumed, 120, "the resumed start in the log", poll=1)
    assert "this job is timed-out" in log and REQUEUED in log, log  # submitit's words, then the second start
    saved = [int(s) for s in re.findall(r"preempted by SIGUSR2 at step (\d+)", log)]
    assert resumed_at(log) == saved[:1] and saved[0] > 0, log  # from the step it saved
    assert len(ledger(out)["entries"][entry["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted
    wait_for(lambda: newest_step(run_dir) > saved[0], 180, "a checkpoint after the requeue")

    r = cli("cancel", str(sweep), *profile, cwd=tmp_path, env=store)
    assert r.returncode == 0 and f"cancelled {entry['name']}" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: counts(sweep, tmp_path, store, *profile) == {"cancelled": 1}, 120, "the run cancelled")
    assert json.loads((run_dir / "run.json").read_text())["run_id"] == run_id  # the same MLflow run
    got = metric_steps(store["MLFLOW_TRACKING_URI"], run_id)
    assert got == list(range(1, len(got) + 1)) and len(got) > saved[0], (got[:5], len(got), saved)


def test_unknown_partition_is_one_line_and_leaves_nothing(tmp_path, text_dataset, new_store):
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\nmin_time_minutes: 60\n"
                                     "executor_params: {partition: no-such-partition}\n")
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path, env=new_store)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == ("error: profile p: executor_params.partition: 'no-such-partition' is not a partition of this "
                        "cluster; expected one of [debug]\n")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_sbatch_refusal_leaves_nothing(tmp_path, text_dataset, store):
    # something only sbatch checks: more memory than the node has
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 2\ncpus_per_gpu: 1\nmin_time_minutes: 60\n"
                                     "mem_per_gpu_gb: 100000\nexecutor_params: {partition: debug}\n")
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path, env=store)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("error: slurm: sbatch refused the job array: sbatch: error: "
                                                 "Memory specification can not be satisfied")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_two_gpu_run_trains_as_two_slurm_tasks_preempted_and_requeued(tmp_path, text_dataset, store):
    """``launch.gpus_per_run: 2`` on the localhost cluster (2 fake GPUs): one job, two tasks, which
    find each other through submitit, train with FSDP2 on gloo, and make one MLflow run. Preempted
    (USR2 to both tasks, as Slurm sends it), both stop at the same step after a sharded
    checkpoint; the first requeues the job, which resumes and finishes the same run."""
    steps = 40
    sweep = sparse(write_sweep(tmp_path / "t.yaml", text_dataset, steps=steps, kinds=("diff_v1",),
                               extra="launch: {gpus_per_run: 2}\n"))
    out = tmp_path / "runs" / "t"
    r = cli("plan", str(sweep), "--profile", "localhost", "--json", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    (planned,) = json.loads(r.stdout)["runs"]
    assert planned["gpus"] == 2 and planned["nodes"] == 1
    hold = StepHold(tmp_path / "hold", 20)  # both tasks wait at step 20 (two checkpoints) for the signal
    r = launch(sweep, tmp_path, store | hold.env())
    assert r.returncode == 0, r.stdout + r.stderr
    (entry,) = ledger(out)["entries"].values()
    job_id = entry["attempts"][0]["job_id"]
    run_dir = out / "runs" / f"{entry['name']}-{entry['key']}"
    tasks = hold.wait(2)
    (script,) = {p.read_text() for p in out.rglob("*_submission.sh")}  # submitit's sbatch script
    assert "--kill-on-bad-exit=1" in script  # one task dying ends the other
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)  # what Slurm does on preemption
    wait_for(lambda: all(hold.signalled(pid) for pid in tasks), 120, "both tasks to handle USR2", poll=0.05)
    hold.release()

    wait_for(lambda: job_state(run_dir) == "finished", 600, "the requeued run to finish")  # job.json: a file read
    wait_for(lambda: counts(sweep, tmp_path, store) == {"done": 1}, 120, "status to say done")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("t").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["diffsweep.processes"] == "2"
    assert run.data.metrics["train/tokens"] == steps * 128  # the sweep's global batch, not twice it
    assert metric_steps(store["MLFLOW_TRACKING_URI"], run.info.run_id) == list(range(1, steps + 1))
    log = cli("logs", entry["name"], cwd=tmp_path, env=store).stdout
    assert "preempted by SIGUSR2 at step 20" in log and REQUEUED in log, log
    assert any(line.startswith("resuming") and "on 2 processes" in line for line in log.splitlines()), log
    assert len(ledger(out)["entries"][entry["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted
    sacct = subprocess.run(["sacct", "-n", "-P", "--format=JobID,NTasks", "-j", job_id.split("_")[0]],
                           capture_output=True, text=True).stdout
    assert any(line.endswith("|2") for line in sacct.splitlines()), sacct  # the job step ran two tasks


def _sigint_default() -> None:
    """In the child: SIGINT raises KeyboardInterrupt, as at a terminal, even when this test runs in the
    background of a shell (which starts it, and so its children, with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_wait_stops_waiting_and_leaves_the_jobs_on_slurm(tmp_path, text_dataset, store):
    """Ctrl-C while ``launch --wait`` waits for Slurm jobs (held in their setup by a `sleep`): one
    line on stderr saying they go on and how to follow or stop them, exit 130, no traceback; the
    jobs are still queued or running (nothing cancelled). A real ``launch`` process: the signal is
    the point."""
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
        assert counts(sweep, tmp_path, store) in ({"pending": 2}, {"running": 2}, {"pending": 1, "running": 1})
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # the way the line says stops them
    r = cli("cancel", str(sweep), "--profile", "localhost", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "cancelled 2 runs" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: not set(jobs) & squeue_ids(), 60, f"jobs {jobs} to leave squeue")
