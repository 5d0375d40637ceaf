"""What the Slurm tests (test_slurm.py, test_slurm_site.py) share: each starts on an idle
localhost cluster and cancels the jobs it submitted, so none waits on another test's jobs; and
the few questions they ask Slurm and a sweep's files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import run as cli
from tests.launch.conftest import wait_for

IDLE_WAIT_S = 180  # a test's leftovers: scancel'led jobs in COMPLETING (KillWait 5 s), worst seen ~30 s


def squeue_ids() -> set[str]:
    """The ids of every job and array task Slurm holds (``123_0``, as the ledger records them)."""
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i"], capture_output=True, text=True, timeout=30, check=True)
    return set(out.stdout.split())


def submitted_ids(root: Path) -> list[str]:
    """Every Slurm job id recorded in a sweep ledger under ``root``."""
    return [a["job_id"] for path in root.rglob("ledger.json")
            for e in json.loads(path.read_text())["entries"].values() for a in e["attempts"] if a.get("job_id")]


@pytest.fixture(autouse=True)
def own_jobs(slurm_cluster, tmp_path):
    """Start on an idle cluster (no job in squeue; fail after a bounded wait naming what is there),
    and at the end cancel this test's jobs: those in ledgers under ``tmp_path`` and any id the
    test adds to the yielded list."""
    if squeue_ids():
        try:
            wait_for(lambda: not squeue_ids(), IDLE_WAIT_S, "an idle cluster")
        except AssertionError:
            pytest.fail(f"the Slurm cluster is busy: jobs {sorted(squeue_ids())} still in squeue after "
                        f"{IDLE_WAIT_S} s (another test's or someone else's); scancel them and rerun")
    extra: list[str] = []
    yield extra
    ids = sorted(set(extra + submitted_ids(tmp_path)) & squeue_ids())
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def status(sweep: Path, cwd: Path, env: dict, *profile: str) -> dict:
    """``diffsweep status SWEEP --json`` (profile localhost unless ``--profile P`` is given)."""
    r = cli("status", str(sweep), *(profile or ("--profile", "localhost")), "--json", cwd=cwd, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def counts(sweep: Path, cwd: Path, env: dict, *profile: str) -> dict:
    return status(sweep, cwd, env, *profile)["counts"]


def sacct_states(job_ids: list[str]) -> list[str]:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "--format=State", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, timeout=60)
    return out.stdout.split()
