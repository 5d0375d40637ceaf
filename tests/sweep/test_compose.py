"""Composing sweeps: ``extends``, ``--set`` overrides, per-point rules (Table 6 at any size), paths
relative to the sweep file, and the run-count bound checked before anything is expanded."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from diffsweep.config import ConfigError
from diffsweep.launch.planning import output_dir
from diffsweep.sweep import expand, load_sweep

REPO = Path(__file__).resolve().parents[2]
TABLE6 = REPO / "sweeps" / "table6-ablation.yaml"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


# -- extends ------------------------------------------------------------------------------------


def test_a_child_reuses_table6_rows_with_its_own_set(tmp_path):
    child = write(tmp_path / "table6-tiny.yaml", f"""
        extends: {os.path.relpath(TABLE6, tmp_path)}
        set: {{model.size: tiny-m, data.path: demo, data.tokenizer: bpe}}
        launch: {{profile: local}}
    """)
    spec = load_sweep(child)
    assert (spec.name, spec.experiment) == ("table6-tiny", "table6-tiny")  # never inherited
    assert spec.launch.profile == "local" and spec.launch.output is None  # the parent's output is its own
    assert output_dir(spec, None) == tmp_path.resolve() / "runs" / "table6-tiny"
    assert spec.set == {"data.path": str(tmp_path.resolve() / "demo"), "model.size": "tiny-m", "data.tokenizer": "bpe"}
    runs = {r.name: r for r in expand(spec).runs}
    rows = ["transformer-tiny-m-hd_16", "transformer-tiny-m-hd_32", "transformer-tiny-m-hd_32-gn_on",
            "diff_v1-tiny-m-hd_16", "diff_v1-tiny-m-hd_16-gn_off", "diff_v1-tiny-m-hd_16-lam_0.8",
            "diff_v1-tiny-m-hd_16-lam_0.5"]
    assert list(runs) == [f"{row}-s{seed}" for row in rows for seed in (0, 1, 2)]  # 3 seeds per row
    heads = {n: r.config.model.attention.num_heads for n, r in runs.items()}
    assert heads["transformer-tiny-m-hd_16-s0"] == 8 and heads["transformer-tiny-m-hd_32-s0"] == 4  # 8x16, 4x32
    assert heads["diff_v1-tiny-m-hd_16-s0"] == 4  # DIFF: d_model / 2d, half the baseline's heads
    assert {r.config.data.path for r in runs.values()} == {str(tmp_path.resolve() / "demo")}


def test_merge_rules(tmp_path):
    write(tmp_path / "p" / "parent.yaml", """
        name: parent
        experiment: parent-exp
        set: {model.size: tiny-xs, train.lr: 0.001}
        grid: {model.attention.kind: [transformer, diff_v1], train.warmup_steps: [1, 2]}
        runs: [{model.attention.kind: diff_v2}]
        seeds: [0, 1]
        exclude: [{model.attention.kind: diff_v1, train.warmup_steps: 2}]
        launch: {max_parallel: 3, output: out}
    """)
    child = write(tmp_path / "c" / "child.yaml", """
        extends: ../p/parent.yaml
        set: {train.lr: 0.002}
        grid: {model.attention.kind: [diff_v1], train.weight_decay: [0.1]}
        seeds: 1
    """)
    spec = load_sweep(child)
    assert spec.set == {"model.size": "tiny-xs", "train.lr": 0.002}  # merged, the child wins
    assert spec.grid == {"model.attention.kind": ["diff_v1"], "train.warmup_steps": [1, 2],
                         "train.weight_decay": [0.1]}  # an axis keeps its place; new axes come after
    assert spec.runs == [{"model.attention.kind": "diff_v2"}] and spec.seeds == [0]  # lists: the child's or the parent's
    assert spec.exclude == [{"model.attention.kind": ["diff_v1"], "train.warmup_steps": [2]}]
    assert (spec.name, spec.experiment, spec.launch.max_parallel, spec.launch.output) == ("child", "child", 3, None)
    assert [r.name for r in expand(spec).runs] == ["diff_v1-tiny-xs-warmup_steps_1-weight_decay_0.1-s0",
                                                   "diff_v2-tiny-xs-s0"]


def test_a_chain_and_paths_relative_to_each_file(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "base.yaml").write_text("model: {size: tiny-xs}\ndata: {path: corpus}\n")
    write(tmp_path / "a" / "grand.yaml", """
        base: ../configs/base.yaml
        grid: {data.path: [../data1, /abs/data2]}
    """)
    write(tmp_path / "b" / "mid.yaml", "extends: ../a/grand.yaml\nset: {train.lr: 0.002}\n")
    top = write(tmp_path / "top.yaml", "extends: b/mid.yaml\nlaunch: {output: out, profile: profiles/p.yaml}\n")
    spec = load_sweep(top)
    root = tmp_path.resolve()
    assert spec.base == root / "configs" / "base.yaml" and spec.data_root == root / "a"
    assert spec.grid["data.path"] == [str(root / "data1"), "/abs/data2"]
    assert spec.launch.output == str(root / "out") and spec.launch.profile == str(root / "profiles" / "p.yaml")
    # the base's relative data.path is relative to the sweep that names the base
    write(tmp_path / "a" / "grand.yaml", "base: ../configs/base.yaml\ngrid: {train.seed: [1]}\n")
    (r,) = expand(load_sweep(top)).runs
    assert r.config.data.path == str(root / "a" / "corpus") and r.config.train.lr == 0.002


@pytest.mark.parametrize("files, match", [
    ({"a.yaml": "extends: a.yaml\ngrid: {train.seed: [1]}\n"}, r"cycle \(.*a.yaml -> .*a.yaml\)"),
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "extends: ./a.yaml\ngrid: {train.seed: [1]}\n"},
     r"cycle \(.*a.yaml -> .*b.yaml -> .*a.yaml\)"),
    ({"a.yaml": "extends: nowhere.yaml\n"}, "a.yaml: extends: sweep .*nowhere.yaml not found"),
    ({"a.yaml": "extends: [b.yaml]\n"}, "extends: expected a path to a sweep YAML"),
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "grid: {model.sise: [tiny-xs]}\n"},
     r"b.yaml: grid.model.sise: unknown config key"),  # an error in the parent names the parent
    ({"a.yaml": "extends: b.yaml\n", "b.yaml": "set: {train.lr: 0.1}\n"}, "a.yaml: grid: empty sweep"),
])
def test_bad_extends(tmp_path, files, match):
    for name, text in files.items():
        write(tmp_path / name, text)
    with pytest.raises(ConfigError, match=match):
        load_sweep(tmp_path / "a.yaml")


# -- --set --------------------------------------------------------------------------------------


def test_overrides_apply_to_every_run_and_change_the_keys(tmp_path, monkeypatch):
    sweep = write(tmp_path / "s.yaml", "set: {model.size: tiny-xs}\ngrid: {model.attention.kind: [transformer, diff_v1]}\n")
    plain = expand(load_sweep(sweep)).runs
    monkeypatch.chdir(tmp_path.parent)
    spec = load_sweep(sweep, ["model.size=tiny-s", "train.lr=0.004", "data.path=mydata"])
    assert spec.overrides == {"model.size": "tiny-s", "train.lr": 0.004, "data.path": str(tmp_path.parent / "mydata")}
    runs = expand(spec).runs
    assert [r.name for r in runs] == ["transformer-tiny-s-s0", "diff_v1-tiny-s-s0"]
    assert {r.config.train.lr for r in runs} == {0.004}  # over the size preset and the sweep's set
    assert {r.config.data.path for r in runs} == {str(tmp_path.parent / "mydata")}  # relative to the working dir
    assert not {r.key for r in runs} & {r.key for r in plain}


@pytest.mark.parametrize("text, override, match", [
    ("grid: {model.size: [tiny-xs, tiny-s]}\n", "model.size=tiny-m", r"model.size is set by the grid of"),
    ("zip: [{train.lr: [0.1], train.warmup_steps: [1]}]\n", "train.lr=0.2", r"train.lr is set by zip\[0\]"),
    ("runs: [{train.lr: 0.1}, {model.size: tiny-s, train.lr: 0.2}]\n", "model.size=tiny-m", r"set by runs\[1\]"),
    ("grid: {model.size: [tiny-xs]}\nseeds: 2\n", "train.seed=3", "train.seed is set by seeds"),
    ("grid: {model.size: [tiny-xs]}\nderive: {train.lr: {rule: lookup, by: model.size, table: {tiny-xs: 0.1}}}\n",
     "train.lr=0.2", "train.lr is set by derive"),
    ("grid: {model.size: [tiny-xs]}\n", "model.sise=tiny-m", r"set: model.sise: unknown config key \(did you mean"),
    ("grid: {model.size: [tiny-xs]}\n", "nonsense", "expected KEY=VALUE"),
    ("grid: {model.size: [tiny-xs]}\n", "data.path=$(reboot)", r"contains '\$'"),
])
def test_bad_overrides(tmp_path, text, override, match):
    sweep = write(tmp_path / "s.yaml", text)
    with pytest.raises(ConfigError, match=match) as info:
        load_sweep(sweep, [override])
    assert info.value.key.startswith("set")  # the field; the CLI shows --set


def test_an_invalid_override_value_names_the_key_and_the_run(tmp_path):
    sweep = write(tmp_path / "s.yaml", "grid: {model.size: [tiny-xs]}\n")
    with pytest.raises(ConfigError, match=r"expected an integer in \[0, 2\*\*63 - 1\], got -1 \(in grid") as info:
        expand(load_sweep(sweep, ["train.seed=-1"]))
    assert info.value.key == "train.seed"


# -- rules as point values ----------------------------------------------------------------------


def test_scale_rule_in_a_grid(tmp_path):
    sweep = write(tmp_path / "s.yaml", """
        grid:
          model.size: [tiny-xs, tiny-l]
          model.attention.head_dim: [{rule: scale, factor: 1}, {rule: scale, factor: 2}]
          train.warmup_steps: [{rule: scale, factor: 0.5}]
    """)
    runs = expand(load_sweep(sweep)).runs
    assert [r.name for r in runs] == ["transformer-tiny-xs-hd_16-warmup_steps_15-s0",
                                      "transformer-tiny-xs-hd_32-warmup_steps_15-s0",
                                      "transformer-tiny-l-hd_32-warmup_steps_15-s0",
                                      "transformer-tiny-l-hd_64-warmup_steps_15-s0"]


@pytest.mark.parametrize("value, match", [
    ("{rule: scale, factor: 0.3}", r"0.3 x model.attention.head_dim = 0.3 x 16 = 4.8 is not a whole number"),
    ("{rule: scale}", "rule scale needs factor"),
    ("{rule: scale, factor: 2, by: x}", "unknown argument for rule scale"),
    ("{factor: 2}", r"expected \{rule: <one of"),
])
def test_bad_point_rules(tmp_path, value, match):
    sweep = write(tmp_path / "s.yaml", f"set: {{model.size: tiny-xs}}\nruns: [{{model.attention.head_dim: {value}}}]\n")
    with pytest.raises(ConfigError, match=match):
        expand(load_sweep(sweep))


# -- the run-count bound ------------------------------------------------------------------------


@pytest.mark.parametrize("text, key, total", [
    ("grid: {model.size: [tiny-xs]}\nseeds: 1000000000\n", "seeds", "1,000,000,000"),
    ("grid: {train.lr: [1, 2]}\nseeds: 60000\n", "seeds", "120,000"),
    ("grid: {" + ", ".join(f"train.{k}: [{', '.join(map(str, range(1, 11)))}]" for k in (
        "seed", "eval_every", "log_every", "checkpoint_every", "keep_checkpoints", "warmup_steps", "max_steps",
        "micro_batch_size", "eval_tokens", "batch_tokens", "seq_len", "lr")) + "}\n", "grid.train.seed", "1,000,000,000,000"),
    ("runs: [" + ", ".join(["{train.lr: 0.1}"] * 2000) + "]\nseeds: 100\n", "runs", "200,000"),
])
def test_too_many_runs_are_refused_before_expanding(tmp_path, text, key, total):
    sweep = write(tmp_path / "s.yaml", text)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=f"expands to {total} runs .* more than launch.max_runs = 100,000") as info:
        load_sweep(sweep)
    assert time.perf_counter() - start < 20.0  # a guard against expanding first (~0.5 s; 3 s at load 12)
    assert info.value.key == f"{sweep}: {key}"


def test_max_runs_raises_and_lowers_the_bound(tmp_path):
    sweep = write(tmp_path / "s.yaml", "grid: {train.lr: [0.1, 0.2]}\nseeds: 3\nlaunch: {max_runs: 5}\n")
    with pytest.raises(ConfigError, match="expands to 6 runs"):
        load_sweep(sweep)
    sweep.write_text("grid: {train.lr: [0.1, 0.2]}\nseeds: 60000\nlaunch: {max_runs: 120000}\n")
    assert len(load_sweep(sweep).seeds) == 60000
    sweep.write_text("grid: {train.lr: [0.1]}\nlaunch: {max_runs: 0}\n")
    with pytest.raises(ConfigError, match=r"launch.max_runs: expected an integer >= 1"):
        load_sweep(sweep)
