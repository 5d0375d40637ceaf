"""The registry of attention kinds: one ``KindSpec`` per kind (pure Python, no torch).

A kind is one definition plus one registration: its spec (``builtin_kinds.py`` for diffsweep's own
kinds, or a user's package) and the ``nn.Module`` the spec names. Third-party kinds register
through an entry point in the group ``diffsweep.attention_kinds`` whose object is a ``KindSpec``
subclass (or instance) and whose name is the kind's config value::

    [project.entry-points."diffsweep.attention_kinds"]
    toy = "toy_kind.spec:ToyKind"

Registration happens once, on the first question about the set of kinds (``kind_spec``,
``kind_specs``, or listing/looking up ``AttentionKind``), and adds the kind to ``AttentionKind``.
A spec module must not import torch: it is loaded by ``diffsweep --help``.
"""

from __future__ import annotations

import importlib.metadata
import warnings

from diffsweep.config.enums import AttentionKind
from diffsweep.config.errors import ConfigError
from diffsweep.config.kind_spec import KindSpec, NameToken, ParamInfo

ENTRY_POINT_GROUP = "diffsweep.attention_kinds"
KIND_KEY = "model.attention.kind"

_SPECS: dict[AttentionKind, KindSpec] = {}
_state = {"loaded": False, "loading": False}

__all__ = ["ENTRY_POINT_GROUP", "KindSpec", "NameToken", "ParamInfo", "display_color", "display_name", "kind_spec",
           "kind_specs", "register_kind"]


def register_kind(spec: KindSpec | type[KindSpec]) -> AttentionKind:
    """Register ``spec`` (an instance, or a subclass instantiated here); returns its ``AttentionKind``.

    A second registration of the same name is refused, so a plug-in cannot silently replace a kind.
    """
    if isinstance(spec, type):
        spec = spec()
    if not isinstance(spec, KindSpec):
        raise TypeError(f"an attention kind must be a diffsweep.config.kinds.KindSpec, got {spec!r}")
    name = getattr(spec, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"attention kind name must be a lower-case identifier, got {name!r}")
    kind = AttentionKind._extend(name)
    if kind in _SPECS:
        raise ValueError(f"attention kind {name!r} is registered twice ({_SPECS[kind]!r} and {spec!r})")
    _SPECS[kind] = spec
    return kind


def ensure_registered() -> None:
    """Register the built-in kinds, then every entry point's (once per process)."""
    if _state["loaded"] or _state["loading"]:
        return
    _state["loading"] = True  # listing AttentionKind below must not re-enter
    try:
        from diffsweep.config.builtin_kinds import BUILTIN_KINDS

        for spec in BUILTIN_KINDS:
            register_kind(spec)
        for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            _register_entry_point(entry)
        _state["loaded"] = True
    finally:
        _state["loading"] = False


def _register_entry_point(entry: importlib.metadata.EntryPoint) -> None:
    # A broken plug-in must not stop diffsweep (its other kinds, --help): it is reported and left
    # out, so a config naming it fails with the list of the kinds that did load.
    try:
        spec = entry.load()
        if isinstance(spec, type):
            spec = spec()
        if getattr(spec, "name", None) != entry.name:
            raise ValueError(f"the entry point is named {entry.name!r} but its kind is named "
                             f"{getattr(spec, 'name', None)!r}")
        register_kind(spec)
    except Exception as exc:  # noqa: BLE001 (any failure of user code is reported the same way)
        warnings.warn(f"attention kind {entry.name!r} from entry point {entry.value!r} "
                      f"({ENTRY_POINT_GROUP}) was not registered: {exc}", RuntimeWarning, stacklevel=2)


def kind_specs() -> dict[AttentionKind, KindSpec]:
    """Every registered kind's spec, in registration order (built-in kinds first)."""
    ensure_registered()
    return dict(_SPECS)


def kind_spec(kind: AttentionKind | str) -> KindSpec:
    """The spec of ``kind``; an unknown name is a ``ConfigError`` listing the registered kinds."""
    ensure_registered()
    spec = _SPECS.get(kind) if isinstance(kind, AttentionKind) else None
    if spec is None:
        member = AttentionKind._value2member_map_.get(str(kind))
        spec = _SPECS.get(member) if isinstance(member, AttentionKind) else None
    if spec is None:
        raise ConfigError(KIND_KEY, f"expected one of [{', '.join(k.value for k in _SPECS)}], got {str(kind)!r}")
    return spec


def display_name(arch: str) -> str:
    """How reports and legends name the kind called ``arch`` (the name itself if no kind has it)."""
    kind = AttentionKind._value2member_map_.get(arch) if arch in AttentionKind else None
    return _SPECS[kind].display_name if kind in _SPECS else arch


def display_color(arch: str) -> str | None:
    """The plot colour of the kind called ``arch`` (None: not a kind, or no colour of its own)."""
    kind = AttentionKind._value2member_map_.get(arch) if arch in AttentionKind else None
    return _SPECS[kind].color if kind in _SPECS else None
