"""Bounds on input: YAML aliases (a "billion laughs" document, a recursive alias), absurd model and
token sizes, seeds outside what torch and numpy take. Each is refused at once, naming the key or
file, before anything is built or allocated."""

from __future__ import annotations

import time

import pytest

from diffsweep.config import ConfigError, load_config
from diffsweep.config.kinds import kind_names
from diffsweep.config.loading import MAX_ALIAS_NODES, read_yaml
from diffsweep.config.sizes import SIZES
from diffsweep.config.validate import MAX_PARAMS, estimated_params
from diffsweep.model import counting


def billion_laughs(levels: int = 9) -> str:
    """``a`` holds 9 values, ``b`` 9 aliases of ``a``, ...: 9^levels values once expanded."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        name, prev = chr(ord("a") + i), chr(ord("a") + i - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


def _refused(path, match: str) -> ConfigError:
    start = time.process_time()  # this process's CPU time: what the machine's load does not change
    with pytest.raises(ConfigError, match=match) as info:
        read_yaml(path)
    assert time.process_time() - start < 5.0  # refused while composing, before any value is built (minutes)
    return info.value


def test_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(billion_laughs())
    err = _refused(path, f"aliases expand to more than {MAX_ALIAS_NODES:,} values")
    assert err.key == str(path) and "line 5" in str(err)  # the first alias past the bound


def test_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("grid: &g\n  model.size: [tiny-xs, *g]\n")
    _refused(path, r"alias \*g is inside the node it names \(a recursive alias\)")
    path.write_text("a: &a [*a]\n")
    _refused(path, "recursive alias")


def test_small_aliases_and_merge_keys_still_work(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("shared: &s {lr: 0.001, warmup_steps: 10}\nrun: {<<: *s, lr: 0.002}\nother: *s\n")
    data = read_yaml(path)
    assert data["run"] == {"lr": 0.002, "warmup_steps": 10}  # a merged key may be overridden
    data["other"]["lr"] = 1.0  # an alias is a copy: changing it leaves the anchor alone
    assert data["shared"]["lr"] == 0.001
    path.write_text("a: 1\na: 2\n")
    _refused(path, "duplicate key 'a'")  # written twice by hand is still an error


def test_deep_nesting_is_one_error(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("a: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        read_yaml(path)


def test_the_size_estimate_matches_the_parameter_table():
    worst = 0.0
    for size in SIZES:
        for kind in kind_names():
            for extra in ([], ["model.attention.num_kv_heads=1"], ["model.tie_embeddings=false"]):
                model = load_config(None, [f"model.size={size}", f"model.attention.kind={kind}", *extra]).model
                exact = counting.num_params(model)
                worst = max(worst, abs(estimated_params(model) - exact) / exact)
    assert worst < 0.005


@pytest.mark.parametrize("override, key", [
    ("model.d_model=1099511627776", "model.d_model"),
    ("model.vocab_size=1099511627776", "model.vocab_size"),
    ("model.n_layers=1000000", "model.n_layers"),
    ("model.ffn_hidden=1000000000000", "model.ffn_hidden"),
    ("model.attention.head_dim=1048576", "model.attention.head_dim"),
    ("model.attention.num_heads=1000000", "model.attention.num_heads"),
])
def test_absurd_dimensions_are_refused_with_the_size(override, key):
    start = time.process_time()
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert time.process_time() - start < 5.0  # nothing allocated: a model that size would take minutes
    assert info.value.key == key and "is over the limit of" in str(info.value)
    assert "parameters" in str(info.value) and "of fp32 weights" in str(info.value)


def test_a_model_over_the_parameter_limit_is_refused():
    # every dimension within its own bound, the whole far over MAX_PARAMS (10T)
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.d_model=131072", "model.n_layers=4096"])
    assert info.value.key == "model" and f"over the limit of {MAX_PARAMS // 10**12}T parameters" in str(info.value)
    assert "about 844T parameters, 3.38P bytes of fp32 weights" in str(info.value)


def test_derived_head_counts_are_bounded_too():
    # head_dim 2 on a 262,144-wide model derives 131,072 heads, over the bound
    with pytest.raises(ConfigError) as info:
        load_config(None, ["model.d_model=262144", "model.n_layers=1", "model.attention.head_dim=2"])
    assert info.value.key == "model.attention.num_heads"


@pytest.mark.parametrize("override, key", [
    ("train.seed=-1", "train.seed"),
    ("train.seed=9223372036854775808", "train.seed"),
    ("train.seq_len=1099511627776", "train.seq_len"),
    ("train.batch_tokens=1099511627776", "train.batch_tokens"),
    ("train.max_tokens=100000000000000000000000", "train.max_tokens"),
])
def test_train_integers_out_of_range(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.key == key


def test_micro_batch_tokens_are_bounded():
    with pytest.raises(ConfigError, match="per micro-batch") as info:
        load_config(None, ["train.micro_batch_size=65536", "train.batch_tokens=134217728"])
    assert info.value.key == "train.micro_batch_size"


def test_largest_seed_is_accepted():
    assert load_config(None, ["train.seed=9223372036854775807"]).train.seed == 2**63 - 1

