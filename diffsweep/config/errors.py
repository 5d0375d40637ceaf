"""Errors a user can fix (config) versus errors of the environment (missing GPU/package)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value the user can fix. ``key`` is the dotted path, e.g. ``model.d_model``."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self):  # pickled by its two fields (it crosses from a worker process)
        return type(self), (self.key, self.message)


class EnvironmentUnavailable(RuntimeError):
    """The config is valid, but this machine lacks what it needs (a GPU, a package)."""


class ConfigWarning(UserWarning):
    """A setting that is accepted but has no effect for this configuration."""
