"""Cooldown branches (diffsweep.train.branch): a WSD run started from a longer WSD run's checkpoint
at the start of its own decay trains only its cooldown and reproduces, bitwise, the run it names
trained from scratch; the parent's checkpoint is only read; a checkpoint that cannot start the run
is refused naming what differs."""

from __future__ import annotations

import hashlib

import pytest

from diffsweep.config import ConfigError
from diffsweep.tracking.tags import BRANCH_PARENT_KEY, BRANCH_STEP
from diffsweep.train.checkpoint import list_checkpoints, load_checkpoint
from diffsweep.train.trainer import train
from tests.helpers.training import history, quiet, recorder, tiny

# The parent: 16 steps of WSD decaying over its last 4 (steps 13-16). A run of 10 steps decaying
# over its last 2 (steps 9-10) shares the parent's steps 1-8: it branches from the checkpoint at 8.
PARENT = ("train.schedule=wsd", "train.max_steps=16", "train.decay_fraction=0.25")
BRANCH = ("train.schedule=wsd", "train.max_steps=10", "train.decay_fraction=0.2")


def _digest(folder) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def parent(text_dataset, tmp_path_factory):
    root = tmp_path_factory.mktemp("branch")
    result = train(tiny(text_dataset, *PARENT), root / "parent", experiment="branches", echo=quiet)
    assert result.status == "finished"
    return root, result


def test_a_branch_reproduces_the_run_it_names_and_reads_its_parent_only(parent, text_dataset, store_client):
    root, parent_result = parent
    at8 = next(c for c in list_checkpoints(root / "parent" / "checkpoints") if load_checkpoint(c)["step"] == 8)
    before = _digest(root / "parent")
    cfg = tiny(text_dataset, *BRANCH)
    full: dict = {}
    train(cfg, root / "full", experiment="branches", callbacks=(recorder(full),), echo=quiet)
    branched: dict = {}
    result = train(cfg, root / "branch", experiment="branches", branch_from=at8, callbacks=(recorder(branched),),
                   echo=quiet)
    assert result.status == "finished" and sorted(branched) == [9, 10]  # only the cooldown is trained
    assert branched == {s: m for s, m in full.items() if s > 8}  # bitwise: the same steps as the full run's
    assert _digest(root / "parent") == before  # the parent's run directory is untouched
    run = store_client.get_run(result.run_id)
    assert run.data.tags[BRANCH_PARENT_KEY] == load_checkpoint(at8)["run_key"] and run.data.tags[BRANCH_STEP] == "8"
    assert run.data.tags["mlflow.parentRunId"] == parent_result.run_id  # the UI nests it under its parent
    assert run.data.tags["diffsweep.run_key"] != run.data.tags[BRANCH_PARENT_KEY]
    assert [s for s, _ in history(store_client, result.run_id, "train/loss")] == [9, 10]
    # relaunching a finished branch does nothing; its own checkpoints come before the parent's
    again = train(cfg, root / "branch", experiment="branches", branch_from=at8, echo=quiet)
    assert again.run_id == result.run_id and again.step == 10


def test_a_checkpoint_that_cannot_start_the_run_is_refused(parent, text_dataset, tmp_path):
    root, _ = parent
    by_step = {load_checkpoint(c)["step"]: c for c in list_checkpoints(root / "parent" / "checkpoints")}
    cases = [
        (by_step[14], BRANCH, "is at step 14, and this run ends at step 10: a branch starts before its own end"),
        (by_step[14], ("train.schedule=wsd", "train.max_steps=20", "train.decay_fraction=0.2"),
         "its run's learning rate at step 13 was"),  # the parent had begun its decay
        (by_step[8], (*BRANCH, "train.lr=1e-3"), "its run differs from this one in train.lr"),
        (by_step[8], ("train.schedule=linear", "train.max_steps=10"), "its run's learning rate at step 3 was"),
    ]
    for checkpoint, sets, message in cases:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            train(tiny(text_dataset, *sets), tmp_path / "refused", experiment="branches", branch_from=checkpoint,
                  echo=quiet)
        assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())


def test_train_branch_from_on_the_command_line(parent, text_dataset, tmp_path, store):
    """``diffsweep train --branch-from CHECKPOINT`` as a user runs it: the branch's own run in the
    store, the refusals one line with exit 2 and nothing made."""
    from tests.cli.test_train_cli import train_args
    from tests.helpers.badinput import refused
    from tests.helpers.cli import run

    root, _ = parent
    at8 = next(c for c in list_checkpoints(root / "parent" / "checkpoints") if load_checkpoint(c)["step"] == 8)
    r = run(*train_args(text_dataset, *BRANCH), "--branch-from", str(at8), "--out", "runs", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stderr
    assert f"from {at8}" in r.stdout and "at step 8 of 10" in r.stdout
    r = run(*train_args(text_dataset, *BRANCH, "train.seed=1"), "--branch-from", str(at8), "--out", "other",
            cwd=tmp_path, env=store)
    refused(r, f"{at8}: its run differs from this one in train.seed (0 there, 1 here)")
    r = run(*train_args(text_dataset, *BRANCH), "--branch-from", str(tmp_path / "nowhere"), "--out", "other",
            cwd=tmp_path, env=store)
    refused(r, str(tmp_path / "nowhere"))
    r = run(*train_args(text_dataset, *BRANCH), "--branch-from", str(at8), "--resume", str(at8), "--out", "other",
            cwd=tmp_path, env=store)
    refused(r, "--branch-from: a run resumes from its own checkpoint (--resume) or starts from another run's")
    assert not (tmp_path / "other").exists()


def test_checkpoint_at_steps_are_saved_never_pruned_and_seen_by_the_callbacks(text_dataset, tmp_path):
    """``train.checkpoint_at``: the steps a sweep's branches start from are checkpointed whatever
    ``checkpoint_every`` says and outlive ``keep_checkpoints``; a step's callbacks run after its
    checkpoint is in place (a job hands it on to the branches waiting for it)."""
    cfg = tiny(text_dataset, "train.max_steps=7", "train.checkpoint_every=3", "train.keep_checkpoints=1",
               "train.checkpoint_at=[2,5]")
    folder = tmp_path / "run" / "checkpoints"
    seen: dict[int, list[int]] = {}

    def watch(step: int, metrics: dict[str, float]) -> None:
        seen[step] = [load_checkpoint(c)["step"] for c in list_checkpoints(folder)]

    assert train(cfg, tmp_path / "run", experiment="pinned", callbacks=(watch,), echo=quiet).status == "finished"
    assert seen[2] == [2] and seen[3] == [2, 3] and seen[5] == [2, 3, 5] and seen[6] == [2, 5, 6]
    assert [load_checkpoint(c)["step"] for c in list_checkpoints(folder)] == [2, 5, 7]
