"""Cooldown branches on the localhost Slurm cluster: submitted held with their parent, released by the
parent's job once it has saved their branch points, right through the parent's preemption and requeue."""

from __future__ import annotations

import subprocess

import pytest

from diffsweep import slurm
from diffsweep.train.checkpoint import checkpoint_step, list_checkpoints
from tests.helpers.cli import run as cli
from tests.helpers.held import StepHold
from tests.launch.conftest import ledger, training, wait_for
from tests.launch.slurm_jobs import own_jobs  # noqa: F401 (fixture)
from tests.launch.test_branches_launch import branched_sweep, check_family, runs_of

pytestmark = pytest.mark.slurm


def test_slurm_branches_wait_held_and_start_from_the_right_checkpoint_of_a_requeued_parent(
        tmp_path, text_dataset, store):
    """The parent trains 200 steps; its branches of 40 and 160 steps start from its steps 30 and
    120. Both are submitted at launch, held. The first is released once step 30 is saved and trains
    while the parent, held at step 60 (``StepHold``), has not reached step 120 (the second still
    held); the parent is then preempted (USR2) there, requeues, resumes, and releases the second
    at step 120."""
    sweep = branched_sweep(tmp_path / "b.yaml", text_dataset, 200, "40, 160")
    out = tmp_path / "runs" / "t"
    hold = StepHold(tmp_path / "hold", 60)  # only the parent reaches step 60 (the branches train 31-40, 121-160)
    r = cli("launch", str(sweep), "--profile", "localhost", cwd=tmp_path, env=store | hold.env())
    assert r.returncode == 0, r.stdout + r.stderr
    parent, early, late = "transformer-tiny-xs-s0", "transformer-tiny-xs-s0-branch_40", \
        "transformer-tiny-xs-s0-branch_160"
    entries = {e["name"]: e for e in ledger(out)["entries"].values()}
    assert set(entries) == {parent, early, late}  # every branch submitted with its parent
    ids = {n: e["attempts"][0]["job_id"] for n, e in entries.items()}
    dirs = {n: v[1] for n, v in runs_of(out).items()}

    def released(name: str) -> bool:
        return ledger(out)["entries"][entries[name]["key"]]["attempts"][0]["released"] is not None

    assert not released(late) and slurm.states([ids[late]])[ids[late]].startswith("PENDING")
    wait_for(lambda: released(early), 240, f"{early} released by its parent")
    (pid,) = hold.wait(timeout=240)  # the parent, at step 60
    assert pid == training(dirs[parent])["pid"]
    reached = max(checkpoint_step(p) for p in list_checkpoints(dirs[parent] / "checkpoints"))
    assert reached < 120 and not released(late), reached  # the late branch waits, held
    assert slurm.states([ids[late]])[ids[late]] == "PENDING (JobHeldUser)"
    wait_for(lambda: training(dirs[early]) or (dirs[early] / "checkpoints").is_dir(), 240,
             f"{early} training while its parent is stopped mid-run")
    subprocess.run(["scancel", "--signal=USR2", ids[parent]], check=True)  # handled where it waits
    wait_for(lambda: hold.signalled(pid), 120, f"{parent} to handle USR2", poll=0.05)
    hold.release()
    wait_for(lambda: training(dirs[parent], starts=2), 240, f"{parent} requeued and training")
    assert len(ledger(out)["entries"][entries[parent]["key"]]["attempts"]) == 1  # requeued by Slurm, not resubmitted
    wait_for(lambda: released(late), 240, f"{late} released by the requeued parent")
    r = cli("launch", str(sweep), "--profile", "localhost", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "3 done" in r.stdout + r.stderr, r.stdout + r.stderr
    check_family(out, store["MLFLOW_TRACKING_URI"], parent, {early: 30, late: 120})
