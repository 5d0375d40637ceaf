"""One registry of named plug-ins, used by the attention kinds, the schedulers, the probes and the scaling-law forms.

A name maps to an object, a class (made once, when first asked for) or a ``"module:attr"`` string
imported when first asked for, so listing the names imports nothing. Built-in entries come first,
then those registered at run time, then those packages add through the registry's entry-point
group (``[project.entry-points."diffsweep.<group>"]``, see docs/extending.md). A name is registered
once; an unknown name is a ``ConfigError`` on the caller's key that names the closest known one and
lists them all; a plug-in that does not load (a user's broken package) is an ``EnvironmentUnavailable``
naming it and why (the CLI: one line, exit 3).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from diffsweep.config.decode import did_you_mean
from diffsweep.config.errors import ConfigError, EnvironmentUnavailable

if TYPE_CHECKING:
    from importlib import metadata

T = TypeVar("T")


def load(target: str) -> Any:
    """The object a ``"module:attr"`` string names."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


class Registry(Generic[T]):
    """Names -> ``T`` objects: ``builtin`` ones, ones ``register`` adds, and the entry points of
    ``group``. ``base`` (a class or ``"module:Class"``) is what every entry must be; an entry whose
    object has a ``name`` must be registered under it. ``noun`` and ``key`` word the errors."""

    def __init__(self, noun: str, group: str, base: type[T] | str, builtin: Mapping[str, Any] | None = None,
                 key: str | None = None) -> None:
        self.noun, self.group, self.key = noun, group, key or noun
        self._base = base
        self._targets: dict[str, Any] = dict(builtin or {})
        self._builtin = frozenset(self._targets)
        self._made: dict[str, T] = {}

    def register(self, name: str, target: Any) -> None:
        """Add ``target`` (an object, a class or ``"module:attr"``) under ``name``; a name already
        taken (built in, registered or an entry point's) is an error."""
        if name in self:
            raise ValueError(f"{self.noun} {name!r} is already registered ({self._target(name)!r})")
        self._targets[name] = target

    def unregister(self, name: str) -> None:
        """Remove what ``register`` added under ``name`` (a test's own entry, when it ends)."""
        del self._targets[name]
        self._made.pop(name, None)

    def names(self) -> list[str]:
        """Every name, in order: built-in, registered, then the entry points' (none imported)."""
        return [*self._targets, *(n for n in self._entry_points() if n not in self._targets)]

    def __contains__(self, name: object) -> bool:
        return name in self._targets or name in self._entry_points()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str, key: str | None = None) -> T:
        """The entry called ``name``, imported and made on first use; an unknown name is a
        ``ConfigError`` on ``key`` (default: the registry's)."""
        if name in self._made:
            return self._made[name]
        target = self._target(name)
        if target is None:
            names = self.names()
            raise ConfigError(key or self.key, f"unknown {self.noun} {name!r}{did_you_mean(str(name), names)}; "
                              f"expected one of [{', '.join(names)}]")
        try:
            made = load(target) if isinstance(target, str) else target
            made = made() if isinstance(made, type) else made
        except Exception as exc:
            if name in self._builtin:
                raise  # diffsweep's own: a bug, with its traceback
            raise EnvironmentUnavailable(f"{self.noun} {name!r} ({target!r}) could not be loaded: "
                                         f"{type(exc).__name__}: {exc}") from exc
        base = load(self._base) if isinstance(self._base, str) else self._base
        if not isinstance(made, base):
            raise TypeError(f"{self.noun} {name!r}: {target!r} is not a {base.__module__}.{base.__qualname__}")
        named = getattr(made, "name", name)
        if named != name:
            raise ConfigError(key or self.key, f"{self.noun} {name!r} is registered as {target!r}, whose name is "
                              f"{named!r}")
        self._made[name] = made
        return made

    def _target(self, name: str) -> Any:
        return self._targets[name] if name in self._targets else self._entry_points().get(name)

    def _entry_points(self) -> dict[str, str]:
        return {ep.name: ep.value for ep in installed_entry_points(self.group)}


@functools.cache
def installed_entry_points(group: str) -> metadata.EntryPoints:
    """The installed packages' entry points of ``group``, read once per process: the read scans
    every package's metadata (milliseconds), and a registry is asked for its names many times per
    command. A package installed while a process runs is seen by the next process. Imported here:
    importlib.metadata is 30 ms of a command's start, and most commands never ask."""
    from importlib import metadata

    return metadata.entry_points(group=group)
