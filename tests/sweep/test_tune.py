"""Tuned sweeps (``tune:``): the tuning grid is crossed with every point and makes the runs a grid
would (same keys and names); ``plan`` shows the cells and their candidates; the arm audit compares
each arm's tuning grid instead of splitting groups by it; bad tuning grids are refused by key."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from diffsweep.config import ConfigError
from diffsweep.sweep import expand, load_sweep
from diffsweep.sweep.audit import audit_runs
from diffsweep.sweep.tune import cells, describe
from tests.helpers.cli import run as cli

BASE = """
    set: {data.path: nodata, train.max_steps: 40}
    grid:
      model.size: [tiny-3xs, tiny-2xs]
      model.attention.kind: [transformer, diff_v2]
    derive:
      model.ffn_hidden: {rule: param_parity}
    seeds: 2
"""
TUNED = BASE + """
    tune:
      train.lr: [5.0e-4, 1.0e-3, 2.0e-3]
"""


def sweep(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_tuning_grid_makes_the_runs_of_the_same_grid_axis(tmp_path):
    tuned = expand(load_sweep(sweep(tmp_path, TUNED))).runs
    as_grid = BASE.replace("  model.attention.kind: [transformer, diff_v2]\n",
                           "  model.attention.kind: [transformer, diff_v2]\n      train.lr: [5.0e-4, 1.0e-3, 2.0e-3]\n")
    assert "train.lr" in as_grid
    grid = expand(load_sweep(sweep(tmp_path, as_grid, "g.yaml"))).runs
    assert len(tuned) == 2 * 2 * 3 * 2
    assert sorted((r.key, r.name) for r in tuned) == sorted((r.key, r.name) for r in grid)
    assert "diff_v2-tiny-2xs-lr_0.001-s1" in {r.name for r in tuned}


def test_cells_hold_the_candidates_of_each_kind_and_size(tmp_path):
    spec = load_sweep(sweep(tmp_path, TUNED))
    found = cells(expand(spec).runs, list(spec.tune))
    assert [c.label for c in found] == ["transformer tiny-3xs", "diff_v2 tiny-3xs", "transformer tiny-2xs",
                                        "diff_v2 tiny-2xs"]
    first = found[0]
    assert [c.label for c in first.candidates] == ["lr=0.0005", "lr=0.001", "lr=0.002"]
    assert all(len(c.runs) == 2 and {r.config.train.seed for r in c.runs} == {0, 1} for c in first.candidates)
    assert {r.config.train.lr for c in first.candidates for r in c.runs} == {5e-4, 1e-3, 2e-3}
    lines = describe(found, spec.tune)
    assert lines[0].startswith("tuned over train.lr [0.0005, 0.001, 0.002]: 4 cell(s)")
    assert lines[1] == "  transformer tiny-3xs: 3 candidates (2 run(s) each): lr=0.0005, lr=0.001, lr=0.002"


def test_a_cell_left_one_candidate_by_a_filter_is_untuned(tmp_path):
    spec = load_sweep(sweep(tmp_path, TUNED + """
    exclude: [{model.attention.kind: diff_v2, train.lr: [1.0e-3, 2.0e-3]}]
    """))
    lines = describe(cells(expand(spec).runs, list(spec.tune)), spec.tune)
    assert "  diff_v2 tiny-3xs: 1 candidates (2 run(s) each): lr=0.0005 (one candidate: untuned)" in lines


def test_the_audit_compares_tuning_grids_not_learning_rates(tmp_path):
    spec = load_sweep(sweep(tmp_path, TUNED))
    audit = audit_runs(expand(spec).runs, tuned=tuple(spec.tune))
    assert [p.group for p in audit.pairs] == ["tiny-3xs", "tiny-2xs"] and audit.flagged == []
    lr = next(d for d in audit.pairs[0].differences if d.field == "lr")
    assert lr.tuned and lr.label == "tuning grid of lr" and len(lr.baseline) == 3

    spec = load_sweep(sweep(tmp_path, TUNED + """
    exclude: [{model.attention.kind: diff_v2, train.lr: 2.0e-3}]
    """, "x.yaml"))
    audit = audit_runs(expand(spec).runs, tuned=tuple(spec.tune))
    (pair, diff), *_ = audit.flagged
    assert diff.describe() == "tuning grid of lr [0.0005, 0.001] vs [0.0005, 0.001, 0.002]"
    assert diff.suggestion.startswith("tune.train.lr: [0.0005, 0.001, 0.002] for every kind")


def test_a_tuned_setting_the_audit_does_not_know_is_compared_as_a_grid_not_a_group(tmp_path):
    spec = load_sweep(sweep(tmp_path, BASE + """
    tune:
      train.weight_decay: [0.0, 0.1]
    """))
    audit = audit_runs(expand(spec).runs, tuned=tuple(spec.tune))
    assert [p.group for p in audit.pairs] == ["tiny-3xs", "tiny-2xs"]  # not split by weight decay
    wd = next(d for d in audit.pairs[0].differences if d.field == "train.weight_decay")
    assert wd.tuned and not wd.flagged and wd.baseline == [0.0, 0.1]


def test_a_sweep_of_one_cell_can_be_tuned_alone(tmp_path):
    spec = load_sweep(sweep(tmp_path, """
    set: {data.path: nodata, train.max_steps: 40, model.size: tiny-3xs}
    tune: {train.lr: [1.0e-3, 2.0e-3]}
    """))
    runs = expand(spec).runs
    assert [r.name for r in runs] == ["transformer-tiny-3xs-lr_0.001-s0", "transformer-tiny-3xs-lr_0.002-s0"]
    assert [c.label for c in cells(runs, list(spec.tune))] == ["transformer tiny-3xs"]


@pytest.mark.parametrize(("extra", "key", "message"), [
    ("grid: {train.lr: [1.0e-3]}\ntune: {train.lr: [1.0e-3, 2.0e-3]}", "tune.train.lr",
     "is also swept by an axis (grid/zip)"),
    ("runs: [{train.lr: 1.0e-3}]\ntune: {train.lr: [1.0e-3, 2.0e-3]}", "tune.train.lr", "is also swept by a run"),
    ("tune: {model.attention.kind: [transformer, diff_v1]}", "tune.model.attention.kind",
     "the attention kind is what a study compares"),
    ("tune: {model.size: [tiny-3xs]}", "tune.model.size", "the size is an axis of the study"),
    ("tune: {train.seed: [0, 1]}", "tune.train.seed", "seeds are the noise"),
    ("tune: {train.lr: [1.0e-3, 1.0e-3]}", "tune.train.lr", "repeats a value"),
    ("tune: {train.lr: []}", "tune.train.lr", "empty list of values"),
    ("tune: {train.lr: 1.0e-3}", "tune.train.lr", "expected a list of values"),
    ("tune: {train.lrr: [1.0e-3]}", "tune.train.lrr", "unknown config key"),
    ("tune: {model.ffn_hidden: [{rule: param_parity}]}", "tune.model.ffn_hidden[0]", "expected a plain value"),
    ("tune: {train.lr: [1.0e-3, 2.0e-3]}\nderive: {train.lr: {rule: scale, factor: 2}}", "derive.train.lr",
     "is also set by set/grid/zip/runs/tune"),
])
def test_bad_tuning_grids_name_the_key(tmp_path, extra, key, message):
    path = sweep(tmp_path, "set: {data.path: nodata, model.size: tiny-3xs}\n" + extra)
    with pytest.raises(ConfigError) as caught:
        expand(load_sweep(path))
    assert caught.value.key == f"{path}: {key}", caught.value
    assert message in caught.value.message, caught.value.message


def test_set_cannot_replace_a_tuned_value_and_the_count_includes_the_tuning_grid(tmp_path):
    path = sweep(tmp_path, TUNED)
    with pytest.raises(ConfigError) as caught:
        load_sweep(path, ["train.lr=0.1"])
    assert caught.value.key == "set" and "set by the tuning grid (tune) of" in caught.value.message
    big = sweep(tmp_path, TUNED + "    launch: {max_runs: 20}\n", "big.yaml")
    with pytest.raises(ConfigError) as caught:
        load_sweep(big)
    assert "expands to 24 runs" in caught.value.message


def test_plan_shows_cells_and_candidates_in_text_and_json(tmp_path):
    path = sweep(tmp_path, TUNED)
    r = cli("plan", str(path), "--executor", "local", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "tuned over train.lr [0.0005, 0.001, 0.002]: 4 cell(s)" in r.stdout
    assert "  diff_v2 tiny-2xs: 3 candidates (2 run(s) each): lr=0.0005, lr=0.001, lr=0.002" in r.stdout
    r = cli("plan", str(path), "--executor", "local", "--json", cwd=tmp_path)
    tune = json.loads(r.stdout)["tune"]
    assert tune["grid"] == {"train.lr": [5e-4, 1e-3, 2e-3]} and len(tune["cells"]) == 4
    cell = tune["cells"][1]
    assert (cell["kind"], cell["size"]) == ("diff_v2", "tiny-3xs")
    assert cell["candidates"][0] == {"values": {"train.lr": 5e-4}, "runs": ["diff_v2-tiny-3xs-lr_0.0005-s0",
                                                                            "diff_v2-tiny-3xs-lr_0.0005-s1"]}
    untuned = json.loads(cli("plan", str(sweep(tmp_path, BASE, "u.yaml")), "--executor", "local", "--json",
                             cwd=tmp_path).stdout)
    assert "tune" not in untuned  # an untuned sweep's plan is as before


def test_plan_refuses_a_bad_tuning_grid_in_one_line(tmp_path):
    path = sweep(tmp_path, TUNED.replace("train.lr: [5.0e-4, 1.0e-3, 2.0e-3]", "train.seed: [0, 1]"))
    r = cli("plan", str(path), "--executor", "local", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [(f"error: {path}: tune.train.seed: seeds are the noise a tuning value's "
                                             "loss is averaged over (seeds:), not candidates; expected a setting to "
                                             "tune, such as train.lr or train.warmup_steps")]
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()
