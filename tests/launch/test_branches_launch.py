"""Launching a sweep with cooldown branches (``branches:``): ``launch`` submits every branch with its
parent, held until the parent has saved the checkpoint it starts from (``diffsweep.launch.gates``);
each branch then trains only its cooldown from that checkpoint, in its own MLflow run nested under
the parent's; the parent keeps its branch points whatever ``keep_checkpoints`` says. On the local
queue here; on the localhost Slurm cluster, with the parent preempted and requeued, in
test_slurm_branches.py."""

from __future__ import annotations

import json

from diffsweep.tracking.tags import BRANCH_CHECKPOINT, BRANCH_STEP
from diffsweep.train.checkpoint import checkpoint_step, list_checkpoints
from tests.helpers.cli import run as cli
from tests.launch.conftest import attempts, ledger, metric_steps, write_sweep

WSD = """
  train.schedule: wsd
  train.decay_fraction: 0.25
"""


def branched_sweep(path, dataset, steps: int, budgets: str):
    sweep = write_sweep(path, dataset, steps=steps, kinds=("transformer",),
                        extra=f"branches: {{steps: [{budgets}], cooldown: 0.25}}\n")
    text = sweep.read_text().replace("set:\n", "set:" + WSD, 1)
    sweep.write_text(text.replace("train.checkpoint_every: 2\n", "train.checkpoint_every: 50\n")
                     .replace("train.keep_checkpoints: 100\n", "train.keep_checkpoints: 1\n")
                     .replace("train.eval_every: 4\n", "train.eval_every: 20\n"))
    return sweep


def runs_of(out):
    """name -> (key, run directory, MLflow run id) of every run in the ledger."""
    found = {}
    for key, e in ledger(out)["entries"].items():
        run_dir = out / "runs" / f"{e['name']}-{key}"
        run_id = json.loads((run_dir / "run.json").read_text())["run_id"] if (run_dir / "run.json").is_file() else None
        found[e["name"]] = (key, run_dir, run_id)
    return found


def check_family(out, uri, parent: str, points: dict[str, int]) -> None:
    """Each branch started from its parent's checkpoint at its branch point and trained only its
    cooldown; the parent kept those checkpoints."""
    from mlflow.tracking import MlflowClient

    runs = runs_of(out)
    _, parent_dir, parent_id = runs[parent]
    kept = {checkpoint_step(p) for p in list_checkpoints(parent_dir / "checkpoints")}
    assert set(points.values()) <= kept, kept  # pinned: keep_checkpoints is 1
    for name, step in points.items():
        _, _, run_id = runs[name]
        tags = MlflowClient(uri).get_run(run_id).data.tags
        assert tags[BRANCH_STEP] == str(step) and tags["mlflow.parentRunId"] == parent_id
        assert tags[BRANCH_CHECKPOINT] == str(parent_dir / "checkpoints" / f"step_{step:08d}")
        budget = int(name.rsplit("_", 1)[1])
        assert metric_steps(uri, run_id) == list(range(step + 1, budget + 1)), name  # its cooldown only


def test_local_launch_starts_each_branch_from_its_parents_checkpoint(tmp_path, text_dataset, store):
    sweep = branched_sweep(tmp_path / "b.yaml", text_dataset, 120, "40, 80")
    out = tmp_path / "runs" / "t"
    r = cli("launch", str(sweep), "--executor", "local", "--max-parallel", "2", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    parent = "transformer-tiny-xs-s0"
    gates = {e["name"]: e["attempts"][0]["gate"] for e in ledger(out)["entries"].values()}
    assert gates[parent] is None and gates[f"{parent}-branch_40"].endswith("/checkpoints/step_00000030")
    check_family(out, store["MLFLOW_TRACKING_URI"], parent, {f"{parent}-branch_40": 30, f"{parent}-branch_80": 60})
    before = attempts(out)
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert r.returncode == 0 and "nothing to submit (3 done)" in r.stdout, r.stdout + r.stderr
    assert attempts(out) == before


def test_branches_added_to_a_launched_sweep_whose_parent_kept_no_branch_point_are_refused(tmp_path, text_dataset,
                                                                                         store):
    """A parent launched before its sweep declared branches neither keeps nor hands on their
    checkpoints (its key is unchanged: it is not trained again): launch refuses the branches,
    naming the parent and the step, instead of holding them for ever; nothing is submitted."""
    sweep = branched_sweep(tmp_path / "b.yaml", text_dataset, 60, "40")
    text = sweep.read_text()
    sweep.write_text(text[:text.index("branches:")])
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "runs" / "t"
    before = attempts(out)
    sweep.write_text(text)
    r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert r.returncode == 2 and "branches:" in r.stderr and "transformer-tiny-xs-s0-branch_40 starts from" in r.stderr
    assert "checkpoint at step 30" in r.stderr and "launched before this branch was declared" in r.stderr, r.stderr
    assert attempts(out) == before
