"""Every sweep shipped in sweeps/ expands and validates; golden names and keys pin the expansion
(regenerate with DIFFSWEEP_UPDATE_GOLDEN=1 after a deliberate change to run identity)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from diffsweep.config import load_config
from diffsweep.config.identity import run_key
from diffsweep.sweep import expand, load_sweep

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
EXPECTED_RUNS = {"table6-ablation": 21, "fig3a-size-scan": 10, "fig3b-token-scan": 2, "diff-versions": 9,
                 "diff-v2-blog": 16, "lambda-init": 30, "demo-ladder": 15, "demo-tuned": 24, "fig3b-token-wsd": 18,
                 "demo-branches": 16}


def test_every_shipped_sweep_is_known():
    assert sorted(p.stem for p in SWEEPS) == sorted(EXPECTED_RUNS)


def pinned_key(config) -> str:
    """The run key with the repository at /project: data paths are part of the key, and the
    shipped sweeps' data lies in the repository's data/ (their paths are relative to sweeps/)."""
    path = config.data.path
    assert path.startswith(f"{REPO}/data/"), path
    return run_key(dataclasses.replace(config, data=dataclasses.replace(
        config.data, path="/project" + path.removeprefix(str(REPO)))))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_shipped_sweep_expands(path):
    e = expand(load_sweep(path))
    assert len(e.runs) == EXPECTED_RUNS[path.stem]
    assert not e.warnings
    golden = GOLDEN / f"{path.stem}.json"
    got = [{"name": r.name, "key": pinned_key(r.config), "params": r.num_params, "tokens": r.tokens} for r in e.runs]
    if os.environ.get("DIFFSWEEP_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(golden.read_text())


def test_table6_rows():
    runs = {r.name: r for r in expand(load_sweep(REPO / "sweeps/table6-ablation.yaml")).runs}
    a = {n: r.config.model.attention for n, r in runs.items()}
    assert (a["transformer-1.4B-hd_128-s0"].num_heads, a["transformer-1.4B-hd_256-s0"].num_heads) == (16, 8)
    assert a["transformer-1.4B-hd_256-gn_on-s0"].head_norm.value == "rmsnorm"
    assert a["diff_v1-1.4B-hd_128-s0"].num_heads == 8 and a["diff_v1-1.4B-hd_128-s0"].head_norm.value == "rmsnorm"
    assert a["diff_v1-1.4B-hd_128-gn_off-s0"].head_norm.value == "none"
    assert a["diff_v1-1.4B-hd_128-lam_0.8-s0"].lambda_init == "constant:0.8"
    assert {r.config.train.lr for r in runs.values()} == {1.5e-4}
    # Rows differ by 0.001-0.004 nats in the paper, below seed noise: every row runs >= 3 seeds.
    seeds: dict[str, set[int]] = {}
    for name, r in runs.items():
        seeds.setdefault(name.rsplit("-s", 1)[0], set()).add(r.config.train.seed)
    assert len(seeds) == 7 and all(len(s) >= 3 for s in seeds.values())


def test_token_scan_and_3b_preset_agree():
    """Fig. 3b's runs are §3.1's 3B models (paper §3.2): the sweep and the 3B preset train the same
    length, 90K steps, and the sweep evaluates and checkpoints every 10K steps (nine points)."""
    preset = load_config(None, ["model.size=3B"]).train
    sweep = load_sweep(REPO / "sweeps/fig3b-token-scan.yaml")
    assert sweep.set["train.max_steps"] == preset.max_steps == 90_000 and preset.max_tokens is None
    for r in expand(sweep).runs:
        t = r.config.train
        assert (t.max_steps, t.max_tokens, t.batch_tokens) == (preset.max_steps, None, preset.batch_tokens)
        assert t.eval_every == t.checkpoint_every == 10_000 and t.max_steps // t.eval_every == 9
        assert r.tokens == 90_000 * 4_194_304  # 377.5B: the paper's "360B" counts 4M as 4e6


def test_fig3b_in_the_wsd_reading_branches_the_papers_runs_every_10k_steps():
    """fig3b-token-wsd.yaml: the paper's two 3B runs with a WSD schedule (nothing else changed), each
    the parent of eight branches of 10K-80K steps, each decaying over its last 20% from a step of the
    parent's stable phase (which ends at step 72,000)."""
    linear = {r.name: r for r in expand(load_sweep(REPO / "sweeps/fig3b-token-scan.yaml")).runs}
    runs = expand(load_sweep(REPO / "sweeps/fig3b-token-wsd.yaml")).runs
    parents = [r for r in runs if r.branch is None]
    assert sorted(r.name for r in parents) == sorted(linear)
    for parent in parents:
        twin = linear[parent.name].config.train
        assert dataclasses.replace(parent.config.train, schedule=twin.schedule, checkpoint_at=()) == twin
        assert parent.config.train.decay_start == 72_000
        family = [r for r in runs if r.branch is not None and r.branch.parent_key == parent.key]
        assert [r.config.train.max_steps for r in family] == list(range(10_000, 90_000, 10_000))
        assert [r.branch.step for r in family] == list(range(8_000, 72_000, 8_000))
        assert parent.config.train.checkpoint_at == tuple(range(8_000, 72_000, 8_000))
        assert sum(r.flops for r in family) == pytest.approx(0.8 * parent.flops)  # 1.8x the parent in all


def test_diff_versions_are_parameter_matched():
    runs = expand(load_sweep(REPO / "sweeps/diff-versions.yaml")).runs
    for size in ("830M", "1.4B", "2.8B"):
        counts = {r.kind: r.num_params for r in runs if r.size == size}
        assert abs(counts["diff_v2"] / counts["transformer"] - 1) < 1e-3
        assert abs(counts["diff_v1"] / counts["transformer"] - 1) < 1e-4


def test_diff_versions_is_labelled_as_the_v1_recipe():
    """diff-versions runs V2 at the V1 paper's Table 9 recipe; its file must say so and point to the
    blog-regime sweep, so nobody reads it as a test of the V2 blog's claims."""
    text = (REPO / "sweeps/diff-versions.yaml").read_text()
    assert "Table 9 recipe (lr 1.5e-4" in text and "diff-v2-blog.yaml" in text
    assert {r.config.train.lr for r in expand(load_sweep(REPO / "sweeps/diff-versions.yaml")).runs} == {1.5e-4}


def test_v2_blog_sweep_is_in_the_blog_regime():
    """V2 blog (seeds/002): lr 6e-4 and 1e-3 and a tuned grid around them (3e-4 to 2e-3), GQA (V2 doubles query heads, not K/V heads), V2 vs the
    Transformer at parameter parity, more than one seed, and the spike and outlier metrics on."""
    spec = load_sweep(REPO / "sweeps/diff-v2-blog.yaml")
    runs = expand(spec).runs
    assert {r.config.train.lr for r in runs} == {3e-4, 6e-4, 1e-3, 2e-3}
    assert spec.tune == {"train.lr": [3e-4, 6e-4, 1e-3, 2e-3]}  # each arm compared at its own best lr
    assert {r.kind for r in runs} == {"transformer", "diff_v2"}
    cells: dict[tuple, dict[str, list]] = {}
    for r in runs:
        a = r.config.model.attention
        assert a.num_kv_heads < a.num_heads  # GQA
        cells.setdefault((r.config.train.lr, r.config.train.seed), {})[r.kind] = [r.num_params, a]
        assert 0 < r.config.train.spike_threshold and r.config.train.eval_every < r.config.train.max_steps
    assert len({seed for _, seed in cells}) >= 2
    for kinds in cells.values():
        (n_t, a_t), (n_v2, a_v2) = kinds["transformer"], kinds["diff_v2"]
        assert abs(n_v2 / n_t - 1) < 1e-3  # parameter parity
        assert a_v2.num_kv_heads == a_t.num_kv_heads and a_v2.num_heads == a_t.num_heads  # 2h query heads on the same K/V


def test_demo_ladder_evaluates_often_enough_for_trajectories():
    """The UI's validation, λ and outlier charts have one point per evaluation: at least 10 per
    demo run (600 steps, every 50), not the 2 of every 300. Evaluation cadence is not part of a
    run's identity, so the golden keys (above) do not move."""
    for r in expand(load_sweep(REPO / "sweeps/demo-ladder.yaml")).runs:
        t = r.config.train
        assert t.max_steps // t.eval_every >= 10 and t.max_steps % t.eval_every == 0
        assert t.checkpoint_every % t.eval_every == 0  # every checkpoint step has a validation loss
