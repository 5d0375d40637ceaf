"""``diffsweep suggest``: the preposterior ranking of candidate runs, its budget choice, and the CLI."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from diffsweep.scaling import suggest as sg
from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.table import _complete
from tests.launch.conftest import cli
from tests.scaling.conftest import one_line_error
from tests.scaling.synthetic import TRUE_RATIO, baseline_loss, ladder

REF = 13.1e9
RATE = 989e12 * 0.40 * 3600  # FLOPs per GPU-hour, as the CLI's default


def _ladder(seed: int, noise_sd: float = 0.003, seeds: int = 2) -> pd.DataFrame:
    points = ladder(noise_sd=noise_sd, seeds=seeds, rng=np.random.default_rng(seed))
    points["tokens"] = 20.0 * points["num_params"]
    return points


@pytest.fixture(scope="module")
def design():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sg.design_from_points(_ladder(1), FitRequest(n_boot=400), ref=REF, num_draws=24)


def test_linearised_width_agrees_with_the_full_bootstrap(design):
    d, result = design
    row = next(r for r in result.ratios if r["at"] == REF)
    boot_width = row["hi"] - row["lo"]
    lin = sg.current_width(d)
    assert 0.7 < lin / boot_width < 1.4, (lin, boot_width)
    # nothing added: the simulated refits are the current fit
    assert sg.expected_ci_width(d, []) == pytest.approx(lin, rel=1e-6)


def test_another_run_narrows_the_expected_ci_and_candidates_are_ranked_per_gpu_hour(design):
    d, result = design
    pool = sg.extra_candidates(result.points, d, "num_params", RATE, sizes=[20e9])
    assert {c.origin for c in pool} == {"seed", "extra"} and len(pool) == 2 * (5 + 1)
    big = next(c for c in pool if c.arch == "diff_v1" and c.origin == "seed" and c.x == REF)
    assert big.gpu_hours == pytest.approx(6 * REF * 20 * REF / RATE)
    now, ranked = sg.rank(d, pool)
    assert now == pytest.approx(sg.current_width(d))
    after = next(s for s in ranked if s.candidate is big).width_after
    assert after < now
    per = [s.per_gpu_hour for s in ranked]
    assert per == sorted(per, reverse=True)


def test_budget_choice_is_greedy_and_within_budget(design):
    d, result = design
    pool = sg.extra_candidates(result.points, d, "num_params", RATE)
    choice = sg.choose_within(d, pool, budget=5000.0)
    assert choice.steps and choice.spent <= 5000.0
    widths = [choice.width_now] + [s.width_after for s in choice.steps]
    assert widths == sorted(widths, reverse=True)  # every pick narrowed it further
    assert choice.to_dict()["method"] == "greedy"


# -- following the suggestions against adding runs uniformly (a fast analysis/benchmarks/bench_suggest.py) --

ARCHS = {"transformer": 1.0, "diff_v1": TRUE_RATIO}
SIZES = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9


def _row(arch: str, n: float, rng: np.random.Generator, noise_sd: float) -> dict:
    return {"arch": arch, "num_params": n, "tokens": 20.0 * n, "loss": baseline_loss(n / ARCHS[arch])
            * np.exp(noise_sd * rng.standard_normal())}


def _width(rows: list[dict], seed: int) -> float:
    result = analyse(_complete(pd.DataFrame(rows)), FitRequest(n_boot=200, seed=seed, at=(REF,)))
    row = next(r for r in result.ratios if r["at"] == REF)
    return (row["hi"] if row["hi"] is not None else np.inf) - (row["lo"] or 0.0)


def _cost(n: float) -> float:
    return 6.0 * n * 20.0 * n / RATE


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason=(
    "not established: on 4 studies (seeds 500-503) suggest's picks narrowed the full-bootstrap CI less per GPU-h "
    "than uniform runs; the benchmark (analysis/benchmarks/bench_suggest.py, RESULTS.md) is inconclusive too"))
def test_following_suggest_narrows_the_ci_more_per_gpu_hour_than_uniform_runs():
    noise_sd, budget, reps = 0.005, 15000.0, 4
    order = [(a, n) for n in SIZES for a in ARCHS]
    gains = {"suggest": [], "uniform": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rep in range(reps):
            rng = np.random.default_rng(500 + rep)
            first = [_row(a, n, rng, noise_sd) for _ in range(2) for a in ARCHS for n in SIZES]
            w0 = _width(first, rep)
            d, result = sg.design_from_points(_complete(pd.DataFrame(first)), FitRequest(n_boot=200, seed=rep),
                                              ref=REF, num_draws=16)
            choice = sg.choose_within(d, sg.extra_candidates(result.points, d, "num_params", RATE), budget, seed=rep)
            picked = [(s.candidate.arch, s.candidate.num_params) for s in choice.steps]
            uniform, spent, i = [], 0.0, 0
            while spent + _cost(order[i % len(order)][1]) <= budget:
                uniform.append(order[i % len(order)])
                spent += _cost(order[i % len(order)][1])
                i += 1
            for name, runs in (("suggest", picked), ("uniform", uniform)):
                out = np.random.default_rng([rep, len(name)])
                width = _width(first + [_row(a, n, out, noise_sd) for a, n in runs], rep)
                gains[name].append((w0 - width) / sum(_cost(n) for _, n in runs))
    assert np.mean(gains["suggest"]) > np.mean(gains["uniform"]), gains


# -- the command line --

@pytest.fixture(scope="module")
def fit_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("suggest")
    _ladder(2).to_csv(root / "ladder.csv", index=False)
    r = cli("fit", "--csv", "ladder.csv", "--out", "fit", "--no-log", "--boot", "100", cwd=root)
    assert r.returncode == 0, r.stderr
    return root


def test_suggest_on_a_fit_folder_prints_a_ranked_table_and_json(fit_folder):
    r = cli("suggest", "fit", "--json", "--boot", "100", "--draws", "12", "--budget", "3000", "--sizes", "20B",
            cwd=fit_folder)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["baseline"] == "transformer" and out["candidate"] == "diff_v1" and out["reference"] == REF
    assert out["current"]["linearised_width"] > 0 and out["current"]["lo"] < out["current"]["ratio"]
    row = out["candidates"][0]
    assert set(row) >= {"candidate", "gpu_hours", "expected_width_after", "reduction_per_gpu_hour", "origin"}
    assert any(c["num_params"] == 20e9 for c in out["candidates"])
    assert out["budget"]["method"] == "greedy" and out["budget"]["spent_gpu_hours"] <= 3000
    text = cli("suggest", "fit", "--boot", "100", "--draws", "12", "--budget", "3000", "--top", "3", cwd=fit_folder)
    assert text.returncode == 0, text.stderr
    assert "reduction/GPU-h" in text.stdout and "greedy" in text.stdout and "more (--top" in text.stdout


@pytest.mark.parametrize(("args", "needle"), [
    (["nowhere"], "no such file"),
    (["."], "not a fit folder"),
    (["fit", "--budget", "-1"], "--budget"),
    (["fit", "--at", "eleven"], "--at"),
    (["fit", "--candidate", "diff_v9"], "--candidate"),
])
def test_bad_input_is_one_line_and_exit_2(fit_folder, args, needle):
    one_line_error(cli("suggest", *args, "--boot", "60", "--draws", "8", cwd=fit_folder), needle)


@pytest.mark.slow
def test_suggest_on_a_sweep_ranks_its_unfinished_runs_and_launches_the_chosen(mini_ladder, tmp_path):
    import shutil

    root = tmp_path / "copy"  # a copy: the launched runs must not change the session's ladder
    shutil.copytree(mini_ladder["dir"], root)
    sweep = root / "mini-ladder.yaml"
    sweep.write_text(sweep.read_text().replace("model.size: [", "model.size: [tiny-2xs, "))
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    args = ("suggest", str(sweep), "--json", "--boot", "100", "--draws", "8")
    r = cli(*args, cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    planned = [c for c in out["candidates"] if c["origin"] == "planned"]
    assert len(planned) == 2 and all("tiny-2xs" in c["name"] and c["gpu_hours"] > 0 for c in planned)
    r = cli(*args, "--no-seeds", "--budget", "1e9", "--launch", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    chosen = {c["name"] for c in out["budget"]["runs"]}
    assert set(out["launched"]) == chosen and chosen <= {c["name"] for c in planned}
    # On this tiny ladder the ratio's CI is open-ended, so no run is expected to narrow it and the
    # chosen set has been empty (measured): the submission itself is then not exercised here.
    if chosen:  # the launched runs finish (launching again is idempotent; --wait waits for them)
        only = "^(?:" + "|".join(re.escape(n) for n in chosen) + ")$"
        w = cli("launch", str(sweep), "--only", only, "--wait", cwd=root, env=env, timeout=600)
        assert w.returncode == 0, w.stdout + w.stderr
    one_line_error(cli("suggest", str(root / "fits"), "--launch", "--budget", "1", cwd=root, env=env), "--launch")
