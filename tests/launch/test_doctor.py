"""``diffsweep doctor`` through the CLI: on the localhost Slurm cluster (marked ``slurm``; they skip
without a controller unless DIFFSWEEP_REQUIRE_SLURM=1), without Slurm, and its pure helpers."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from diffsweep.launch.doctor import _constraint_features, _gpu_types
from tests.launch.conftest import cli, require_slurm

# The localhost cluster as a CPU-only profile: every check can pass there (its fake GPUs are not
# CUDA devices, see test_fake_gpus_are_assigned_but_not_cuda_devices).
CPU_PROFILE = ("executor: slurm\ngpus_per_node: 0\ncpus_per_gpu: 1\nmem_per_gpu_gb: 2\nmin_time_minutes: 60\n"
               "signal_delay_s: 30\nslurm: {partition: debug}\ncpu_jobs: {cpus: 1, mem_gb: 1}\n")
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
        "✗ partition: profile p: slurm.partition: 'no-such' is not a partition of this cluster; expected one of [debug]",
        ("    fix: set slurm.partition in profile p to a partition of this cluster ([debug]), or pass --slurm "
         "partition=NAME"),
        "1 of 3 checks failed",
    ]
    r = doctor(tmp_path, store, "--profile", str(tmp_path / "p.yaml"), "--slurm", "partition=debug", "--json",
               "--timeout", "1")  # fixed on the command line; no time for the jobs
    report = json.loads(r.stdout)
    assert {c["name"]: c["ok"] for c in report["checks"]}["partition"] is True


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
