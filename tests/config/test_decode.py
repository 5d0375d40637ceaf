"""The one strict decoder (``diffsweep.config.decode``), on small dataclasses of its own: unknown
keys, types, enum values, nested paths, Optional, containers and the ``Annotated`` markers."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

import pytest

from diffsweep.config import ConfigError
from diffsweep.config.decode import (
    INTERNAL,
    AtLeast,
    Check,
    Described,
    decode,
    decode_value,
    did_you_mean,
    positive_number,
    strict_string,
    unknown_key,
)


class Color(StrEnum):
    RED = "red"
    GREEN = "green"


@dataclass(frozen=True, kw_only=True)
class Inner:
    color: Color = Color.RED
    size: int | None = None


def _even(value: Any, key: str) -> int:
    if not isinstance(value, int) or value % 2:
        raise ConfigError(key, f"expected an even integer, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str = "x"
    flag: bool = False
    rate: float = 0.5
    pair: tuple[float, float] = (1.0, 2.0)
    lines: tuple[str, ...] = ()
    tags: list[int] = field(default_factory=list)
    extra: dict[str, int] = field(default_factory=dict)
    inner: Inner = field(default_factory=Inner)
    described: Annotated[Inner, Described("a mapping (color, size)")] = field(default_factory=Inner)
    count: Annotated[int, AtLeast(1)] = 1
    limit: Annotated[int, AtLeast(0)] | None = None
    even: Annotated[int, Check(_even)] = 2
    label: Annotated[str, Check(strict_string)] | None = None
    hours: Annotated[float, Check(positive_number)] = 1.0
    anything: Any = None
    internal: Annotated[str, INTERNAL] = "set by the code"


def _error(raw: Any, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        decode(Outer, raw, **kwargs)
    return caught.value


def test_defaults_and_values():
    assert decode(Outer, {}) == Outer() == decode(Outer, None)  # an empty section means the defaults
    got = decode(Outer, {"name": 2024, "rate": "1e-4", "pair": [0.9, 0.98], "lines": ["a"], "tags": [1, 2.0],
                         "extra": {"a": 1}, "inner": {"color": "green", "size": 3}, "count": 5, "limit": None,
                         "even": 4, "label": "l", "hours": 3, "anything": [{"x": 1}]})
    assert got == Outer(name="2024", rate=1e-4, pair=(0.9, 0.98), lines=("a",), tags=[1, 2], extra={"a": 1},
                        inner=Inner(color=Color.GREEN, size=3), count=5, even=4, label="l", hours=3,
                        anything=[{"x": 1}])
    assert got.inner.color is Color.GREEN and type(got.tags[1]) is int


def test_unknown_key_names_the_key_suggests_and_lists_the_allowed_ones():
    e = _error({"inner": {"colour": "red"}})
    assert e.key == "inner.colour"
    assert e.message == "unknown key (did you mean 'color'?); expected one of [color, size]"
    assert _error({"zzz": 1}).message.startswith("unknown key; expected one of [name, flag, rate, pair,")


def test_internal_fields_are_not_keys_of_a_file():
    e = _error({"internal": "x"})
    assert e.key == "internal" and "internal" not in e.message.partition("expected one of")[2]


def test_unknown_keys_are_reported_before_values_and_a_non_string_key_is_unknown():
    assert _error({"flag": "maybe", "nmae": 1}).key == "nmae"
    assert _error({1: 2}).key == "1"


def test_the_noun_source_and_path_shape_the_message():
    e = _error({"cuont": 1}, path="launch", source="s.yaml", noun="launch setting")
    assert e.key == "s.yaml: launch.cuont" and e.message.startswith("unknown launch setting (did you mean 'count'?)")
    assert _error({"count": 0}, source="p.yaml").key == "p.yaml: count"
    assert _error({"inner": {"size": "x"}}, source="p.yaml").key == "p.yaml: inner.size"
    assert str(_error({"count": 0}, path="a.b")) == "a.b.count: expected an integer >= 1, got 0"


@pytest.mark.parametrize("raw, key, message", [
    ({"flag": "yes"}, "flag", "expected true or false, got 'yes'"),
    ({"rate": "fast"}, "rate", "expected a number, got 'fast'"),
    ({"rate": True}, "rate", "expected a number, got True"),
    ({"rate": float("inf")}, "rate", "expected a finite number, got inf"),
    ({"name": True}, "name", "expected a string, got True"),
    ({"pair": [1.0]}, "pair", "expected a list of 2 numbers, got [1.0]"),
    ({"pair": [1.0, "x"]}, "pair[1]", "expected a number, got 'x'"),
    ({"lines": "a"}, "lines", "expected a list, got 'a'"),
    ({"tags": [1, "two"]}, "tags[1]", "expected an integer, got 'two'"),
    ({"extra": [1]}, "extra", "expected a mapping, got [1]"),
    ({"extra": {"a": "b"}}, "extra.a", "expected an integer, got 'b'"),
    ({"inner": 3}, "inner", "expected a mapping of Inner fields, got 3"),
    ({"count": 0}, "count", "expected an integer >= 1, got 0"),
    ({"count": 2.0}, "count", "expected an integer >= 1, got 2.0"),  # strict: no floats, unlike a plain int
    ({"count": None}, "count", "expected an integer >= 1, got None"),
    ({"limit": -1}, "limit", "expected an integer >= 0, got -1"),
    ({"even": 3}, "even", "expected an even integer, got 3"),
    ({"label": 5}, "label", "expected a string, got 5"),
    ({"hours": 0}, "hours", "expected a positive number, got 0"),
    ({"hours": "1"}, "hours", "expected a positive number, got '1'"),
])
def test_wrong_types_name_the_key_and_what_was_expected(raw, key, message):
    e = _error(raw)
    assert (e.key, e.message) == (key, message)


def test_enum_values_list_the_allowed_ones():
    e = _error({"inner": {"color": "blue"}})
    assert str(e) == "inner.color: expected one of [red, green], got 'blue'"
    assert _error({"inner": {"color": ["red"]}}).key == "inner.color"  # unhashable: still a clean error


def test_optional_fields_take_null_and_otherwise_their_type():
    assert decode(Outer, {"inner": {"size": None}, "limit": None, "label": None}) == Outer()
    assert decode(Outer, {"inner": {"size": 4}}).inner.size == 4
    assert _error({"inner": {"size": "big"}}).message == "expected an integer, got 'big'"


def test_described_rewords_only_its_own_type_error():
    assert str(_error({"described": [1]})) == "described: expected a mapping (color, size), got [1]"
    assert _error({"described": {"color": "blue"}}).message == "expected one of [red, green], got 'blue'"


def test_containers_written_empty_are_empty_and_values_are_copies():
    assert decode(Outer, {"tags": None, "extra": None, "lines": None}) == Outer()
    tags = [1]
    assert decode(Outer, {"tags": tags}).tags is not tags


def test_decode_value_and_the_shared_helpers():
    assert decode_value(dict[str, Any], None, "s.yaml: set") == {}
    with pytest.raises(ConfigError, match=r"^s.yaml: zip: expected a list, got 3$"):
        decode_value(list[Any], 3, "s.yaml: zip")
    assert did_you_mean("gird", ["grid", "seeds"]) == " (did you mean 'grid'?)" and did_you_mean("q", ["grid"]) == ""
    e = unknown_key("grids", ("grid", "zip"), "s.yaml: ", "sweep key")
    assert str(e) == "s.yaml: grids: unknown sweep key (did you mean 'grid'?); expected one of [grid, zip]"


def test_a_non_mapping_at_the_top():
    e = _error([1], source="p.yaml")
    assert (e.key, e.message) == ("p.yaml", "expected a mapping of Outer fields, got [1]")
    assert _error(3, path="launch", expected="a mapping").message == "expected a mapping, got 3"


def test_equal_sections_are_decoded_once_and_errors_every_time():
    a, b = decode(Outer, {"inner": {"size": 1}}), decode(Outer, {"inner": {"size": 1}})
    assert a.inner is b.inner  # frozen sections are shared (a sweep decodes thousands of equal ones)
    for _ in range(2):
        assert _error({"inner": {"size": "x"}}).key == "inner.size"


@dataclass
class Attempt:  # a record's mutable part: a ledger entry's attempt, changed and written back
    state: str = "queued"


@dataclass
class Task:
    attempts: list[Attempt] = field(default_factory=list)


def test_mutable_sections_are_decoded_anew_each_time():
    # Two reads of one record in one process (a launch and the record callback it gives a
    # scheduler) are two records: a change to one must not show in, or be written twice through, the other.
    raw = {"attempts": [{"state": "queued"}]}
    a, b = decode(Task, raw), decode(Task, raw)
    assert a == b and a is not b and a.attempts[0] is not b.attempts[0]
    a.attempts.append(Attempt("submitted"))
    assert len(b.attempts) == 1


@dataclass(frozen=True, kw_only=True)
class WithRequired:
    path: str
    depth: int = 1


def test_a_field_without_a_default_is_required():
    assert decode(WithRequired, {"path": "p"}) == WithRequired(path="p")
    with pytest.raises(ConfigError) as caught:
        decode(WithRequired, {"depth": 2}, "section", source="f.yaml")
    assert str(caught.value) == "f.yaml: section.path: is required and missing"
