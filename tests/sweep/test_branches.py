"""Cooldown branches in a sweep (``branches:``): each run of a WSD sweep is a parent followed by its
branches; a branch is the run of its budget (same key and config as that run written out in full),
costs its cooldown's FLOPs only, and names its parent and branch point; the parent checkpoints and
keeps its branch points; ``plan`` shows the families; bad branch specifications are one-line
errors naming the key, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from diffsweep.sweep import expand, load_sweep
from diffsweep.sweep.audit import audit_runs
from tests.helpers.badinput import refused, tree_state
from tests.helpers.cli import run as cli
from tests.sweep.test_tune import sweep

BASE = """
    set:
      data.path: nodata
      train.max_steps: 600
      train.warmup_steps: 60
      train.schedule: wsd
      train.decay_fraction: 0.2
      train.checkpoint_every: 300
    grid:
      model.size: [tiny-3xs]
      model.attention.kind: [transformer, diff_v2]
    seeds: 2
"""
BRANCHED = BASE + """
    branches:
      steps: [200, 400]
      cooldown: 0.25
      shape: sqrt
"""


def test_a_branch_is_the_run_of_its_budget_at_the_cost_of_its_cooldown(tmp_path):
    runs = expand(load_sweep(sweep(tmp_path, BRANCHED))).runs
    assert len(runs) == 4 * 3
    parent, b200, b400 = runs[:3]
    assert parent.branch is None and parent.name == "transformer-tiny-3xs-s0"
    assert [b200.name, b400.name] == ["transformer-tiny-3xs-s0-branch_200", "transformer-tiny-3xs-s0-branch_400"]
    # the branch point: the start of each branch's own cooldown (the last 25% of its steps)
    assert [b200.branch.step, b400.branch.step] == [150, 300]
    assert parent.config.train.checkpoint_at == (150, 300)  # the parent saves and keeps them
    assert {b.branch.parent_key for b in (b200, b400)} == {parent.key}
    # the same run as one written out in full: same key, config and tokens
    alone = expand(load_sweep(sweep(tmp_path, BASE.replace("train.max_steps: 600", "train.max_steps: 200").replace(
        "train.decay_fraction: 0.2", "train.decay_fraction: 0.25").replace("schedule: wsd", "schedule: wsd_sqrt"),
        "alone.yaml"))).runs[0]
    assert (b200.key, b200.tokens) == (alone.key, alone.tokens)
    assert b200.config.train.schedule.value == "wsd_sqrt" and b200.config.train.checkpoint_at == ()
    assert b200.flops == pytest.approx(alone.flops * 50 / 200)  # its cooldown only: steps 151-200
    # the parent's key does not depend on its branches (checkpoint_at is no part of a run's identity)
    plain = expand(load_sweep(sweep(tmp_path, BASE, "plain.yaml"))).runs
    assert [r.key for r in plain] == [r.key for r in runs if r.branch is None]


def test_tokens_budgets_and_the_audit_of_the_parents(tmp_path):
    budget = "train.max_steps: null\n      train.max_tokens: 614400\n      train.batch_tokens: 1024"
    path = sweep(tmp_path, BASE.replace("train.max_steps: 600", budget) + "    branches: {tokens: [204800]}\n")
    runs = expand(load_sweep(path)).runs
    branch = runs[1]
    assert branch.name.endswith("-branch_204.8K") and branch.config.train.max_tokens == 204800
    assert branch.branch.unit == "tokens" and branch.branch.step == branch.config.train.total_steps * 8 // 10
    audit = audit_runs(runs)
    assert [len(p.baseline_runs) for p in audit.pairs] == [2]  # the parents only


def test_plan_shows_each_family_and_its_branch_points(tmp_path):
    path = sweep(tmp_path, BRANCHED)
    r = cli("plan", str(path), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["runs"]
    assert [row["branch"]["step"] if row["branch"] else None for row in rows[:3]] == [None, 150, 300]
    assert rows[1]["branch"]["parent_key"] == rows[0]["key"] and rows[1]["branch"]["shape"] == "sqrt"
    assert rows[1]["flops"] == pytest.approx(rows[0]["flops"] * 50 / 600)
    r = cli("plan", str(path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "cooldown branches at 200, 400 steps, each decaying over its last 25% (sqrt): 8 branch(es) of 4 run(s)" in text
    assert (f"transformer-tiny-3xs-s0 ({rows[0]['key']}): branches 200, 400 from its steps 150, 300; the family costs "
            "1.2x its parent's FLOPs (2x as separate runs)") in text
    assert not (tmp_path / "runs").exists()  # plan writes nothing


def test_a_cooldown_of_a_fixed_length_decays_the_same_steps_in_every_branch(tmp_path):
    """``cooldown_length`` (the budgets' unit) instead of a share: every branch decays over those
    last steps, so its branch point is its budget less them, and it is the run of that budget whose
    decay_fraction is that share of it."""
    runs = expand(load_sweep(sweep(tmp_path, BRANCHED.replace("cooldown: 0.25", "cooldown_length: 100")))).runs
    parent, b200, b400 = runs[:3]
    assert [b200.branch.step, b400.branch.step] == [100, 300]
    assert [b200.branch.cooldown, b400.branch.cooldown] == [0.5, 0.25]
    assert [b.config.train.decay_fraction for b in (b200, b400)] == [0.5, 0.25]
    assert parent.config.train.checkpoint_at == (100, 300)
    alone = expand(load_sweep(sweep(tmp_path, BASE.replace("train.max_steps: 600", "train.max_steps: 400").replace(
        "train.decay_fraction: 0.2", "train.decay_fraction: 0.25").replace("schedule: wsd", "schedule: wsd_sqrt"),
        "alone.yaml"))).runs[0]
    assert b400.key == alone.key and b400.flops == pytest.approx(alone.flops * 100 / 400)
    r = cli("plan", str(tmp_path / "s.yaml"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "each decaying over its last 100 steps (sqrt)" in " ".join(r.stdout.split())
    # in tokens: the same length of tokens in every branch
    budget = "train.max_steps: null\n      train.max_tokens: 614400\n      train.batch_tokens: 1024"
    tokens = sweep(tmp_path, BASE.replace("train.max_steps: 600", budget)
                   + "    branches: {tokens: [204800, 409600], cooldown_length: 102400}\n", "tokens.yaml")
    t200, t400 = expand(load_sweep(tokens)).runs[1:3]
    assert [t200.branch.step, t400.branch.step] == [100, 300]  # each decays over its last 100 steps of 1,024 tokens


def test_a_child_sweep_gives_its_cooldown_as_a_share_or_a_length_over_its_parents(tmp_path):
    sweep(tmp_path, BRANCHED.replace("cooldown: 0.25", "cooldown_length: 100"), "parent.yaml")
    share = sweep(tmp_path, "extends: parent.yaml\nbranches: {cooldown: 0.5}\n", "share.yaml")
    assert [r.branch.step for r in expand(load_sweep(share)).runs[1:3]] == [100, 200]  # its share, not the length
    sweep(tmp_path, BRANCHED, "shared.yaml")
    length = sweep(tmp_path, "extends: shared.yaml\nbranches: {cooldown_length: 50}\n", "length.yaml")
    assert [r.branch.step for r in expand(load_sweep(length)).runs[1:3]] == [150, 350]


@pytest.mark.parametrize("change,needles", [
    (("cooldown: 0.25", "cooldown_length: 200"), ("branches.cooldown_length", "as long as the branch of 200",
                                                  "branches.steps[0]")),
    (("cooldown: 0.25", "cooldown: 0.25\n      cooldown_length: 50"), ("branches.cooldown_length", "one of the two")),
    (("cooldown: 0.25", "cooldown_length: -5"), ("branches.cooldown_length",)),
    (("steps: [200, 400]", "steps: [200, 700]"), ("branches.steps[1]", "ends after run", "600 steps")),
    (("train.schedule: wsd", "train.schedule: cosine"), ("branches.steps[0]", "train.schedule cosine",
                                                          "warmup-stable-decay")),
    (("steps: [200, 400]\n      cooldown: 0.25", "steps: [600]\n      cooldown: 0.1"),
     ("branches.steps[0]", "step 540", "stable phase ends (step 480)")),
    (("cooldown: 0.25", "cooldown: 1.5"), ("branches.cooldown", "longer", "(0, 1)")),
    (("cooldown: 0.25\n      shape: sqrt", "cooldown: 0.2"), ("branches.steps[1]", "itself")),  # the parent's cooldown
    (("shape: sqrt", "shape: cubic"), ("branches.shape", "linear, sqrt, cosine", "cubic")),
    (("steps: [200, 400]", "steps: [200, 200]"), ("branches.steps", "repeats a budget")),
    (("steps: [200, 400]", "steps: [50]"), ("branches.steps[0]", "warmup_steps")),
    (("steps: [200, 400]", "steps: []"), ("branches.steps", "exactly one of steps and tokens")),
    (("steps: [200, 400]", "steps: [200]\n      at: [3]"), ("branches", "at")),
    (("seeds: 2", "seeds: 2\n    tune: {train.lr: [0.001, 0.002]}"), ("branches", "tune")),
])
def test_bad_branch_specifications_are_refused_at_plan_and_launch(tmp_path, change, needles):
    text = BRANCHED.replace(*change)
    if "itself" in needles:
        text = text.replace("steps: [200, 400]", "steps: [200, 600]")
    assert text != BRANCHED
    path = sweep(tmp_path, text)
    before = tree_state(tmp_path)
    refused(cli("plan", str(path), cwd=tmp_path), str(path), *needles)
    refused(cli("launch", str(path), "--executor", "local", cwd=tmp_path), *needles)
    assert tree_state(tmp_path) == before  # nothing submitted, nothing written


def test_branches_merge_under_extends(tmp_path):
    sweep(tmp_path, BRANCHED, "parent.yaml")
    child = sweep(tmp_path, "extends: parent.yaml\nbranches: {steps: [300]}\n", "child.yaml")
    runs = expand(load_sweep(child)).runs
    assert [r.name for r in runs[:2]] == ["transformer-tiny-3xs-s0", "transformer-tiny-3xs-s0-branch_300"]
    assert runs[1].branch.cooldown == 0.25 and runs[1].branch.shape == "sqrt"  # the parent file's


def test_a_branch_selected_without_its_never_launched_parent_is_refused_at_launch(tmp_path):
    path = sweep(tmp_path, BRANCHED)
    before = tree_state(tmp_path)
    refused(cli("launch", str(path), "--executor", "local", "--only", "s0-branch_200", cwd=tmp_path),
            "only", "transformer-tiny-3xs-s0-branch_200 is a cooldown branch of transformer-tiny-3xs-s0",
            "neither launched nor selected")
    assert tree_state(tmp_path) == before
