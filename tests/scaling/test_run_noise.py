"""The run is the unit of noise: a token scan's evaluations share their run's offset (issue #16, item 1)."""

from __future__ import annotations

import numpy as np
import pytest

from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.fitting.bootstrap import Group, estimate_noise
from diffsweep.scaling.report import sentence
from tests.scaling.synthetic import SCAN_TOKENS, TRUE_TOKEN_RATIO, token_scan

AT = (251e9,)


def _covers(row: dict, truth: float) -> bool:
    hi = np.inf if row["hi"] is None else row["hi"]
    return row["lo"] is not None and row["lo"] <= truth <= hi


def test_token_scan_ci_covers_the_truth_with_run_offsets():
    """30 seeded Fig. 3b-like scans (2 runs per architecture, run offset sd 0.005, 9 evaluations
    each): the 95% CI at 251B covers ρ_D = 0.637 in ≥ 85% of them. Treating every evaluation as an
    independent replicate covered ~60% (analysis/benchmarks/RESULTS.md)."""
    rng = np.random.default_rng(16)
    hits = [_covers(analyse(token_scan(runs=2, rng=rng), FitRequest(n_boot=150, at=AT, seed=k)).ratios[2],
                    TRUE_TOKEN_RATIO) for k in range(30)]
    assert np.mean(hits) >= 0.85, np.mean(hits)


def test_a_scan_of_cooldown_branches_shares_each_parents_offset_and_covers_the_truth():
    """The same scans read from cooldown branches (#34): every D a final evaluation, the branches of
    a run naming it as ``parent``. A family is one run of the noise model (hierarchical draws), the
    report says the D points are annealed branches, and the CI at 251B covers ρ_D in ≥ 85% of 30
    scans; read as independent runs (no ``parent``), the same points cover it far less often."""
    rng = np.random.default_rng(34)
    hits, naive = [], []
    for k in range(30):
        points = token_scan(runs=2, rng=rng, eval_sd=0.002, branches=True)
        r = analyse(points, FitRequest(n_boot=150, at=AT, seed=k))
        assert r.token_points == "branches" and r.resampling["unit"] == "run", r.resampling
        hits.append(_covers(r.ratios[2], TRUE_TOKEN_RATIO))
        if k < 10:
            alone = analyse(points.assign(parent=""), FitRequest(n_boot=150, at=AT, seed=k))
            naive.append(_covers(alone.ratios[2], TRUE_TOKEN_RATIO))
    assert np.mean(hits) >= 0.85, np.mean(hits)
    assert np.mean(naive) < np.mean(hits), (np.mean(naive), np.mean(hits))


def test_run_level_sd_is_separated_from_evaluation_noise():
    """Two-way (evaluation × run) decomposition on 3 architectures x 8 runs: the run offset sd and
    the per-evaluation sd are both recovered."""
    rng = np.random.default_rng(4)
    groups = []
    for _ in range(3):
        run = np.repeat(np.arange(8), len(SCAN_TOKENS))
        cell = np.tile(np.arange(len(SCAN_TOKENS)), 8)
        y = np.sin(cell) + 0.01 * rng.standard_normal(8)[run] + 0.002 * rng.standard_normal(len(run))
        groups.append(Group(y, np.sin(cell), cell, num_params=3, run=run))
    noise = estimate_noise(groups)
    assert noise.run_sd == pytest.approx(0.01, rel=0.3) and noise.run_dof == 3 * 7
    assert noise.sd == pytest.approx(0.002, rel=0.15) and noise.ci_scope == "full"


def test_one_run_per_architecture_says_the_ci_is_curve_fit_only():
    r = analyse(token_scan(runs=1, rng=np.random.default_rng(1)), FitRequest(n_boot=100, at=AT))
    assert r.noise["ci_scope"] == "curve_fit_only"
    assert r.resampling == {"method": "parametric", "unit": "point", "why": r.resampling["why"]}
    assert "excludes run-to-run variance" in r.noise["description"]
    assert any("curve-fit only" in w for w in r.warnings)
    assert all("curve-fit only" in sentence(r.to_dict(), row) and "excludes run-to-run variance" in sentence(r.to_dict(), row)
               for row in r.ratios)


def test_a_given_run_sd_makes_the_ci_full_and_hierarchical():
    points = token_scan(runs=1, rng=np.random.default_rng(1))
    bare = analyse(points, FitRequest(n_boot=200, at=AT))
    given = analyse(points, FitRequest(n_boot=200, at=AT, run_sd=0.005))
    assert given.noise["ci_scope"] == "full" and given.noise["run_sd"] == 0.005
    assert given.resampling["method"] == "hierarchical" and given.resampling["unit"] == "run"
    assert "per-run offset" in given.noise["description"]
    width = [row["hi"] - row["lo"] for row in given.ratios]
    assert all(w > 3 * (row["hi"] - row["lo"]) for w, row in zip(width, bare.ratios))
    assert not any("curve-fit only" in sentence(given.to_dict(), row) for row in given.ratios)


def test_runs_without_ids_are_one_run_per_arch_and_seed():
    """A CSV of checkpoints without run_id/run_key: the rows of one (arch, num_params, seed) are one run."""
    with_ids = analyse(token_scan(runs=2, rng=np.random.default_rng(2)), FitRequest(n_boot=100, at=AT))
    without = analyse(token_scan(runs=2, rng=np.random.default_rng(2), run_ids=False), FitRequest(n_boot=100, at=AT))
    assert without.noise == with_ids.noise and without.resampling["method"] == "hierarchical"
    assert without.ratios == with_ids.ratios


def test_size_ladder_stays_parametric_per_point():
    from tests.scaling.synthetic import ladder

    r = analyse(ladder(noise_sd=0.004, seeds=2, rng=np.random.default_rng(5)), FitRequest(n_boot=100))
    assert r.resampling["method"] == "parametric" and r.resampling["unit"] == "point"
    assert r.noise["ci_scope"] == "full" and "seed replicates" in r.noise["description"]


def test_fit_csv_of_a_token_scan_with_a_given_run_sd(tmp_path):
    """Through the CLI as a user runs it: a one-run-per-architecture scan is curve-fit only until
    --run-sd gives the run-level sd; then the draws are hierarchical and the sentence drops the note."""
    import json

    from tests.helpers.cli import run

    token_scan(runs=1, rng=np.random.default_rng(1)).drop(columns=["run_id"]).to_csv(tmp_path / "scan.csv", index=False)
    bare = run("fit", "--csv", "scan.csv", "--at", "251B", "--boot", "100", "--no-log", "--json", "--out", "a",
               cwd=tmp_path)
    given = run("fit", "--csv", "scan.csv", "--at", "251B", "--boot", "100", "--no-log", "--json", "--out", "b",
                "--run-sd", "0.005", cwd=tmp_path)
    assert bare.returncode == 0 and given.returncode == 0, bare.stderr + given.stderr
    bare, given = json.loads(bare.stdout), json.loads(given.stdout)
    assert bare["noise"]["ci_scope"] == "curve_fit_only" and given["noise"]["ci_scope"] == "full"
    assert given["resampling"]["method"] == "hierarchical" and given["noise"]["run_sd"] == 0.005
    assert "curve-fit only" in (tmp_path / "a" / "report.md").read_text()


@pytest.mark.parametrize(("value", "expected"), [("0", "positive sd of log loss"), ("nan", "expected a finite number")])
def test_a_bad_run_sd_is_one_line_exit_2(tmp_path, value, expected):
    from tests.helpers.badinput import refused
    from tests.helpers.cli import run

    token_scan(runs=1).to_csv(tmp_path / "scan.csv", index=False)
    r = run("fit", "--csv", "scan.csv", "--no-log", "--run-sd", value, "--out", "out", cwd=tmp_path)
    refused(r, "--run-sd", expected)
    assert not (tmp_path / "out").exists()


def test_a_csv_of_branches_keeps_families_whose_keys_read_as_numbers(tmp_path):
    """A run key of digits (or digits and one e) reads as a number: the parent column must still
    match its parent's run_key when points.csv is read back (it is read as text)."""
    from diffsweep.scaling.points import run_index
    from diffsweep.scaling.table import from_csv

    points = token_scan(runs=1, rng=np.random.default_rng(2), branches=True).head(3)
    points = points.assign(run_key=["123456789012", "223456789012", "323456789012"],
                           parent=["323456789012", "323456789012", ""])
    points.to_csv(tmp_path / "points.csv", index=False)
    table = from_csv(tmp_path / "points.csv")
    assert list(run_index(table)) == [0, 0, 0]
