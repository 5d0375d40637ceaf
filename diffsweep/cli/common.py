"""Shared CLI plumbing: loading a config from the command line, errors and warnings.

Nothing here imports torch or mlflow.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from diffsweep.config import AttentionKind, Config, ConfigError, ConfigWarning, EnvironmentUnavailable, load_config

F = TypeVar("F", bound=Callable[..., Any])

ConfigArg = Annotated[
    Path | None, typer.Argument(help="Run config YAML (omit for the defaults).", show_default=False)
]
SizeOpt = Annotated[str | None, typer.Option("--size", help="Size preset (see `diffsweep model sizes`).")]
ArchOpt = Annotated[
    str | None,
    typer.Option("--arch", help=f"Attention kind: {' | '.join(k.value for k in AttentionKind)}.", show_default=False),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config value: --set model.attention.head_dim=64 (repeatable)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


EXIT_USAGE = 2  # bad input: config, file or flag the user can fix
EXIT_ENVIRONMENT = 3  # valid input, but this machine lacks what it needs (GPU, package)


def fail(message: str, code: int = EXIT_USAGE) -> None:
    """Print a one-line error to stderr and exit."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn user-fixable errors into one line on stderr and exit code 2 (environment errors: 3),
    without a traceback; print config warnings first, as ``warning:`` lines."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caught: list[warnings.WarningMessage] = []
        try:
            # Warnings are recorded while the command runs and shown once it is done, outside the
            # recording: ``warnings.showwarning`` inside it would append them back to the list.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConfigWarning)
                return fn(*args, **kwargs)
        except ConfigError as exc:
            _show(caught)
            fail(str(exc), EXIT_USAGE)
        except EnvironmentUnavailable as exc:
            _show(caught)
            fail(str(exc), EXIT_ENVIRONMENT)
        finally:
            _show(caught)

    return wrapper  # type: ignore[return-value]


def _show(caught: list[warnings.WarningMessage]) -> None:
    """Print and forget the recorded warnings (call outside ``catch_warnings(record=True)``)."""
    pending, caught[:] = list(caught), []
    for w in pending:
        if issubclass(w.category, ConfigWarning):
            typer.echo(f"warning: {w.message}", err=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def cli_overrides(size: str | None, arch: str | None, sets: list[str] | None) -> list[str]:
    """The CLI's --size, --arch and --set as ``--set``-style overrides (later wins)."""
    overrides: list[str] = []
    if size is not None:
        overrides.append(f"model.size={size}")
    if arch is not None:
        overrides.append(f"model.attention.kind={arch}")
    return overrides + list(sets or [])


def cli_config(config: Path | None, size: str | None, arch: str | None, sets: list[str] | None) -> Config:
    """Load a resolved config from the CLI's CONFIG, --size, --arch and --set (later wins)."""
    return load_config(config, cli_overrides(size, arch, sets))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
