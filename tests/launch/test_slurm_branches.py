"""Cooldown branches on the localhost Slurm cluster: submitted held with their parent, released by the
parent's job once it has saved their branch points, right through the parent's preemption and requeue."""

from __future__ import annotations

import subprocess

import pytest

from diffsweep import slurm
from diffsweep.train.checkpoint import checkpoint_step, list_checkpoints
from tests.helpers.cli import run as cli
from tests.launch.conftest import held, ledger, training, wait_for
from tests.launch.slurm_jobs import own_jobs  # noqa: F401 (fixture)
from tests.launch.test_branches_launch import branched_sweep, check_family, runs_of

pytestmark = pytest.mark.slurm


def test_slurm_branches_wait_held_and_start_from_the_right_checkpoint_of_a_requeued_parent(
        tmp_path, text_dataset, store):
    """The parent trains 600 steps; its branches of 60 and 480 steps start from its steps 45 and
    360. Both are submitted at launch, held. The first is released once step 45 is saved and trains
    while the parent, stopped, has not reached step 360 (the second still held); the parent is then
    preempted (USR2), requeues, resumes, and releases the second at step 360."""
    sweep = branched_sweep(tmp_path / "b.yaml", text_dataset, 600, "60, 480")
    out = tmp_path / "runs" / "t"
    r = cli("launch", str(sweep), "--profile", "localhost", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    parent, early, late = "transformer-tiny-xs-s0", "transformer-tiny-xs-s0-branch_60", \
        "transformer-tiny-xs-s0-branch_480"
    entries = {e["name"]: e for e in ledger(out)["entries"].values()}
    assert set(entries) == {parent, early, late}  # every branch submitted with its parent
    ids = {n: e["attempts"][0]["job_id"] for n, e in entries.items()}
    dirs = {n: v[1] for n, v in runs_of(out).items()}

    def released(name: str) -> bool:
        return ledger(out)["entries"][entries[name]["key"]]["attempts"][0]["released"] is not None

    assert not released(late) and slurm.states([ids[late]])[ids[late]].startswith("PENDING")
    wait_for(lambda: released(early), 240, f"{early} released by its parent")
    job = wait_for(lambda: training(dirs[parent]), 60, f"{parent} training")
    with held(job["pid"]):
        reached = max(checkpoint_step(p) for p in list_checkpoints(dirs[parent] / "checkpoints"))
        assert reached < 360 and not released(late), reached  # the late branch waits, held
        assert slurm.states([ids[late]])[ids[late]] == "PENDING (JobHeldUser)"
        wait_for(lambda: training(dirs[early]) or (dirs[early] / "checkpoints").is_dir(), 240,
                 f"{early} training while its parent is stopped mid-run")
        subprocess.run(["scancel", "--signal=USR2", ids[parent]], check=True)  # handled once it goes on
    wait_for(lambda: training(dirs[parent], starts=2), 240, f"{parent} requeued and training")
    assert len(ledger(out)["entries"][entries[parent]["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted
    wait_for(lambda: released(late), 240, f"{late} released by the requeued parent")
    r = cli("launch", str(sweep), "--profile", "localhost", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "3 done" in r.stdout + r.stderr, r.stdout + r.stderr
    check_family(out, store["MLFLOW_TRACKING_URI"], parent, {early: 45, late: 360})
