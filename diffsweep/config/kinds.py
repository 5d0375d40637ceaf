"""The registry of attention kinds: one ``KindSpec`` per kind (pure Python, no torch).

A kind is one definition plus one registration: its spec (``builtin_kinds.py`` for diffsweep's own
kinds, or a user's package) and the ``nn.Module`` the spec names. In a config a kind is its name (a
``str``), checked against this registry when the config is read. Third-party kinds register through
an entry point in the group ``diffsweep.attention_kinds`` whose object is a ``KindSpec`` subclass
(or instance) and whose name is the kind's config value::

    [project.entry-points."diffsweep.attention_kinds"]
    toy = "toy_kind.spec:ToyKind"

Listing the names imports nothing; a spec is imported when first asked for. A spec module must not
import torch: it is loaded by ``diffsweep --help``.
"""

from __future__ import annotations

import warnings

from diffsweep.config.enums import AttentionKind
from diffsweep.config.errors import ConfigError, EnvironmentUnavailable
from diffsweep.config.kind_spec import KindSpec, NameToken, ParamInfo
from diffsweep.config.registry import Registry

ENTRY_POINT_GROUP = "diffsweep.attention_kinds"
KIND_KEY = "model.attention.kind"
BUILTIN = {
    "transformer": "diffsweep.config.builtin_kinds:Transformer",
    "diff_v1": "diffsweep.config.builtin_kinds:DiffV1",
    "diff_v2": "diffsweep.config.builtin_kinds:DiffV2",
}
KINDS: Registry[KindSpec] = Registry("attention kind", ENTRY_POINT_GROUP, KindSpec, BUILTIN, key=KIND_KEY)

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "KINDS", "KindSpec", "NameToken", "ParamInfo", "display_color",
           "display_name", "kind_names", "kind_spec", "kind_specs", "register_kind"]


def register_kind(spec: KindSpec | type[KindSpec]) -> AttentionKind:
    """Register ``spec`` (an instance, or a subclass made when first asked for) under its name,
    which no other kind may have; returns the name."""
    name = getattr(spec, "name", None)
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"attention kind name must be a lower-case identifier, got {name!r}")
    KINDS.register(name, spec)
    return name


def kind_names() -> list[AttentionKind]:
    """Every kind's name (none imported): the built-in ones, registered ones, then packages'."""
    return KINDS.names()


def kind_spec(kind: AttentionKind, key: str = KIND_KEY) -> KindSpec:
    """The spec of the kind called ``kind``; an unknown name is a ``ConfigError`` on ``key`` listing
    the registered kinds, a plug-in that does not load an ``EnvironmentUnavailable``."""
    return KINDS.get(str(kind), key)


def kind_specs() -> dict[AttentionKind, KindSpec]:
    """Every kind's spec that loads, in ``kind_names`` order. One that does not (a user's broken
    package) is left out with a warning, so that it cannot stop a run of another kind."""
    specs = {}
    for name in kind_names():
        try:
            specs[name] = kind_spec(name)
        except (EnvironmentUnavailable, ConfigError) as exc:  # a plug-in's (a built-in one raises)
            warnings.warn(f"{exc}; left out", RuntimeWarning, stacklevel=2)
    return specs


def display_name(arch: str) -> str:
    """How reports and legends name the kind called ``arch`` (the name itself if no kind has it)."""
    spec = _loaded(arch)
    return spec.display_name if spec is not None else arch


def display_color(arch: str) -> str | None:
    """The plot colour of the kind called ``arch`` (None: not a kind, or no colour of its own)."""
    spec = _loaded(arch)
    return spec.color if spec is not None else None


def _loaded(arch: str) -> KindSpec | None:
    if arch not in KINDS:
        return None
    try:
        return kind_spec(arch)
    except (EnvironmentUnavailable, ConfigError):  # a plug-in that does not load: named as written
        return None
