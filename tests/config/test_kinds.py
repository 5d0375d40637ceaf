"""The registry of attention kinds (pure Python): specs, the open ``AttentionKind``, entry points,
and the typed λ_init value."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from diffsweep.config import AttentionKind, ConfigError, LambdaInitStrategy, load_config
from diffsweep.config.builtin_kinds import DiffV1
from diffsweep.config.kinds import (
    ENTRY_POINT_GROUP,
    KindSpec,
    _register_entry_point,
    display_color,
    display_name,
    kind_spec,
    kind_specs,
    register_kind,
)
from diffsweep.config.lambda_init import LambdaInit


def test_the_paper_kinds_are_registered_in_order_with_their_definitions():
    assert [k.value for k in list(kind_specs())[:3]] == ["transformer", "diff_v1", "diff_v2"]
    for kind, spec in kind_specs().items():
        assert spec.name == kind.value and kind in AttentionKind
        assert kind_spec(kind.value) is spec  # by name or by member
        for formula in ("attention_params", "attention_flops", "saved_bytes"):
            assert getattr(type(spec), formula) is not getattr(KindSpec, formula), (kind, formula)
        assert ":" in spec.module and spec.display_name
        assert all(f"model.attention.{s}" in spec.sweep_axes for s in spec.switches)
    assert display_name("diff_v1") == "DIFF V1" and display_name("not-a-kind") == "not-a-kind"
    assert display_color("transformer") == "#1f77b4" and display_color("not-a-kind") is None


def test_unknown_kind_is_one_error_listing_the_registered_kinds():
    with pytest.raises(ConfigError, match=r"model\.attention\.kind: expected one of \[transformer, diff_v1, diff_v2"):
        load_config(None, ["model.attention.kind=diff_v9"])
    with pytest.raises(ConfigError, match=r"model\.attention\.kind: expected one of"):
        kind_spec("diff_v9")


def test_a_kind_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="registered twice"):
        register_kind(DiffV1)
    assert type(kind_spec(AttentionKind.DIFF_V1)) is DiffV1


class _FakeEntryPoint:
    def __init__(self, name, load):
        self.name, self.value, self._load = name, f"fake:{name}", load

    def load(self):
        return self._load()


def _boom():
    raise ImportError("No module named 'torch_extension_of_the_user'")


def test_a_broken_plugin_is_reported_and_left_out():
    before = list(AttentionKind)
    with pytest.warns(RuntimeWarning, match="'broken'.*not registered: No module named"):
        _register_entry_point(_FakeEntryPoint("broken", _boom))

    class Misnamed(KindSpec):
        name, display_name, module = "other", "Other", "x:y"

    with pytest.warns(RuntimeWarning, match="named 'misnamed' but its kind is named 'other'"):
        _register_entry_point(_FakeEntryPoint("misnamed", lambda: Misnamed))
    assert list(AttentionKind) == before


def test_kinds_come_from_the_entry_point_group():
    # diffsweep's own kinds are not entry points (they need no installed metadata); the group is
    # what a user's package declares (tests/plugins installs one for real).
    assert ENTRY_POINT_GROUP == "diffsweep.attention_kinds"
    assert all(e.name not in ("transformer", "diff_v1", "diff_v2")
               for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def test_listing_kinds_imports_no_torch():
    code = ("import sys; from diffsweep.config import AttentionKind, load_config; list(AttentionKind); "
            "load_config(None, ['model.attention.kind=diff_v2']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_lambda_init_is_a_typed_value_parsed_once():
    a = load_config(None, ["model.attention.kind=diff_v1", "model.attention.lambda_init=constant:0.50"]).model.attention
    assert a.lambda_init == "constant:0.5"  # the canonical spelling (what run keys hash)
    parsed = a.parsed_lambda_init
    assert parsed == LambdaInit(LambdaInitStrategy.CONSTANT, 0.5) and str(parsed) == "constant:0.5"
    assert parsed is LambdaInit.parse("constant:0.5")  # cached: parsed once per spelling
    assert parsed.schedule(3) == [0.5, 0.5, 0.5]
    decay = LambdaInit.parse("exp_decay")
    assert decay.value is None and decay.for_layer(1) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match=r"model\.attention\.lambda_init: constant value must be in \(0, 1\)"):
        LambdaInit.parse("constant:1.5")
