"""``diffsweep doctor`` through the CLI: on the localhost Slurm cluster (marked ``slurm``; they skip
without a controller unless DIFFSWEEP_REQUIRE_SLURM=1), without Slurm, and its pure helpers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from diffsweep.launch.doctor.slurm import _constraint_features, _gpu_types
from tests.helpers.cli import run as cli
from tests.launch.conftest import require_slurm, wait_for

# The localhost cluster as a CPU-only profile: every check can pass there (its fake GPUs are not
# CUDA devices, see test_fake_gpus_are_assigned_but_not_cuda_devices).
CPU_PROFILE = ("executor: slurm\ngpus_per_node: 0\ncpus_per_gpu: 1\nmem_per_gpu_gb: 2\nmin_time_minutes: 60\n"
               "signal_delay_s: 30\nexecutor_params: {partition: debug}\ncpu_jobs: {cpus: 1, mem_gb: 1}\n")
JOB_CHECKS = ["slurm", "accounting", "partition", "gpus", "mlflow", "1-task job", "2-task job",
              "shared file system", "gpus in jobs", "all-reduce", "mlflow from a node"]


def doctor(tmp_path, store, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return cli("doctor", "--out", str(tmp_path / "runs"), *args, cwd=tmp_path, env={**store, **(env or {})})


@pytest.mark.slurm
@pytest.mark.slow
def test_every_check_passes_on_the_localhost_cluster_preemption_included(tmp_path, store):
    """Every check, --preempt's included (one run of doctor: about 2.5 minutes, mostly the preempted
    training job being requeued and resumed)."""
    require_slurm()
    (tmp_path / "cpu.yaml").write_text(CPU_PROFILE)
    r = doctor(tmp_path, store, "--profile", str(tmp_path / "cpu.yaml"), "--preempt")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "diffsweep doctor: profile cpu (executor slurm)"
    assert [line.split(":")[0] for line in lines[1:-1]] == [f"✓ {name}" for name in [*JOB_CHECKS, "preemption"]]
    assert lines[-1] == f"all {len(JOB_CHECKS) + 1} checks passed"
    assert "gloo across 2 tasks" in r.stdout and "reads back here from sqlite:///" in r.stdout
    (line,) = [ln for ln in lines if ln.startswith("✓ preemption")]
    assert "requeued by Slurm, resumed and finished MLflow run" in line and "steps 1..300 once each" in line
    assert not (tmp_path / "runs" / ".doctor").exists()  # removed when all pass
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store["MLFLOW_TRACKING_URI"])
    deleted = client.search_runs([client.get_experiment_by_name("diffsweep-doctor").experiment_id],
                                 run_view_type=2)  # DELETED_ONLY: read back, then deleted
    assert any("doctor/probe" in run.data.metrics for run in deleted)


@pytest.mark.slurm
def test_fake_gpus_are_assigned_but_not_cuda_devices(tmp_path, store):
    """localhost.yaml's GPUs are /dev/null: Slurm hands them out, torch sees none; doctor says so."""
    require_slurm()
    r = doctor(tmp_path, store, "--profile", "localhost", "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert [n for n, c in checks.items() if not c["ok"]] == ["gpus in jobs"]
    gpus = checks["gpus in jobs"]
    # which of the two fake GPUs Slurm hands out depends on what else the cluster runs at that moment
    assert re.search(r"Slurm gave the 1-task job GPUs [01] on .*sees 0 CUDA devices", gpus["line"]), gpus["line"]
    assert gpus["fix"].startswith("install a CUDA build of torch")
    assert report["workdir"] and os.path.isdir(report["workdir"])  # kept for a look at the logs


@pytest.mark.slurm
def test_a_partition_that_does_not_exist_is_one_failed_line_with_the_fix(tmp_path, store):
    require_slurm()
    (tmp_path / "p.yaml").write_text(CPU_PROFILE.replace("partition: debug", "partition: no-such"))
    r = doctor(tmp_path, store, "--profile", str(tmp_path / "p.yaml"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[1:] == [
        "✓ slurm: the controller answers (partitions: debug)",
        "✓ accounting: sacct answers",
        "✗ partition: profile p: executor_params.partition: 'no-such' is not a partition of this cluster; expected one of [debug]",
        ("    fix: set executor_params.partition in profile p to a partition of this cluster ([debug]), or pass --slurm "
         "partition=NAME"),
        "1 of 3 checks failed",
    ]
    r = doctor(tmp_path, store, "--profile", str(tmp_path / "p.yaml"), "--slurm", "partition=debug", "--json",
               "--timeout", "1", "--setup", "sleep 60")  # fixed on the command line; no time for the jobs (they sleep)
    report = json.loads(r.stdout)
    assert {c["name"]: c["ok"] for c in report["checks"]}["partition"] is True


def queued_jobs(where: Path) -> dict[str, str]:
    """Name by job id of the jobs Slurm holds (pending, running, completing) submitted from ``where``
    (their working directory): this test's, not another's on the same cluster."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%j|%Z"], capture_output=True, text=True, timeout=30, check=True)
    return {jid: name for jid, name, cwd in (line.split("|", 2) for line in out.stdout.splitlines())
            if Path(cwd).resolve() == where.resolve()}


def _sigint_default() -> None:
    """In the child: SIGINT raises KeyboardInterrupt, as at a terminal, even when this test runs in the
    background of a shell (which starts it, and so its children, with SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_doctor(tmp_path, store, *args: str, wanted: set[str]) -> tuple[list[str], str, str]:
    """Start doctor, press Ctrl-C (SIGINT) once Slurm holds its jobs named ``wanted``: the ids of
    the jobs it held then, doctor's stdout and stderr. Doctor must exit 130 within 60 s."""
    proc = subprocess.Popen([sys.executable, "-m", "diffsweep", "doctor", "--out", str(tmp_path / "runs"), *args],
                            cwd=tmp_path, env={**os.environ, **store}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    def held() -> dict[str, str]:
        assert proc.poll() is None, f"doctor exited {proc.returncode} before its jobs were queued: {proc.communicate()}"
        jobs = queued_jobs(tmp_path)
        return jobs if wanted <= set(jobs.values()) else {}

    try:
        jobs = wait_for(held, 120, f"Slurm to hold doctor's jobs {sorted(wanted)}", poll=0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        left = queued_jobs(tmp_path)
        if left:  # a failed test leaves no job on the shared cluster
            subprocess.run(["scancel", *left], capture_output=True, timeout=60)
    assert proc.returncode == 130, out + err
    return sorted(jobs, key=int), out, err


def assert_cancelled(ids: list[str], where: Path) -> None:
    """Slurm holds none of ``ids`` and accounting has them CANCELLED (the bounds end a hang only: a
    job may stay COMPLETING ~30 s, see tests/launch/slurm_jobs.py)."""
    def states() -> dict[str, str]:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "--format=JobID,State", "-j", ",".join(ids)],
                             capture_output=True, text=True, timeout=30).stdout
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    wait_for(lambda: not set(ids) & set(queued_jobs(where)), 120, f"jobs {ids} to leave squeue")
    wait_for(lambda: all(states().get(j, "").startswith("CANCELLED") for j in ids), 120,
             f"sacct to show jobs {ids} CANCELLED")


@pytest.mark.slurm
def test_ctrl_c_cancels_the_probe_jobs_in_one_line_exit_130(tmp_path, store):
    """Ctrl-C while doctor waits for its probe jobs (kept running by a `sleep` setup line): both
    are cancelled, one line names them, no traceback; the checks done so far were printed."""
    require_slurm()
    (tmp_path / "cpu.yaml").write_text(CPU_PROFILE)
    ids, out, err = interrupt_doctor(tmp_path, store, "--profile", str(tmp_path / "cpu.yaml"), "--setup", "sleep 60",
                                     wanted={"diffsweep-doctor-1", "diffsweep-doctor-2"})
    assert len(ids) == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1] == f"doctor: interrupted; cancelled job(s) {', '.join(ids)}", err
    assert [line.split(":")[0] for line in out.splitlines()[1:]] == [f"✓ {n}" for n in JOB_CHECKS[:5]], out
    assert_cancelled(ids, tmp_path)


@pytest.mark.slurm
@pytest.mark.slow
def test_ctrl_c_during_preempt_cancels_the_training_job(tmp_path, store):
    """Ctrl-C once --preempt's training job is queued: it is cancelled and named (the probe jobs
    had ended); every job check was printed before."""
    require_slurm()
    (tmp_path / "cpu.yaml").write_text(CPU_PROFILE)
    ids, out, err = interrupt_doctor(tmp_path, store, "--profile", str(tmp_path / "cpu.yaml"), "--preempt",
                                     wanted={"diffsweep-doctor-preempt"})
    assert len(ids) == 1 and "Traceback" not in err, err
    assert err.splitlines()[-1] == f"doctor: interrupted; cancelled job(s) {ids[0]}", err
    assert [line.split(":")[0] for line in out.splitlines()[1:]] == [f"✓ {n}" for n in JOB_CHECKS], out
    assert_cancelled(ids, tmp_path)


def test_without_slurm_the_first_check_fails_with_the_fix(tmp_path, store):
    r = doctor(tmp_path, store, "--profile", "localhost", env={"PATH": str(tmp_path)})
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[1:] == [
        "✗ slurm: sbatch is not on PATH (no Slurm client here)",
        "    fix: use --executor local, or run where Slurm is installed",
        "1 of 1 checks failed",
    ]


def test_the_local_executor_checks_this_machine(tmp_path, store):
    r = doctor(tmp_path, store, "--executor", "local", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [(c["name"], c["ok"]) for c in report["checks"]] == [("jobs", True), ("mlflow", True)]


def test_an_unknown_profile_is_bad_input(tmp_path, store):
    r = doctor(tmp_path, store, "--profile", "nope")
    assert r.returncode == 2 and r.stderr.startswith("error: --profile: unknown profile 'nope'"), r.stderr


def test_gpu_types_and_constraint_features():
    assert _gpu_types("gpu:h100:8(S:0-1),gpu:a100:2") == ["h100", "a100"]
    assert _gpu_types("gpu:2") == [] and _gpu_types("(null)") == []
    assert _constraint_features("[h100|a100]&ib") == ["h100", "a100", "ib"]
    assert _constraint_features("h100*2") == ["h100"]


def test_a_ctrl_c_while_a_probe_job_is_submitted_comes_once_its_id_is_kept(monkeypatch):
    """Ctrl-C arriving while sbatch submits (here: sent from inside the submission) is held until the
    job's id is kept for the cancel, then raised: the job is named and cancelled, never left running."""
    from diffsweep.launch.doctor import jobs as doctor_jobs

    class Executor:  # the one call doctor_jobs.submit makes of submitit's executor
        def submit(self, fn, *args):
            os.kill(os.getpid(), signal.SIGINT)  # the Ctrl-C, as sbatch has submitted the job
            return type("Job", (), {"job_id": "4242"})()

    monkeypatch.setattr(doctor_jobs, "_submitted", [])
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # Another thread (pytest-xdist's, MLflow's): the kernel hands it the SIGINT this thread blocks,
    # and Python runs the handler in this thread at once; blocking alone lost the id that way.
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            doctor_jobs.submit(Executor(), print)
            for _ in range(1000):  # the interrupt comes at the first bytecode once SIGINT is unblocked
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
        stop.set()
    assert doctor_jobs._submitted == ["4242"]
