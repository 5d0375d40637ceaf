"""One strict decoder: plain data (a YAML mapping) into a typed, frozen dataclass.

Run configs, a sweep's ``launch:`` section, cluster profiles and the sweep file's own keys are all
read with it, so they fail alike (HOUSE_RULES 1): every error is a ``ConfigError`` naming the
dotted key, the value and what is allowed::

    sweeps/t.yaml: launch.max_paralel: unknown launch setting (did you mean 'max_parallel'?); expected one of [...]

``decode`` recurses into nested dataclasses (sections) and decodes each field by its type hint; its
docstring lists the types it takes, the ``Annotated`` markers (``AtLeast``, ``Check``, ``Described``,
``INTERNAL``) and how error keys are written. See docs/training.md, 'Configs'.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, TypeVar

from diffsweep.config.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class AtLeast:
    """``Annotated[int, AtLeast(n)]``: an integer (not a bool, not a float) >= ``n``."""

    minimum: int


@dataclass(frozen=True)
class Check:
    """``Annotated[T, Check(fn)]``: ``fn(value, key)`` returns the decoded value (or raises a
    ``ConfigError`` on ``key``) instead of the decoding of ``T``."""

    fn: Callable[[Any, str], Any]


def format_tag(expected: str) -> Check:
    """``Annotated[str, format_tag(F)]``: a record's ``format`` field, which must be ``F`` (a file
    of another kind, or of a version this code does not read, is refused)."""
    def check(value: Any, key: str) -> str:
        if value != expected:
            raise ConfigError(key, f"expected {expected!r}, got {value!r}")
        return expected

    return Check(check)


@dataclass(frozen=True)
class Described:
    """``Annotated[T, Described("a mapping (name, mfu)")]``: a value of the wrong type at this key
    is reported as ``expected <what>, got <value>`` (elements and nested keys keep their own)."""

    what: str


class _Internal:
    """The marker of a field that is set by the code, never by a file (``INTERNAL``)."""

    def __repr__(self) -> str:
        return "INTERNAL"


INTERNAL = _Internal()


def decode(cls: type[T], raw: Any, path: str = "", *, source: str = "", noun: str = "key",
           expected: str | None = None) -> T:
    """Decode mapping ``raw`` into dataclass ``cls`` strictly.

    ``source`` and ``path`` locate ``raw`` for error messages (``sweeps/t.yaml`` and ``launch``
    give ``sweeps/t.yaml: launch.max_runs``); ``noun`` names its keys in the unknown-key error
    (``unknown launch setting``), ``expected`` what it must be if it is no mapping. Errors::

        model.attention.backend: expected one of [reference, sdpa, flash, triton], got 'cuda'
        sweeps/t.yaml: launch.max_paralel: unknown launch setting (did you mean 'max_parallel'?); expected one of [...]

    It recurses into nested dataclasses (sections) and decodes each field by its type hint:

    - a dataclass: a mapping of its fields; a missing field keeps its default (one without a
      default is required), an empty section
      (``model:`` with nothing under it) means all defaults, an unknown key is an error listing the
      fields (with a close match suggested);
    - an ``Enum``: one of its values; ``bool``; ``int`` (an integral float is accepted); ``float``
      (any numeric spelling, finite); ``str`` (a number is a fine string, ``path: 2024``);
    - ``X | None``; ``tuple[X, Y]`` (a list of exactly that many); ``tuple[X, ...]`` and ``list[X]``;
      ``dict[str, X]`` (its keys are kept as written: whoever owns the mapping checks them); ``Any``;
    - ``Annotated[T, marker]`` for what the type alone does not say: ``AtLeast(n)`` (a strict integer
      >= n), ``Check(fn)`` (``fn(value, key)`` decodes the value instead), ``Described(what)`` (the
      wording of a type error at this key), ``INTERNAL`` (a field no file sets).

    Error keys: ``source`` (a file name, or empty) and the dotted ``path`` inside it, joined as
    ``source: path`` (``p.yaml: gpu.mfu``), list elements as ``key[i]``.
    """
    key = f"{source}: {path}" if source and path else source or path
    prefix = (f"{source}: " if source else "") + (f"{path}." if path else "")
    return _section(cls, raw, key, prefix, noun, expected)


def decode_value(tp: Any, value: Any, key: str) -> Any:
    """Decode one value by its type hint ``tp`` (any type ``decode`` takes); ``key`` is the
    whole error key (``sweeps/t.yaml: grid``)."""
    return _value(tp, value, key, None)


def read_json_record(cls: type[T], path: Path, what: str) -> T:
    """The JSON file ``path`` decoded strictly as dataclass ``cls`` (a file diffsweep writes and
    reads back); unreadable or not JSON: a ``ConfigError`` naming the file and ``what`` it should be.
    A record's ``format`` field (``format_tag``) is checked first: a file of another version is
    reported as that, not as the fields it lacks or adds. A missing file raises
    ``FileNotFoundError`` (callers decide what none means)."""
    raw = _read_json(path, what)
    tag = _schema(typing.cast(type, cls)).hints.get("format")
    if isinstance(raw, dict) and tag is not None:
        if "format" not in raw:
            raise ConfigError(f"{path}: format", f"is required and missing (not a {what}?)")
        _value(tag, raw["format"], f"{path}: format", None)
    return decode(cls, raw, source=str(path), noun="field", expected=f"a {what} (a JSON object)")


def read_json_fields(cls: type[T], path: Path, what: str) -> T:
    """The fields of dataclass ``cls`` from the JSON object in ``path``, decoded strictly like
    ``read_json_record``; the file's other keys are left alone (what a reader needs of a larger
    document: whether a folder holds a fit's or a report's own files, before replacing them)."""
    raw = _read_json(path, what)
    if isinstance(raw, dict):
        names = {f.name for f in dataclasses.fields(typing.cast(Any, cls))}
        raw = {k: v for k, v in raw.items() if k in names}
    return decode(cls, raw, source=str(path), noun="field", expected=f"a {what} (a JSON object)")


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(str(path), f"not a readable {what} ({exc})") from None


def unknown_key(key: Any, allowed: Iterable[str], prefix: str = "", noun: str = "key") -> ConfigError:
    """The error for ``key``, which is none of ``allowed``: ``<prefix><key>: unknown <noun> (did
    you mean 'x'?); expected one of [a, b]``."""
    allowed = list(allowed)
    return ConfigError(f"{prefix}{key}", f"unknown {noun}{did_you_mean(str(key), allowed)}; "
                       f"expected one of [{', '.join(allowed)}]")


def did_you_mean(key: str, options: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the option closest to ``key``, or nothing if none is close."""
    close = difflib.get_close_matches(key, list(options), n=1)  # the best score wins: order does not matter
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- checks for ``Check(...)`` -------------------------------------------------------------------


def strict_string(value: Any, key: str) -> str:
    """A string as written (a number is refused, unlike a plain ``str`` field)."""
    if not isinstance(value, str):
        raise ConfigError(key, f"expected a string, got {value!r}")
    return value


def positive_number(value: Any, key: str) -> Any:
    """A number (an int or a float as written, not a bool, not a string) > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(key, f"expected a positive number, got {value!r}")
    return value


LEVEL_RANGE = (0.5, 1.0)  # a confidence level in [0.5, 1): what every interval diffsweep reports accepts


def confidence_level(value: Any, key: str = "level") -> float:
    """A confidence level in [0.5, 1) (a number, not a bool; NaN fails): ``fit``, ``suggest`` and
    ``compare`` (rows and probes) all take this one."""
    lo, hi = LEVEL_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value < hi:
        raise ConfigError(key, f"expected a confidence level in [{lo:g}, {hi:g}), got {value!r}")
    return float(value)


# -- the decoder ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Schema:
    hints: dict[str, Any]  # the fields a file may set, by name, with their type hints
    names: tuple[str, ...]  # the same, in declaration order (for "expected one of [...]")
    required: tuple[str, ...]  # those without a default


@functools.cache
def _schema(cls: type) -> _Schema:
    # get_type_hints re-evaluates string annotations on every call; a sweep decodes thousands.
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = [f for f in dataclasses.fields(cls) if INTERNAL not in _markers(hints[f.name])]
    required = tuple(f.name for f in fields
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return _Schema({f.name: hints[f.name] for f in fields}, tuple(f.name for f in fields), required)


def _markers(tp: Any) -> tuple[Any, ...]:
    return tp.__metadata__ if typing.get_origin(tp) is Annotated else ()


def _section(cls: type, data: Any, key: str, prefix: str, noun: str = "key", expected: str | None = None) -> Any:
    if data is None:  # an empty section (``model:`` with nothing under it) means the defaults
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(key, f"expected {expected or 'a mapping of ' + cls.__name__ + ' fields'}, got {data!r}")
    schema = _schema(cls)
    hints = schema.hints
    for name in data:
        if name not in hints:
            raise unknown_key(name, schema.names, prefix, noun)
    for name in schema.required:
        if name not in data:
            raise ConfigError(f"{prefix}{name}", "is required and missing")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        tp = hints[name]
        if type(value) is _FAST.get(tp):  # the common case: already the right type
            kwargs[name] = value
        else:
            kwargs[name] = _value(tp, value, f"{prefix}{name}", None)
    return cls(**kwargs)


# Field types whose values need no conversion when YAML already gave exactly that type (floats
# still go through the finiteness check, so they are not here).
_FAST: dict[Any, type] = {int: int, str: str, bool: bool, int | None: int, str | None: str}


def _cached_section(cls: type, data: Any, key: str, what: str | None) -> Any:
    # Frozen sections only, so equal data can share one decoded instance: a sweep decodes the same
    # model section for thousands of runs. Errors are not cached (they are raised every time).
    try:
        memo_key = (cls, key, what, repr(data))
    except Exception:  # noqa: BLE001 (an unrepresentable value is decoded, and reported, normally)
        return _section(cls, data, key, f"{key}.", expected=what)
    hit = _SECTIONS.get(memo_key)
    if hit is None:
        hit = _section(cls, data, key, f"{key}.", expected=what)
        if len(_SECTIONS) > 4096:
            _SECTIONS.clear()
        _SECTIONS[memo_key] = hit
    return hit


_SECTIONS: dict[tuple, Any] = {}


def _value(tp: Any, value: Any, key: str, what: str | None) -> Any:
    """Decode ``value`` as type ``tp`` at ``key``; ``what`` rewords a type error at this key."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        inner = typing.get_args(tp)[0]
        for marker in tp.__metadata__:
            if isinstance(marker, Check):
                return marker.fn(value, key)
            if isinstance(marker, AtLeast):
                if isinstance(value, bool) or not isinstance(value, int) or value < marker.minimum:
                    raise ConfigError(key, f"expected an integer >= {marker.minimum}, got {value!r}")
                return value
            if isinstance(marker, Described):
                what = marker.what
        return _value(inner, value, key, what)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, value, key, what)
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a section (a class, not an instance)
        if tp.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            return _cached_section(tp, value, key, what)
        # A record's mutable part (a ledger entry, an attempt): each read gets its own objects.
        return _section(tp, value, key, f"{key}.", expected=what)
    if isinstance(tp, type) and issubclass(tp, Enum):
        allowed = [m.value for m in tp]
        if isinstance(value, bool) and str(value).lower() in allowed:  # YAML's true/false, e.g. train.compile
            value = str(value).lower()
        if value not in allowed:
            raise ConfigError(key, f"expected {what or 'one of [' + ', '.join(allowed) + ']'}, got {value!r}")
        return tp(value)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_items(args[0], value, key, what))
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(key, f"expected {what or f'a list of {len(args)} numbers'}, got {value!r}")
        return tuple(_value(a, v, f"{key}[{i}]", None) for i, (a, v) in enumerate(zip(args, value)))
    if origin is list:
        return _items(typing.get_args(tp)[0], value, key, what)
    if origin is dict:
        if value is None:  # written with nothing under it: empty
            return {}
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected {what or 'a mapping'}, got {value!r}")
        item = typing.get_args(tp)[1]
        return {k: _value(item, v, f"{key}.{k}", None) for k, v in value.items()}
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected {what or 'true or false'}, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(key, f"expected {what or 'an integer'}, got {value!r}")
        return value
    if tp is float:
        # YAML 1.1 reads 1e-4 (no dot) as a string; accept any numeric spelling.
        if isinstance(value, bool):
            raise ConfigError(key, f"expected {what or 'a number'}, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected {what or 'a number'}, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(key, f"expected a finite number, got {value!r}")
        return number
    if tp is str:
        # YAML reads `path: 2024` as a number; a number is a fine string (a bool is likely a typo).
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(key, f"expected {what or 'a string'}, got {value!r}")
        return value
    raise TypeError(f"unsupported field type {tp!r} at {key}")  # internal: a schema bug


def _items(tp: Any, value: Any, key: str, what: str | None) -> list[Any]:
    if value is None:  # written with nothing under it: empty
        return []
    if not isinstance(value, list):
        raise ConfigError(key, f"expected {what or 'a list'}, got {value!r}")
    return [_value(tp, v, f"{key}[{i}]", None) for i, v in enumerate(value)]
