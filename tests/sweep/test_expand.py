"""Sweep files and their pure expansion: axes, filters, per-kind collapse, derived values, keys, names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from diffsweep.config import ConfigError, load_config
from diffsweep.config.identity import run_key
from diffsweep.model import counting
from diffsweep.sweep import expand, load_sweep


def sweep(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def runs_of(tmp_path: Path, text: str):
    return expand(load_sweep(sweep(tmp_path, text))).runs


def test_grid_is_cartesian_and_ordered_as_written(tmp_path):
    runs = runs_of(tmp_path, """
        grid:
          model.size: [tiny-xs, tiny-s]
          model.attention.kind: [transformer, diff_v1, diff_v2]
        seeds: [0, 1]
    """)
    assert len(runs) == 12
    assert [r.name for r in runs[:4]] == ["transformer-tiny-xs-s0", "transformer-tiny-xs-s1",
                                          "diff_v1-tiny-xs-s0", "diff_v1-tiny-xs-s1"]
    assert len({r.key for r in runs}) == 12
    # the key is the run's config identity, the same one `diffsweep train` computes
    r = runs[2]
    cfg = load_config(None, ["model.size=tiny-xs", "model.attention.kind=diff_v1", "train.seed=0",
                             f"data.path={tmp_path / 'data/demo'}"])
    assert r.key == run_key(cfg)


def test_expansion_is_deterministic(tmp_path):
    text = """
        grid: {model.size: [tiny-xs, tiny-s], train.lr: [1.0e-3, 3.0e-3]}
        zip: [{train.batch_tokens: [2048, 4096], train.warmup_steps: [10, 20]}]
        seeds: 2
    """
    a = [(r.key, r.name) for r in runs_of(tmp_path, text)]
    b = [(r.key, r.name) for r in runs_of(tmp_path, text)]
    assert a == b and len(a) == 16


def test_zip_pairs_values(tmp_path):
    runs = runs_of(tmp_path, """
        set: {model.size: tiny-xs}
        zip:
          - {train.lr: [1.0e-3, 2.0e-3, 3.0e-3], train.warmup_steps: [10, 20, 30]}
    """)
    assert [(r.config.train.lr, r.config.train.warmup_steps) for r in runs] == [(1e-3, 10), (2e-3, 20), (3e-3, 30)]
    assert [r.name for r in runs] == ["transformer-tiny-xs-lr_0.001-warmup_steps_10-s0",
                                      "transformer-tiny-xs-lr_0.002-warmup_steps_20-s0",
                                      "transformer-tiny-xs-lr_0.003-warmup_steps_30-s0"]


def test_switch_axes_do_not_multiply_kinds_that_ignore_them(tmp_path):
    runs = runs_of(tmp_path, """
        set: {model.size: tiny-xs}
        grid:
          model.attention.kind: [transformer, diff_v1, diff_v2]
          model.attention.lambda_init: [exp_decay, "constant:0.8", "constant:0.5"]
          model.attention.head_norm: [rmsnorm, none]
    """)
    kinds = [r.kind for r in runs]
    assert kinds.count("transformer") == 1
    assert kinds.count("diff_v2") == 1
    assert kinds.count("diff_v1") == 6
    names = {r.name for r in runs}
    assert "diff_v1-tiny-xs-lam_exp-gn_on-s0" in names and "diff_v1-tiny-xs-lam_0.5-gn_off-s0" in names
    assert "transformer-tiny-xs-s0" in names and "diff_v2-tiny-xs-s0" in names
    t = next(r for r in runs if r.kind == "transformer")
    assert t.config.model.attention.head_norm.value == "none"  # the base value, not an axis value


def test_explicit_runs_are_not_collapsed(tmp_path):
    runs = runs_of(tmp_path, """
        set: {model.size: tiny-xs}
        runs:
          - {model.attention.kind: transformer}
          - {model.attention.kind: transformer, model.attention.head_norm: rmsnorm}
    """)
    assert [r.name for r in runs] == ["transformer-tiny-xs-s0", "transformer-tiny-xs-gn_on-s0"]
    assert runs[1].config.model.attention.head_norm.value == "rmsnorm"


def test_include_and_exclude_filters(tmp_path):
    runs = runs_of(tmp_path, """
        grid:
          model.size: [tiny-xs, tiny-s, tiny-m]
          model.attention.kind: [transformer, diff_v1]
        include: [{model.size: [tiny-xs, tiny-m]}]
        exclude: [{model.size: tiny-m, model.attention.kind: diff_v1}]
    """)
    assert [r.name for r in runs] == ["transformer-tiny-xs-s0", "diff_v1-tiny-xs-s0", "transformer-tiny-m-s0"]


def test_filters_see_values_from_set(tmp_path):
    with pytest.raises(ConfigError, match="leave no runs"):
        runs_of(tmp_path, """
            set: {model.size: tiny-xs}
            grid: {model.attention.kind: [transformer]}
            exclude: [{model.size: tiny-xs}]
        """)


def test_duplicates_name_both_origins(tmp_path):
    with pytest.raises(ConfigError) as exc:
        runs_of(tmp_path, """
            set: {model.size: tiny-xs}
            grid: {model.attention.kind: [transformer, diff_v1]}
            runs: [{model.attention.kind: diff_v1}]
        """)
    message = str(exc.value)
    assert "grid (model.attention.kind=diff_v1)" in message and "runs[0]" in message
    # two spellings of one value are the same run
    with pytest.raises(ConfigError, match="duplicate run"):
        runs_of(tmp_path, """
            set: {model.size: tiny-xs}
            grid: {train.lr: [0.001, 1e-3]}
        """)


def test_derived_values(tmp_path):
    runs = runs_of(tmp_path, """
        grid:
          model.size: [tiny-xs, tiny-s]
          model.attention.kind: [transformer, diff_v2]
        derive:
          model.ffn_hidden: {rule: param_parity}
          train.max_tokens: {rule: tokens_per_param, ratio: 20}
          train.eval_every: {rule: steps_for_tokens, tokens: 40960}
          train.lr: {rule: lookup, by: model.size, table: {tiny-xs: 0.004, tiny-s: 0.002}}
    """)
    by = {r.name: r for r in runs}
    for size in ("tiny-xs", "tiny-s"):
        t, v2 = by[f"transformer-{size}-s0"], by[f"diff_v2-{size}-s0"]
        per_unit = 3 * t.config.model.d_model * t.config.model.n_layers
        assert abs(v2.num_params - t.num_params) <= per_unit / 2  # FFN shrunk to parity
        assert v2.config.model.ffn_hidden < t.config.model.ffn_hidden
        for r in (t, v2):
            batch = r.config.train.batch_tokens
            assert r.config.train.max_steps is None  # a derived token budget replaces the step budget
            assert abs(r.config.train.max_tokens - 20 * r.num_params) <= batch / 2
            assert r.config.train.eval_every == 10  # 40960 tokens / 4096 per step
    assert by["transformer-tiny-xs-s0"].config.train.lr == 0.004
    assert by["diff_v2-tiny-s-s0"].config.train.lr == 0.002


def test_lookup_without_an_entry_names_the_value(tmp_path):
    with pytest.raises(ConfigError, match="no entry for model.size = tiny-s"):
        runs_of(tmp_path, """
            grid: {model.size: [tiny-xs, tiny-s]}
            derive: {train.lr: {rule: lookup, by: model.size, table: {tiny-xs: 0.004}}}
        """)


def test_counts_match_the_config(tmp_path):
    (r,) = runs_of(tmp_path, "grid: {model.size: [1.4B]}\nset: {model.attention.kind: diff_v1}\n")
    assert r.num_params == counting.num_params(r.config.model)
    assert r.tokens == 40_000 * 262_144
    assert r.flops == counting.train_flops_per_token(r.config.model, 2048) * r.tokens


def test_relative_data_path_becomes_absolute(tmp_path):
    (r,) = runs_of(tmp_path, "grid: {data.path: [some/data]}\n")
    assert r.config.data.path == str(tmp_path / "some/data")


def test_validation_errors_name_the_point(tmp_path):
    with pytest.raises(ConfigError) as exc:
        runs_of(tmp_path, """
            grid:
              model.size: [tiny-xs]
              model.attention.head_dim: [16, 24]
              model.attention.kind: [diff_v1]
        """)
    assert "model.attention.head_dim" in str(exc.value) and "model.attention.head_dim=24" in str(exc.value)


def test_unknown_size_label(tmp_path):
    with pytest.raises(ConfigError, match=r"model.size: expected one of \[830M"):
        runs_of(tmp_path, "grid: {model.size: [1.5B]}\n")


@pytest.mark.parametrize("text, match", [
    ("grid: {model.size: [tiny-xs]\n", r"not valid YAML \(line 2"),
    ("grid: {model.atention.kind: [diff_v1]}\n", (r"grid.model.atention.kind: unknown config key \(did you mean "
                                                 r"'model.attention.kind'")),
    ("name: x\n", "empty sweep"),
    ("grid: {model.size: []}\n", "empty list of values"),
    ("grid: {model.size: tiny-xs}\n", "expected a list of values"),
    ("zip: [{train.lr: [0.1, 0.2], train.warmup_steps: [1]}]\n", (r"conflicting lengths \(train.lr has 2, "
                                                                 r"train.warmup_steps has 1\)")),
    ("grids: {model.size: [tiny-xs]}\n", r"unknown sweep key \(did you mean 'grid'"),
    ("grid: {data.path: ['x; rm -rf ~']}\n", r"contains ';'.*shell metacharacters"),
    ("grid: {data.path: [\"a'b\"]}\n", r"contains \"'\""),
    ("grid: {data.path: ['$(touch pwned)']}\n", r"contains '\$'"),
    ("name: 'bad name'\ngrid: {model.size: [tiny-xs]}\n", "name: expected letters"),
    ("grid: {train.seed: [1]}\nseeds: [0]\n", "set seeds in one place"),
    ("grid: {model.size: [tiny-xs]}\nseeds: [0, 0]\n", "repeats a seed"),
    ("grid: {model.size: [tiny-xs]}\nderive: {train.lr: {rule: magic}}\n", r"rule: expected one of \[tokens_per_param"),
    ("grid: {train.lr: [0.1]}\nderive: {train.lr: {rule: param_parity}}\n", "either given or derived"),
    ("grid: {model.size: [tiny-xs]}\nlaunch: {max_paralel: 2}\n", "unknown launch setting"),
    ("grid: {model.size: [tiny-xs]}\nbase: nowhere.yaml\n", "nowhere.yaml not found"),
    ("grid: {model.size: [tiny-xs], model.attention.kind: [transformer]}\nzip: [{model.size: [tiny-s]}]\n",
     "more than one axis"),
])
def test_bad_sweep_files(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        runs_of(tmp_path, text)


def test_base_config_is_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "base.yaml").write_text("model: {size: tiny-s}\ntrain: {lr: 0.002}\n")
    (tmp_path / "sweeps").mkdir()
    runs = runs_of(tmp_path, "base: ../configs/base.yaml\ngrid: {model.attention.kind: [transformer]}\n".replace(
        "../configs", str(tmp_path / "configs")))
    assert runs[0].config.model.size == "tiny-s" and runs[0].config.train.lr == 0.002
    path = sweep(tmp_path / "sweeps", "base: ../configs/base.yaml\ngrid: {train.seed: [3]}\n")
    (r,) = expand(load_sweep(path)).runs
    assert r.config.model.size == "tiny-s" and r.config.train.seed == 3


def test_warnings_are_collected_once_with_their_origin(tmp_path):
    e = expand(load_sweep(sweep(tmp_path, """
        set: {model.size: tiny-xs}
        runs: [{model.attention.kind: transformer, model.attention.lambda_init: "constant:0.5"}]
    """)))
    assert len(e.warnings) == 1 and "no effect" in e.warnings[0] and "runs[0]" in e.warnings[0]


def test_filters_compare_values_not_spellings(tmp_path):
    runs = runs_of(tmp_path, """
        set: {model.size: tiny-xs}
        grid: {train.lr: [1e-3, 2e-3], train.seed: [0, 1]}
        exclude: [{train.lr: 0.001, train.seed: 1}]
        include: [{train.weight_decay: 0.05}]
    """)  # 1e-3 is a string to YAML; weight_decay comes from the size preset
    assert [(r.config.train.lr, r.config.train.seed) for r in runs] == [(1e-3, 0), (2e-3, 0), (2e-3, 1)]


def test_exclude_can_remove_invalid_points_before_validation(tmp_path):
    runs = runs_of(tmp_path, """
        set: {model.size: tiny-xs}
        grid: {model.attention.kind: [transformer, diff_v1], model.attention.head_dim: [16, 64]}
        exclude: [{model.attention.kind: diff_v1, model.attention.head_dim: 64}]
    """)  # diff_v1 with head_dim 64 needs 2 x 64 channels per head: more than d_model = 64
    assert [r.name for r in runs] == ["transformer-tiny-xs-hd_16-s0", "transformer-tiny-xs-hd_64-s0",
                                      "diff_v1-tiny-xs-hd_16-s0"]


@pytest.mark.parametrize("text, match", [
    ("grid: {model.size: [tiny-xs]}\ngrid: {model.size: [tiny-s]}\n", "duplicate key 'grid'"),
    ("grid: {model.size: [tiny-xs]}\nderive: {train.max_tokens: {rule: tokens_per_param, ratio: .inf}}\n",
     "finite positive"),
    ("grid: {model.size: [tiny-xs]}\nderive: {train.lr: {rule: tokens_per_param, ratio: 20}}\n",
     r"derives \[train.max_tokens\], not train.lr"),
    ("grid: {model.size: [tiny-xs]}\nlaunch: {1: 2}\n", "unknown launch setting"),
])
def test_more_bad_sweep_files(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        runs_of(tmp_path, text)
