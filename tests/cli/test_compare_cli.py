"""``diffsweep compare`` as a user runs it: a tiny sweep of 2 rows x 2 seeds launched with the local
executor into a real SQLite MLflow store (``seeds_sweep``, tests/conftest.py), then compared; the
numbers are checked against the runs' logged metrics read directly with MlflowClient. Variants of
the store (runs marked failed) give one-seed rows, missing rows and a sweep with no finished run."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
from scipy import stats

from tests.conftest import SEEDS_SWEEP
from tests.helpers.cli import run as cli

# one tiny launch (4 runs, shared with a test of tests/scaling/test_fit_cli.py), the CLI in this
# process; one xdist group, so that one worker launches it
pytestmark = [pytest.mark.slow, SEEDS_SWEEP]


@pytest.fixture
def launched(seeds_sweep):
    """The project folder, its sweep file and its store, after ``launch --wait`` (read only)."""
    return seeds_sweep


def _names(sweep: Path) -> dict[str, str]:
    """The sweep's run names (as ``plan`` prints them) by run key."""
    from diffsweep.sweep import expand, load_sweep

    return {run.key: run.name for run in expand(load_sweep(sweep, ())).runs}


def _final(uri: str, sweep: Path, metric: str = "val/loss") -> dict[str, float]:
    """Each finished run's last logged value of ``metric``, by its name in the sweep, read directly."""
    from mlflow.tracking import MlflowClient

    client, names = MlflowClient(uri), _names(sweep)
    exp = client.get_experiment_by_name("cmp")
    out = {}
    for run in client.search_runs([exp.experiment_id]):
        if run.info.status == "FINISHED":
            history = sorted(client.get_metric_history(run.info.run_id, metric), key=lambda m: (m.step, m.timestamp))
            out[names[run.data.tags["diffsweep.run_key"]]] = history[-1].value
    return out


def _copy(launched, tmp_path, fail: tuple[str, ...] = (), shift: dict[str, float] | None = None) -> dict:
    """A copy of the store with the runs whose names end in ``fail`` marked FAILED, and ``shift``
    added to the final val/loss of the runs whose names end in its keys (logged at a later step)."""
    from mlflow.tracking import MlflowClient

    _, sweep, env = launched
    names = _names(sweep)
    db = tmp_path / "mlflow.db"
    shutil.copy(env["MLFLOW_TRACKING_URI"].removeprefix("sqlite:///"), db)
    uri = f"sqlite:///{db}"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("cmp")
    for run in client.search_runs([exp.experiment_id]):
        if names[run.data.tags["diffsweep.run_key"]].endswith(fail):
            client.set_terminated(run.info.run_id, "FAILED")
        for suffix, by in (shift or {}).items():
            if names[run.data.tags["diffsweep.run_key"]].endswith(suffix):
                client.log_metric(run.info.run_id, "val/loss", run.data.metrics["val/loss"] + by, step=10_000)
    return {"MLFLOW_TRACKING_URI": uri}


def test_table_and_json_equal_a_direct_computation_from_the_logged_metrics(launched):
    root, sweep, env = launched
    final = _final(env["MLFLOW_TRACKING_URI"], sweep)
    assert sorted(final) == ["diff_v1-tiny-xs-s0", "diff_v1-tiny-xs-s1", "transformer-tiny-xs-s0",
                             "transformer-tiny-xs-s1"]
    r = cli("compare", str(sweep), "--json", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    # the default baseline is the sweep's first row (grid order: transformer, then diff_v1)
    assert data["baseline"] == "transformer-tiny-xs" and data["metric"] == "val/loss" and data["missing"] == []
    base = [final["transformer-tiny-xs-s0"], final["transformer-tiny-xs-s1"]]
    cand = [final["diff_v1-tiny-xs-s0"], final["diff_v1-tiny-xs-s1"]]
    pooled = math.sqrt((statistics.variance(base) + statistics.variance(cand)) / 2)  # 1 + 1 df
    delta = statistics.mean(cand) - statistics.mean(base)
    half = stats.t.ppf(0.975, 2) * pooled * math.sqrt(1 / 2 + 1 / 2)
    rows = {row["row"]: row for row in data["rows"]}
    assert list(rows) == ["transformer-tiny-xs", "diff_v1-tiny-xs"]
    assert rows["transformer-tiny-xs"]["values"] == base and rows["diff_v1-tiny-xs"]["seeds"] == [0, 1]
    assert rows["diff_v1-tiny-xs"]["mean"] == pytest.approx(statistics.mean(cand), rel=1e-12)
    assert rows["diff_v1-tiny-xs"]["sd"] == pytest.approx(statistics.stdev(cand), rel=1e-12)
    assert data["pooled_sd"] == pytest.approx(pooled, rel=1e-12) and data["df"] == 2
    assert rows["diff_v1-tiny-xs"]["delta"] == pytest.approx(delta, rel=1e-12)
    assert rows["diff_v1-tiny-xs"]["lo"] == pytest.approx(delta - half, rel=1e-9)
    assert rows["diff_v1-tiny-xs"]["hi"] == pytest.approx(delta + half, rel=1e-9)
    verdict = "within seed noise" if delta - half <= 0 <= delta + half else "beyond seed noise"
    assert rows["diff_v1-tiny-xs"]["verdict"] == verdict

    # the table shows the same numbers, the verdict, one sentence per row and the noise line
    r = cli("compare", str(sweep), "--level", "0.9", cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    half90 = stats.t.ppf(0.95, 2) * pooled
    lines = r.stdout.splitlines()
    row = next(line for line in lines if line.startswith("diff_v1-tiny-xs "))
    verdict90 = "within seed noise" if delta - half90 <= 0 <= delta + half90 else "beyond seed noise"
    assert f"{statistics.mean(cand):.4f}" in row and f"{delta:+.4f}" in row and row.endswith(verdict90)
    assert f"{delta - half90:+.4f} to {delta + half90:+.4f}" in row
    assert next(line for line in lines if line.startswith("transformer-tiny-xs (baseline)"))
    assert any(line.startswith("diff_v1-tiny-xs - transformer-tiny-xs: ") and verdict90 in line for line in lines)
    assert f"pooled seed sd {pooled:.4g} on 2 df" in r.stdout

    # --baseline takes a row as printed; --metric any metric the runs logged
    r = cli("compare", str(sweep), "--json", "--baseline", "diff_v1-tiny-xs", "--metric", "train/loss", cwd=root,
            env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    train = _final(env["MLFLOW_TRACKING_URI"], sweep, "train/loss")
    assert data["baseline"] == "diff_v1-tiny-xs"
    assert {row["row"]: row["values"] for row in data["rows"]}["transformer-tiny-xs"] == [
        train["transformer-tiny-xs-s0"], train["transformer-tiny-xs-s1"]]


def test_one_seed_per_row_says_seed_noise_unknown(launched, tmp_path):
    root, sweep, _ = launched
    env = _copy(launched, tmp_path, fail=("-s1",))
    r = cli("compare", str(sweep), "--json", cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["pooled_sd"] is None and data["df"] == 0 and data["noise"].startswith("seed noise unknown")
    diff = data["rows"][1]
    assert diff["verdict"] == "seed noise unknown" and diff["lo"] is None and diff["n"] == 1 and diff["planned"] == 2
    r = cli("compare", str(sweep), cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "seed noise unknown: one seed per row" in r.stdout
    assert next(line for line in r.stdout.splitlines() if line.startswith("diff_v1-tiny-xs ")).split()[1] == "1/2"


def test_a_difference_far_beyond_the_seed_spread_is_beyond_seed_noise(launched, tmp_path):
    root, sweep, _ = launched
    env = _copy(launched, tmp_path, shift={"diff_v1-tiny-xs-s0": -1.0, "diff_v1-tiny-xs-s1": -1.0})
    r = cli("compare", str(sweep), cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("diff_v1-tiny-xs "))
    assert row.endswith("beyond seed noise")
    assert "the CI excludes 0: diff_v1-tiny-xs is lower" in r.stdout


def test_a_run_whose_final_metric_is_not_finite_is_left_out_with_a_warning(launched, tmp_path):
    root, sweep, _ = launched
    env = _copy(launched, tmp_path, shift={"diff_v1-tiny-xs-s1": math.nan})
    r = cli("compare", str(sweep), "--json", cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "warning: diff_v1-tiny-xs-s1: left out, its final val/loss is nan" in r.stderr
    diff = json.loads(r.stdout)["rows"][1]
    assert diff["runs"] == ["diff_v1-tiny-xs-s0"] and diff["n"] == 1 and diff["planned"] == 2
    assert len(diff["run_ids"]) == 1 and diff["verdict"] != "seed noise unknown"  # the baseline's 2 seeds: 1 df


def test_a_row_without_finished_runs_is_listed_as_missing(launched, tmp_path):
    root, sweep, _ = launched
    env = _copy(launched, tmp_path, fail=("transformer-tiny-xs-s0", "transformer-tiny-xs-s1"))
    r = cli("compare", str(sweep), "--json", cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["missing"] == ["transformer-tiny-xs"] and data["baseline"] == "diff_v1-tiny-xs"
    r = cli("compare", str(sweep), "--baseline", "transformer-tiny-xs", cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 2 and "row transformer-tiny-xs has no finished run" in r.stderr


def test_only_compares_the_rows_it_matches(launched):
    root, sweep, env = launched
    r = cli("compare", str(sweep), "--only", "diff_v1", "--json", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [row["row"] for row in data["rows"]] == ["diff_v1-tiny-xs"] and data["baseline"] == "diff_v1-tiny-xs"
    assert data["rows"][0]["runs"] == ["diff_v1-tiny-xs-s0", "diff_v1-tiny-xs-s1"]


def _bad(args: list[str], root: Path, env: dict, *expected: str) -> None:
    before = sorted(p.name for p in root.iterdir())
    r = cli("compare", *args, cwd=root, env={**env, "COLUMNS": "200"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for text in expected:
        assert text in r.stderr, r.stderr
    assert sorted(p.name for p in root.iterdir()) == before  # nothing created


def test_bad_inputs_are_one_line_exit_2_and_create_nothing(launched, tmp_path):
    root, sweep, env = launched
    _bad([str(sweep), "--baseline", "diff_v1"], root, env, "--baseline", "transformer-tiny-xs, diff_v1-tiny-xs")
    _bad([str(sweep), "--metric", "val/acc"], root, env, "--metric", "'val/acc'", "val/loss", "train/loss")
    for level in ("0.4", "1", "95"):  # the one range of every confidence level diffsweep takes
        _bad([str(sweep), "--level", level], root, env, "--level", "[0.5, 1)")
    _bad([str(root / "nope.yaml")], root, env, "nope.yaml")
    _bad([str(sweep), "--only", "diff_v9"], root, env, "--only: 'diff_v9' matches no run of")
    _bad([str(sweep), "--only", "diff_v1["], root, env, "--only: not a valid regular expression")
    (tmp_path / "bad.yaml").write_text("name: cmp\ngrid: {model.attention.kind: [transformer, nope]}\n")
    _bad([str(tmp_path / "bad.yaml")], root, env, "model.attention.kind", "nope")
    # launched with other --set overrides: other run keys, so no finished run of the sweep as given
    _bad([str(sweep), "--set", "train.lr=1e-3"], root, env, "no finished run of sweep 'cmp'")
    _bad([str(sweep)], root, _copy(launched, tmp_path, fail=("-s0", "-s1")), "no finished run of sweep 'cmp'")
    _bad([str(sweep)], tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else root,
         {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'empty' / 'mlflow.db'}"}, "no MLflow store")
