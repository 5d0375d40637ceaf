"""``diffsweep compare`` on a tuned sweep as a user runs it: each cell (kind x size) at its best
learning rate, read from a real SQLite MLflow store holding the sweep's finished runs (logged as
``diffsweep train`` logs them, with a known loss per learning rate and seed); the winners and the
difference are checked against the values read directly with MlflowClient."""

from __future__ import annotations

import json
import statistics

import pytest

from tests.helpers.cli import run as cli

SWEEP = """
name: tuned-cmp
set: {data.path: nodata, train.max_steps: 40, train.eval_every: 40}
grid:
  model.size: [tiny-3xs]
  model.attention.kind: [transformer, diff_v1]
tune:
  train.lr: [1.0e-3, 2.0e-3, 4.0e-3]
seeds: 2
"""
# true final loss per kind and lr: the Transformer best at 2e-3 (inside its grid), DIFF V1 at 4e-3
# (the grid's largest value: the optimum may lie beyond), 0.05 nats lower at its best
TRUTH = {("transformer", 1.0e-3): 3.10, ("transformer", 2.0e-3): 3.05, ("transformer", 4.0e-3): 3.20,
         ("diff_v1", 1.0e-3): 3.15, ("diff_v1", 2.0e-3): 3.06, ("diff_v1", 4.0e-3): 3.00}
SEED = {0: -0.004, 1: 0.004}  # each seed's luck: seed sd 0.0057


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from tests.scaling.synthetic import log_runs

    root = tmp_path_factory.mktemp("tuned-compare")
    (root / "tuned.yaml").write_text(SWEEP)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    log_runs(uri, root / "tuned.yaml", lambda arch, n, d: 0.0,
             lambda run: TRUTH[(run.kind, run.config.train.lr)] + SEED[run.config.train.seed])
    _stability(uri)
    return root, {"MLFLOW_TRACKING_URI": uri}


def _stability(uri: str) -> None:
    """What the trainer logs of stability, on the stored runs: every run's train/loss_spikes and
    train/grad_norm_spikes counts (2 and 4 in the Transformer's finished run at 4e-3, none
    elsewhere), and its other run there diverged (FAILED, its end reason as the trainer writes it:
    tests/train/test_trainer.py)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tuned-cmp")
    for run in client.search_runs([exp.experiment_id]):
        hot = run.data.tags["diffsweep.arch"] == "transformer" and float(run.data.params["train.lr"]) == 4.0e-3
        client.log_metric(run.info.run_id, "train/loss_spikes", 2.0 if hot and run.data.params["train.seed"] == "0"
                          else 1.0 if hot else 0.0, step=40)
        client.log_metric(run.info.run_id, "train/grad_norm_spikes", 4.0 if hot else 0.0, step=40)
    seed1 = next(r for r in client.search_runs([exp.experiment_id])
                 if r.info.run_name == "transformer-tiny-3xs-lr_0.004-s1")
    client.set_terminated(seed1.info.run_id, "FAILED")
    client.set_tag(seed1.info.run_id, "diffsweep.end_reason", "Diverged: non-finite loss at step 31 (loss nan, grad "
                   "norm inf)")


def _direct(uri: str) -> dict[tuple[str, float], list[float]]:
    """Each (kind, lr)'s final val/loss values, read with MlflowClient."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tuned-cmp")
    out: dict[tuple[str, float], list[float]] = {}
    for run in client.search_runs([exp.experiment_id]):
        key = (run.data.tags["diffsweep.arch"], float(run.data.params["train.lr"]))
        out.setdefault(key, []).append(run.data.metrics["val/loss"])
    return out


def test_each_cell_at_its_best_learning_rate_with_the_choice_in_the_interval(store):
    root, env = store
    r = cli("compare", "tuned.yaml", "--json", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    direct = _direct(env["MLFLOW_TRACKING_URI"])
    best = {kind: min((statistics.mean(v), lr) for (k, lr), v in direct.items() if k == kind)
            for kind in ("transformer", "diff_v1")}
    cells = {c["cell"]: c for c in data["cells"]}
    assert list(cells) == ["transformer-tiny-3xs", "diff_v1-tiny-3xs"] and data["baseline"] == "transformer-tiny-3xs"
    assert cells["transformer-tiny-3xs"]["winner"] == "lr=0.002" and cells["diff_v1-tiny-3xs"]["winner"] == "lr=0.004"
    diff = cells["diff_v1-tiny-3xs"]
    assert diff["mean"] == pytest.approx(best["diff_v1"][0])
    assert diff["delta"] == pytest.approx(best["diff_v1"][0] - best["transformer"][0])
    assert diff["lo"] < diff["delta"] < diff["hi"] < 0 and diff["verdict"] == "beyond seed noise"
    assert data["pooled_sd"] == pytest.approx(statistics.stdev([-0.004, 0.004]))  # 5 candidates of 2 seeds, 1 of 1
    assert diff["edge"] == ["lr=0.004 is the largest tried"] and cells["transformer-tiny-3xs"]["edge"] == []
    assert [k["n"] for k in diff["candidates"]] == [2, 2, 2]
    hot = cells["transformer-tiny-3xs"]["candidates"][2]
    assert (hot["candidate"], hot["n"], hot["planned"], hot["diverged"], hot["spikes"], hot["grad_spikes"]) == (
        "lr=0.004", 1, 2, 1, 2, 4)  # the finished run's counts (the diverged one's are not read)
    assert cells["transformer-tiny-3xs"]["sensitivity"] == (
        "transformer-tiny-3xs: from its best lr=0.002, at 2x (lr=0.004) +0.1460 nats; at 0.5x (lr=0.001) "
        f"+0.0500 nats; 1 run(s) diverged at lr=0.004, 2 loss spike(s) at lr=0.004, 4 gradient-norm spike(s) at "
        f"lr=0.004 (seed sd {data['pooled_sd']:.4f}).")
    assert diff["sensitivity"].endswith("; no loss spike or divergence (seed sd 0.0057).")
    assert ("diff_v1-tiny-3xs: the best candidate is at the edge of its grid (lr=0.004 is the largest tried): "
            "the optimum may lie outside the grid: extend it") in r.stderr

    r = cli("compare", "tuned.yaml", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "tuned-cmp: final val/loss of each cell at its best train.lr (experiment tuned-cmp)"
    row = next(line for line in lines if line.startswith("diff_v1-tiny-3xs "))
    assert row.split()[1:3] == ["lr=0.004", "2"] and "beyond seed noise" in row
    assert any(line.startswith("  transformer-tiny-3xs: lr=0.001 3.1000 (2), lr=0.002 3.0500 (2) * (")
               and line.endswith("lr=0.004 3.1960 (1/2) [1 diverged, 2 spikes, 4 grad-norm spikes]") for line in lines)
    assert "diff_v1-tiny-3xs - transformer-tiny-3xs, each at its best: -0.0500 nats" in r.stdout


def test_untuned_reads_every_candidate_as_a_row_and_bad_input_is_refused(store):
    root, env = store
    r = cli("compare", "tuned.yaml", "--untuned", "--json", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["rows"]) == 6
    r = cli("compare", "tuned.yaml", "--baseline", "transformer", cwd=root, env=env)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: --baseline: expected a cell of tuned-cmp: one of [transformer-tiny-3xs, diff_v1-tiny-3xs], "
        "got 'transformer'")
    r = cli("compare", "tuned.yaml", "--baseline", "diff_v1-tiny-3xs", "--json", cwd=root, env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["baseline"] == "diff_v1-tiny-3xs"
    (root / "plain.yaml").write_text(SWEEP.split("tune:")[0].replace("tuned-cmp", "plain"))
    r = cli("compare", "plain.yaml", "--untuned", cwd=root, env=env)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: --untuned: applies only to a tuned sweep; plain.yaml has no tune: (every run is a row)")
    r = cli("compare", "tuned.yaml", "--untuned", "--probes", cwd=root, env=env)
    assert r.returncode == 2 and "--untuned: does not apply with --probes" in r.stderr


def test_the_sensitivity_plot_is_a_new_file_and_an_existing_one_is_left_alone(store):
    root, env = store
    r = cli("compare", "tuned.yaml", "--plot", "plots/sensitivity.png", "--json", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    png = root / "plots" / "sensitivity.png"
    assert json.loads(r.stdout)["plot"] == "plots/sensitivity.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert sorted(p.name for p in png.parent.iterdir()) == ["sensitivity.png"]  # no temporary file left
    mine = root / "mine.png"
    mine.write_bytes(b"the user's picture")
    for args, message in (
            (["--plot", "mine.png"], ("error: --plot: mine.png exists; give a new file path (diffsweep does not "
                                     "replace a file)")),
            (["--plot", "out.pdf"], "error: --plot: expected a .png file path, got out.pdf"),
            (["--plot", "mine.png/x.png"], (f"error: --plot: {mine} is not a folder, so mine.png/x.png cannot be "
                                           "made in it")),
            (["--plot", "u.png", "--untuned"], ("error: --plot: draws a tuned sweep's cells against their tuning "
                                               "values: give a sweep with tune:, without --probes or --untuned"))):
        r = cli("compare", "tuned.yaml", *args, cwd=root, env=env)
        assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == message, r.stderr
    assert mine.read_bytes() == b"the user's picture" and not (root / "u.png").exists()
