"""Sweeps meeting a real Slurm site (the localhost cluster of slurm/start-cluster.sh: partition
debug, 2 fake GPUs, user root with account root and QoS normal): concurrent launches, what the
cluster offers (GRES, accounts, QoS), command-line overrides and job settings. (What cancel does
when scancel fails: test_slurm.py, in its array sweep.) Marked ``slurm``; they skip without a
reachable controller (see test_slurm.py). Each starts on an idle cluster and cancels its own
jobs (``own_jobs``)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from diffsweep import lockfile, slurm
from diffsweep.lockfile import LockBusy, hold
from diffsweep.rundir import read_job_state
from tests.helpers.cli import run as cli
from tests.launch.conftest import ledger, wait_for, write_sweep
from tests.launch.slurm_jobs import counts, own_jobs  # noqa: F401 (own_jobs: a fixture)

pytestmark = pytest.mark.slurm

PROFILE = ("executor: slurm\ngpu: {name: fake-gpu, memory_gb: 80, peak_tflops: 0.2, mfu: 0.3}\ngpus_per_node: 2\n"
           "cpus_per_gpu: 1\nmem_per_gpu_gb: 2\nmin_time_minutes: 60\nsignal_delay_s: 30\nexecutor_params: {partition: debug}\n")


def test_two_launches_at_once_from_two_login_nodes_submit_each_run_once(tmp_path, text_dataset, mlflow_store):
    """Two login nodes have two /tmp: here, two TMPDIRs. The lock lives in the sweep directory.
    (The MLflow store exists already, as it does after the first sweep: two launches creating
    one at once would race in MLflow's own table creation instead.) Two real ``launch``
    processes: their concurrency is the point. The jobs wait in a `sleep` setup line (what they
    would train is not the point) until the test cancels them."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=400)
    out = tmp_path / "runs" / "t"
    procs = []
    for node in ("login1", "login2"):
        (tmp_path / node).mkdir()
        procs.append(subprocess.Popen([sys.executable, "-m", "diffsweep", "launch", str(sweep), "--profile",
                                       "localhost", "--setup", "sleep 120"], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_store,
                                                                   "TMPDIR": str(tmp_path / node)}))
    results = [(p.wait(300), *p.communicate()) for p in procs]
    entries = ledger(out)["entries"].values()
    assert len(entries) == 2 and all(len(e["attempts"]) == 1 for e in entries), results
    arrays = {p.name.split("_")[0] for p in (out / "jobs").glob("[0-9]*")}  # submitit's folder per job
    assert len(arrays) == 1, (arrays, results)
    (first,) = [r for r in results if r[0] == 0 and "submitted 2 runs" in r[1]]
    (rc, stdout, stderr) = results[1 - results.index(first)]
    # The other launch was refused while the first held the lock, or came after it and found
    # both runs submitted (pending or running by then, as Slurm had got to them).
    if rc == 0:
        found = re.search(r"nothing to submit \(([^)]*)\)", stdout)
        assert found, stdout
        counts = dict(reversed(part.split(" ")) for part in found[1].split(", "))
        assert set(counts) <= {"pending", "running"} and sum(map(int, counts.values())) == 2, stdout
    else:
        assert rc == 2 and stderr.count("\n") == 1, stderr
        assert stderr.startswith(f"error: --out: another launch or cancel of {out} is in progress (launch on "
                                 f"host {socket.gethostname()}, pid "), stderr


def test_a_lock_held_by_a_slurm_job_on_another_host_lasts_as_long_as_the_job(tmp_path):
    job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 120"], capture_output=True,
                         text=True, check=True).stdout.strip()
    path = tmp_path / ".x.lock"
    try:
        holder = lockfile.this_process("train")
        path.write_text(json.dumps({**dataclasses.asdict(holder), "host": "node7", "job": job}))
        with pytest.raises(LockBusy, match=f"Slurm job {job}"):
            with hold(path, "train", "run", "busy"):
                pass
    finally:
        subprocess.run(["scancel", job], check=True)
    wait_for(lambda: slurm.job_ended(job), 60, f"job {job} to end")
    warnings = []
    with hold(path, "train", "run", "busy", warn=warnings.append):
        pass
    assert f"Slurm job {job} is no longer running" in warnings[0]


def test_runs_needing_more_gpus_per_node_than_the_nodes_have_are_refused_at_plan_time(tmp_path, text_dataset,
                                                                                      new_store):
    (tmp_path / "p.yaml").write_text(PROFILE.replace("gpus_per_node: 2", "gpus_per_node: 4"))
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, extra="launch: {gpus_per_run: 4}\n")
    sweep.write_text(sweep.read_text().replace("train.micro_batch_size: 2", "train.micro_batch_size: 1"))
    expected = ("error: profile p: gpus_per_node: run transformer-tiny-xs-s0 asks for 4 GPUs per node, but the nodes "
                "of partition debug have at most 2 (sinfo GRES: gpu:2); Slurm would leave its job pending forever\n")
    for command in ("plan", "launch"):
        r = cli(command, str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path, env=new_store)
        assert (r.returncode, r.stderr) == (2, expected), r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml", "t.yaml"]  # nothing submitted, no store


@pytest.mark.parametrize("override, message", [
    ("account=nope", ("error: --slurm account: 'nope' is not an account of user root on this cluster (sacctmgr); "
                     "expected one of [root]\n")),
    ("qos=fast", ("error: --slurm qos: 'fast' is not a QoS of user root on this cluster (sacctmgr); expected one of "
                 "[normal]\n")),
])
def test_an_account_or_qos_the_user_lacks_is_refused_with_the_ones_there_are(tmp_path, text_dataset, new_store, override,
                                                                              message):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    for command in ("plan", "launch"):
        r = cli(command, str(sweep), "--profile", "localhost", "--slurm", override, cwd=tmp_path, env=new_store)
        assert (r.returncode, r.stderr) == (2, message), r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


def test_jobs_requeue_on_request_use_their_cpus_as_threads_and_take_command_line_settings(tmp_path, text_dataset,
                                                                                          store):
    (tmp_path / "p.yaml").write_text(PROFILE.replace("cpus_per_gpu: 1", "cpus_per_gpu: 2"))
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, kinds=("diff_v1",))
    args = ("--profile", str(tmp_path / "p.yaml"), "--slurm", "account=root", "--slurm", "qos=normal", "--slurm",
            "time=0:45:00", "--setup", "export DIFFSWEEP_SITE_LINE=ran")
    # the login shell's single thread must not follow the job (conftest sets OMP_NUM_THREADS=1)
    r = cli("launch", str(sweep), *args, cwd=tmp_path, env={**store, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and "0:45 h" in r.stdout, r.stdout + r.stderr
    out = tmp_path / "runs" / "t"
    (entry,) = ledger(out)["entries"].values()
    job_id = entry["attempts"][0]["job_id"]
    (script,) = {p.read_text() for p in out.rglob("*_submission.sh")}
    for line in ("#SBATCH --requeue\n", "#SBATCH --account=root\n", "#SBATCH --qos=normal\n",
                 "#SBATCH --time=45\n", "#SBATCH --cpus-per-task=2\n",
                 "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}\n", "export DIFFSWEEP_SITE_LINE=ran\n"):
        assert line in script, script
    job = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert "Requeue=1" in job and "Account=root" in job and "QOS=normal" in job, job
    run_dir = out / "runs" / f"{entry['name']}-{entry['key']}"
    # job.json says finished (a file read), then status says done
    wait_for(lambda: (job := read_job_state(run_dir)) and job.state == "finished", 240, "the run to finish")
    wait_for(lambda: counts(sweep, tmp_path, store, *args) == {"done": 1}, 120, "status to say done")
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert MlflowClient(store["MLFLOW_TRACKING_URI"]).get_run(run_id).data.tags["diffsweep.threads"] == "2"
