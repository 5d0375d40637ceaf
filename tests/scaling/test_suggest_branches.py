"""``diffsweep suggest`` on runs that give several points (#34): a run and its cooldown branches share
the run's offset, so a new branch of a run is one more point at that offset for its cooldown's cost,
and another seed is a new run with its own offset and all of the run's points."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest

from diffsweep.launch.api import SweepTarget, plan_sweep
from diffsweep.scaling.analysis import FitRequest
from diffsweep.scaling.suggest import candidates
from diffsweep.scaling.suggest import preposterior as sg
from diffsweep.sweep import load_sweep
from tests.helpers.badinput import refused
from tests.helpers.cli import run
from tests.scaling.conftest import tiny_ladder_sweep
from tests.scaling.synthetic import SCAN_TOKENS, log_runs, token_scan

RATE = 989e12 * 0.40 * 3600  # FLOPs per GPU-hour, as the CLI's default
N = 3e9  # token_scan's model size


def _design(run_sd: float, eval_sd: float, seed: int = 3, boot: int = 200, runs: int = 2):
    points = token_scan(runs=runs, run_sd=run_sd, eval_sd=eval_sd, rng=np.random.default_rng(seed), branches=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sg.design_from_points(points, FitRequest(n_boot=boot, seed=seed), num_draws=24)


def test_the_linearised_width_of_a_branch_scan_agrees_with_the_full_bootstrap():
    """The sandwich covariance under shared run offsets against the fit's hierarchical bootstrap, on
    4 branch scans (2 runs per architecture, 9 points each): within 0.6-1.5x each, and the offsets
    matter (read as independent points, the width is far narrower)."""
    ratios, independent = [], []
    for seed in range(4):
        design, result = _design(0.005, 0.002, seed=seed, boot=400)
        assert design.run_sd > 0 and np.isfinite(design.run_dof), design
        assert sorted(set(design.families["diff_v1"])) == ["diff_v1-s0", "diff_v1-s1"]  # a run and its branches
        row = next(r for r in result.ratios if r["at"] == design.ref)
        ratios.append(sg.current_width(design) / (row["hi"] - row["lo"]))
        independent.append(sg.current_width(replace(design, run_sd=0.0)) / sg.current_width(design))
    assert all(0.6 < r < 1.5 for r in ratios) and 0.7 < np.median(ratios) < 1.3, ratios
    assert max(independent) < 0.7, independent


def test_a_new_branch_is_priced_at_its_cooldown_and_another_seed_at_its_run_and_cooldowns():
    design, result = _design(0.005, 0.002)
    pool = candidates.extra_candidates(result.points, design, "num_params", RATE, sizes=[150e9, 500e9], cooldown=0.1)
    seeds = [c for c in pool if c.origin == "seed"]
    branches = [c for c in pool if c.origin == "branch"]
    # one seed candidate per architecture (both runs have the same points), giving all 9 of them
    assert sorted(c.like for c in seeds) == ["diff_v1-s0", "transformer-s0"], seeds
    last = SCAN_TOKENS[-1]
    for c in seeds:
        assert len(c.points) == len(SCAN_TOKENS) and c.repeatable and c.family == ""
        assert c.gpu_hours == pytest.approx(6 * N * (last + 0.1 * SCAN_TOKENS[:-1].sum()) / RATE)
    # a new branch at 150B of each of the four runs (500B is past their end: none there), its cooldown only
    assert sorted(c.family for c in branches) == ["diff_v1-s0", "diff_v1-s1", "transformer-s0", "transformer-s1"]
    for c in branches:
        assert c.x == 150e9 and len(c.points) == 1 and not c.repeatable
        assert c.gpu_hours == pytest.approx(6 * N * 0.1 * 150e9 / RATE)
        assert "a new branch of" in c.label
    # a separate run at 500B (no run reaches it) is still an extra of its own
    assert {c.arch for c in pool if c.origin == "extra" and c.x == 500e9} == {"transformer", "diff_v1"}


def test_a_scan_of_one_runs_checkpoints_is_a_family_too():
    """A token scan read from each run's checkpoints (no branches): its points share the run's offset;
    another seed is a new run giving all of them at the cost of the run alone (checkpoints are free),
    and there is no branch to add."""
    points = token_scan(runs=2, rng=np.random.default_rng(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design, result = sg.design_from_points(points, FitRequest(n_boot=200, seed=5), num_draws=24)
    assert design.run_sd > 0
    pool = candidates.extra_candidates(result.points, design, "num_params", RATE, sizes=[150e9])
    seeds = [c for c in pool if c.origin == "seed"]
    assert len(seeds) == 2 and not [c for c in pool if c.origin == "branch"]
    assert all(len(c.points) == len(SCAN_TOKENS) and c.gpu_hours == pytest.approx(6 * N * SCAN_TOKENS[-1] / RATE)
               for c in seeds), seeds
    now, ranked = sg.rank(design, seeds)
    assert all(s.width_after < now for s in ranked)


@pytest.mark.parametrize("runs, noise, cooldown, first", [(2, (0.005, 0.0005), 0.2, "seed"),
                                                          (4, (0.0005, 0.006), 0.05, "branch")])
def test_where_the_noise_is_decides_between_a_new_branch_and_another_seed(runs, noise, cooldown, first):
    """Offsets dominating (run sd 0.005, per point 0.0005; 2 runs per architecture): a new branch adds a
    point at an offset the data already pin, so another run narrows the CI most per GPU-hour (and
    read as independent points, with no shared offset, a branch's cheap point would come first).
    Per-point noise dominating (0.006, offsets 0.0005; 4 runs, 5% cooldowns): a branch's point at a
    fraction of a run's cost does."""
    design, result = _design(*noise, runs=runs)
    pool = candidates.extra_candidates(result.points, design, "num_params", RATE, sizes=[60e9, 150e9, 300e9],
                               cooldown=cooldown)
    pool = [c for c in pool if c.origin in ("seed", "branch")]
    _, ranked = sg.rank(design, pool)
    assert ranked[0].candidate.origin == first, [(s.candidate.label, s.per_gpu_hour) for s in ranked]
    assert ranked[0].reduction > 0
    if first == "seed":
        _, alone = sg.rank(replace(design, run_sd=0.0), pool)
        assert alone[0].candidate.origin == "branch", [(s.candidate.label, s.per_gpu_hour) for s in alone]


def test_suggest_on_a_csv_of_a_branch_scan_lists_new_branches(tmp_path):
    token_scan(runs=2, run_sd=0.0005, eval_sd=0.006, rng=np.random.default_rng(3), branches=True).to_csv(
        tmp_path / "scan.csv", index=False)
    args = ("suggest", "scan.csv", "--sizes", "150B", "--boot", "100", "--draws", "8")
    r = run(*args, "--cooldown", "0.1", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["axis"] == "D" and out["run_sd"] > 0
    new = [c for c in out["candidates"] if c["origin"] == "branch"]
    assert sorted(c["family"] for c in new) == ["diff_v1-s0", "diff_v1-s1", "transformer-s0", "transformer-s1"]
    assert all(c["gpu_hours"] == pytest.approx(6 * N * 0.1 * 150e9 / RATE) and c["points"] == 1 for c in new)
    seed = next(c for c in out["candidates"] if c["origin"] == "seed")
    assert seed["points"] == len(SCAN_TOKENS) and seed["family"] in ("diff_v1-s0", "transformer-s0")
    text = run(*args, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "a new branch of" in text.stdout and "share the run's offset" in text.stdout
    assert "add its budget to the sweep's branches" in text.stdout
    for bad in ("0", "1.5", "nan"):
        refused(run(*args, "--cooldown", bad, cwd=tmp_path), "--cooldown")


def _branch_loss(arch: str, num_params: float, tokens: float) -> float:
    return 2.0 + 30.0 * tokens ** -0.28 * (1.0 if arch == "transformer" else 0.9)


def _offset(run) -> float:
    """A run family's offset (its parent's key) plus a branch's own cooldown noise (its key)."""
    family = run.branch.parent_key if run.branch is not None else run.key
    return (0.01 * np.sin(len(family) + sum(map(ord, family)))
            + 0.004 * np.cos(sum(map(ord, run.key)) * 1.7))


@pytest.mark.parametrize("cooldown", ["cooldown: 0.2", "cooldown_length: 4"])
def test_suggest_on_a_sweep_prices_new_branches_at_their_cooldown(tmp_path, text_dataset, cooldown):
    """A sweep with branches, measured (its runs logged finished as diffsweep train logs them); a budget
    added to its branches: the new branches are planned candidates sharing their parents' offsets,
    priced at their cooldown as plan prices them; and a token count of --sizes is a new branch of
    each measured run, priced at the sweep's cooldown (a share of its tokens, or its length)."""
    sweep = tiny_ladder_sweep(tmp_path, "suggest-branches", ("tiny-2xs",), text_dataset, **{
        "train.max_steps": 40, "train.schedule": "wsd", "train.decay_fraction": 0.2, "train.eval_every": 10})
    sweep.write_text(sweep.read_text() + f"seeds: 2\nbranches:\n  steps: [10, 20, 30]\n  {cooldown}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_runs(uri, sweep, _branch_loss, offset=_offset)
    sweep.write_text(sweep.read_text().replace("steps: [10, 20, 30]", "steps: [10, 20, 25, 30]"))
    env = {"MLFLOW_TRACKING_URI": uri}
    plan = plan_sweep(SweepTarget(load_sweep(sweep, ())))
    priced = {r.run.name: r for r in plan.runs}
    r = run("suggest", str(sweep), "--json", "--boot", "100", "--draws", "8", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["axis"] == "D" and out["run_sd"] > 0, out
    planned = {c["name"]: c for c in out["candidates"] if c["origin"] == "planned"}
    assert sorted(planned) == sorted(n for n in priced if n.endswith("-branch_25")), list(planned)
    for name, c in planned.items():
        parent = priced[name.removesuffix("-branch_25")]
        assert c["family"] == parent.run.key and c["points"] == 1, c
        # as the planner counts it (a CPU profile: its FLOPs at the default GPU rate), its cooldown only:
        # the last 20% of 25 steps, or the last 4, against the parent's 40
        assert c["gpu_hours"] == pytest.approx(priced[name].run.flops / RATE, rel=1e-9)
        steps = 4 if "length" in cooldown else 5
        assert priced[name].run.flops == pytest.approx(parent.run.flops * steps / 40, rel=1e-9)
    batch, n = plan.runs[0].run.config.train.batch_tokens, plan.runs[0].run.num_params
    r = run("suggest", str(sweep), "--json", "--boot", "100", "--draws", "8", "--sizes", str(15 * batch),
            "--no-seeds", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    new = [c for c in json.loads(r.stdout)["candidates"] if c["origin"] == "branch"]
    assert len(new) == 4 and {c["tokens"] for c in new} == {15 * batch}, new
    trained = 4 * batch if "length" in cooldown else 0.2 * 15 * batch
    assert all(c["gpu_hours"] == pytest.approx(6 * n * trained / RATE) for c in new), new
