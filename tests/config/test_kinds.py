"""The registry of attention kinds (pure Python): specs, kind names, entry points,
and the typed λ_init value."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from diffsweep.config import ConfigError, EnvironmentUnavailable, LambdaInitStrategy, load_config
from diffsweep.config.builtin_kinds import DiffV1
from diffsweep.config.enums import DIFF_V1
from diffsweep.config.kinds import (
    ENTRY_POINT_GROUP,
    KINDS,
    KindSpec,
    display_color,
    display_name,
    kind_names,
    kind_spec,
    kind_specs,
    register_kind,
)
from diffsweep.config.lambda_init import LambdaInit


def test_the_paper_kinds_are_registered_in_order_with_their_definitions():
    assert kind_names()[:3] == ["transformer", "diff_v1", "diff_v2"]
    for kind, spec in kind_specs().items():
        assert spec.name == kind and kind in kind_names() and kind_spec(kind) is spec
        for formula in ("attention_params", "attention_flops", "saved_bytes"):
            assert getattr(type(spec), formula) is not getattr(KindSpec, formula), (kind, formula)
        assert ":" in spec.module and spec.display_name
        assert all(f"model.attention.{s}" in spec.sweep_axes for s in spec.switches)
    assert display_name("diff_v1") == "DIFF V1" and display_name("not-a-kind") == "not-a-kind"
    assert display_color("transformer") == "#1f77b4" and display_color("not-a-kind") is None


def test_unknown_kind_is_one_error_listing_the_registered_kinds():
    with pytest.raises(ConfigError, match=r"model\.attention\.kind: unknown attention kind 'diff_v9' \(did you mean "
                       r"'diff_v2'\?\); expected one of \[transformer, diff_v1, diff_v2"):
        load_config(None, ["model.attention.kind=diff_v9"])
    with pytest.raises(ConfigError, match=r"model\.attention\.kind: unknown attention kind"):
        kind_spec("diff_v9")
    with pytest.raises(ConfigError, match=r"model\.attention\.kind: expected a string, got \['a'\]"):
        load_config(None, ["model.attention.kind=[a]"])


def test_a_kind_cannot_be_registered_twice_nor_under_a_bad_name():
    with pytest.raises(ValueError, match="'diff_v1' is already registered"):
        register_kind(DiffV1)
    assert type(kind_spec(DIFF_V1)) is DiffV1

    class Bad(KindSpec):
        name, display_name, module = "Diff-V9", "Bad", "x:y"

    with pytest.raises(ValueError, match="lower-case identifier, got 'Diff-V9'"):
        register_kind(Bad)


def test_a_broken_plugin_is_reported_and_left_out():
    """A kind whose module does not import (a user's broken package) or whose spec names another kind
    is left out of the listing with a warning; a config naming it is one error, not a traceback."""
    class Misnamed(KindSpec):
        name, display_name, module = "other", "Other", "x:y"

    KINDS.register("broken", "torch_extension_of_the_user.kinds:Broken")
    KINDS.register("misnamed", Misnamed)
    try:
        with pytest.warns(RuntimeWarning) as caught:
            specs = kind_specs()
        messages = " | ".join(str(w.message) for w in caught)
        assert "'broken'" in messages and "No module named 'torch_extension_of_the_user'" in messages
        assert "whose name is 'other'" in messages and messages.count("left out") == 2
        assert "broken" not in specs and "misnamed" not in specs and list(specs)[:3] == kind_names()[:3]
        with pytest.raises(EnvironmentUnavailable, match="attention kind 'broken'"):
            load_config(None, ["model.attention.kind=broken"])
        assert display_name("broken") == "broken"
    finally:
        KINDS.unregister("broken")
        KINDS.unregister("misnamed")


def test_kinds_come_from_the_entry_point_group():
    # diffsweep's own kinds are not entry points (they need no installed metadata); the group is
    # what a user's package declares (tests/plugins installs one for real).
    assert ENTRY_POINT_GROUP == "diffsweep.attention_kinds"
    assert all(e.name not in ("transformer", "diff_v1", "diff_v2")
               for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def test_listing_kinds_imports_no_torch():
    code = ("import sys; from diffsweep.config import load_config; from diffsweep.config.kinds import kind_specs; "
            "kind_specs(); "
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
