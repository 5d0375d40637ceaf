"""Errors a user can fix (config) versus errors of the environment (missing GPU/package)."""

from __future__ import annotations

from collections.abc import Mapping


class ConfigError(ValueError):
    """A configuration value the user can fix. ``key`` is the dotted path, e.g. ``model.d_model``."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self):  # pickled by its two fields (it crosses from a worker process)
        return type(self), (self.key, self.message)


def rekeyed(exc: ConfigError, names: Mapping[str, str], *, items: bool = True) -> ConfigError:
    """``exc`` with its key's field renamed as ``names`` says (same message): to the flag that sets
    it, or to the file that gave it. A key that starts with the field keeps the rest: ``set:
    data.path`` (the field, then what in it) becomes ``--set: data.path``; with ``items``,
    ``slurm_overrides.time`` (an item of the field) becomes ``--slurm time``."""
    for field, name in names.items():
        if exc.key == field or exc.key.startswith(f"{field}: "):
            return ConfigError(name + exc.key[len(field):], exc.message)
        if items and exc.key.startswith(f"{field}."):
            return ConfigError(f"{name} {exc.key[len(field) + 1:]}", exc.message)
    return exc


class EnvironmentUnavailable(RuntimeError):
    """The config is valid, but this machine lacks what it needs (a GPU, a package)."""


class ConfigWarning(UserWarning):
    """A setting that is accepted but has no effect for this configuration."""
