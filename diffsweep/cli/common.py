"""Shared CLI plumbing: loading a config from the command line, closed choices, errors and warnings.

The library names the field (function argument, request attribute) at fault in a ``ConfigError``;
``handle_errors`` re-keys it to the flag that sets it, so the user reads the flag they typed: a
field named as the command's parameter gets that parameter's flag, read from Typer's own option
(``flags_of``); a command lists only the fields named otherwise (``handle_errors(flags=...)``).
Nothing here imports torch or mlflow.
"""

from __future__ import annotations

import functools
import json
import sys
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, overload

import typer

from diffsweep.config import (
    SIZES,
    AttentionKind,
    ConfigError,
    ConfigWarning,
    EnvironmentUnavailable,
    ResolvedConfig,
    load_config,
)
from diffsweep.config.errors import rekeyed
from diffsweep.config.kinds import kind_names

F = TypeVar("F", bound=Callable[..., Any])
E = TypeVar("E", bound=StrEnum)
Flags = Mapping[str, str]  # a library field (argument, request attribute) -> the flag that sets it


def bad_choice(key: str, allowed: Iterable[str], value: Any, expected: str = "one of") -> NoReturn:
    """The one-line usage error (exit 2) of a closed choice given a value outside it."""
    fail(f"{key}: expected {expected} [{', '.join(allowed)}], got '{value}'")


def _enum_parser(enum: type[E], key: str, members: tuple[E, ...] | None) -> Callable[[Any], E]:
    """Parse a closed choice; a wrong value is the CLI's one-line usage error (exit 2), not Typer's box."""
    def parse(value: Any) -> E:
        allowed = members if members is not None else tuple(enum)
        member = next((e for e in allowed if e == value), None)  # a member or its value (a StrEnum is a str)
        if member is None:
            bad_choice(key, (e.value for e in allowed), value)
        return member

    return parse


def _option(flag: str, help: str, names: list[str], parse: Callable[[Any], Any], metavar: str | None,
            **kw: Any) -> Any:
    """The Typer option of a closed choice: ``{choices}`` in ``help`` becomes ``a | b | c`` (it wraps
    between names, for long lists, with a short ``metavar``); otherwise the metavar lists them."""
    return typer.Option(flag, help=help.replace("{choices}", " | ".join(names)), parser=parse,
                        metavar=metavar or f"[{'|'.join(names)}]", **kw)


def choice(enum: type[E], flag: str, help: str, *, key: str | None = None, members: Iterable[E] | None = None,
           metavar: str | None = None, **kw: Any) -> Any:
    """A Typer option for a StrEnum: its choices in the help, its members as values (a repeatable
    option when annotated ``list[...]``). A wrong value is one line naming ``key`` (default: the
    flag; an option that sets a config value names its dotted key, as the config's own error does);
    ``members`` narrows the choice to some of the enum's members."""
    subset = tuple(members) if members is not None else None
    listed = subset if subset is not None else tuple(enum)
    return _option(flag, help, [e.value for e in listed], _enum_parser(enum, key or flag, subset), metavar, **kw)


def name_choice(names: Callable[[], Iterable[str]], flag: str, help: str, *, key: str | None = None,
                expected: str = "one of", metavar: str | None = None, **kw: Any) -> Any:
    """A Typer option for a closed choice of names held in a registry or a data table (schedulers,
    size presets): the value stays a ``str``, checked against ``names()`` when the option is
    given, so a name registered after start-up (a plug-in, a test) is accepted. The help lists the
    names known when the CLI is imported."""
    def parse(value: Any) -> str:
        allowed = list(names())
        if value not in allowed:
            bad_choice(key or flag, allowed, value, expected)
        return str(value)

    return _option(flag, help, list(names()), parse, metavar, **kw)


# Fields that several commands' flags set, named the same everywhere: the config overrides, the
# cluster profile and its per-launch Slurm settings and setup lines.
COMMON_FLAGS: Flags = {"set": "--set", "profile": "--profile", "slurm_overrides": "--slurm", "setup_lines": "--setup"}


def _rekeyed_for(exc: ConfigError, command: Callable[..., Any], flags: Flags | None) -> ConfigError:
    """``exc`` re-keyed for ``command``: by the fields it maps (``flags``, and ``COMMON_FLAGS``),
    else by its options' own names (``flags_of``), only as the whole key (``launch.gpus_per_run``
    is a sweep file's key, not an item of ``suggest --launch``), and not for a flag a field named
    otherwise already maps to (``slurm`` names the scheduler; ``--slurm`` sets ``slurm_overrides``)."""
    mapped = {**COMMON_FLAGS, **(flags or {})}
    new = rekeyed(exc, mapped)
    if new is not exc:
        return new
    own = {name: flag for name, flag in flags_of(command).items() if flag not in mapped.values()}
    return rekeyed(exc, own, items=False)


@contextmanager
def flag_keys(flags: Flags) -> Iterator[None]:
    """Re-key the library's ConfigErrors raised in the block from fields to flags (same message)."""
    try:
        yield
    except ConfigError as exc:
        new = rekeyed(exc, flags)
        if new is exc:
            raise
        raise new from None


ConfigArg = Annotated[
    Path | None, typer.Argument(help="Run config YAML (omit for the defaults).", show_default=False)
]
SizeOpt = Annotated[str | None, name_choice(lambda: SIZES, "--size", "Size preset: {choices} (see `diffsweep model "
                                             "sizes`).", key="model.size", metavar="SIZE", show_default=False)]
ArchOpt = Annotated[
    AttentionKind | None,
    name_choice(kind_names, "--arch", "Attention kind: {choices}.", key="model.attention.kind", metavar="KIND",
                show_default=False),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config value: --set model.attention.head_dim=64 (repeatable)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


EXIT_USAGE = 2  # bad input: config, file or flag the user can fix
EXIT_ENVIRONMENT = 3  # valid input, but this machine lacks what it needs (GPU, package)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print a one-line error to stderr and exit."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def flags_of(command: Callable[..., Any]) -> dict[str, str]:
    """Each option parameter of a Typer command, by name, with its long flag (from the command's
    own ``typer.Option``): ``baseline -> --baseline``, ``sets -> --set``."""
    found = {}
    for name, hint in typing.get_type_hints(command, include_extras=True).items():
        for info in getattr(hint, "__metadata__", ()):
            if isinstance(info, typer.models.OptionInfo):
                # in ``Annotated[..., typer.Option("--flag")]`` the first declaration lands in ``default``
                decls = ((info.default,) if isinstance(info.default, str) else ()) + tuple(info.param_decls or ())
                long = [d for d in decls if d.startswith("--")]
                if long:
                    found[name] = long[0].split("/")[0]
    return found


@overload
def handle_errors(fn: F, *, flags: Flags | None = None) -> F: ...
@overload
def handle_errors(fn: None = None, *, flags: Flags | None = None) -> Callable[[F], F]: ...
def handle_errors(fn: F | None = None, *, flags: Flags | None = None) -> F | Callable[[F], F]:
    """Turn user-fixable errors into one line on stderr and exit code 2 (environment errors: 3),
    without a traceback; print config warnings first, as ``warning:`` lines. The fields the
    library's errors name become the command's flags: its parameters' own (``flags_of``), and
    ``flags`` for fields named otherwise (``@handle_errors(flags=...)``)."""
    if fn is None:
        return lambda f: handle_errors(f, flags=flags)
    command = fn

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        caught: list[warnings.WarningMessage] = []
        try:
            # Warnings are recorded while the command runs and shown once it is done, outside the
            # recording: ``warnings.showwarning`` inside it would append them back to the list.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConfigWarning)
                return command(*args, **kwargs)
        except ConfigError as exc:
            _show(caught)
            fail(str(_rekeyed_for(exc, command, flags)), EXIT_USAGE)
        except EnvironmentUnavailable as exc:
            _show(caught)
            fail(str(exc), EXIT_ENVIRONMENT)
        finally:
            _show(caught)

    return wrapper


def _show(caught: list[warnings.WarningMessage]) -> None:
    """Print and forget the recorded warnings (call outside ``catch_warnings(record=True)``)."""
    pending, caught[:] = list(caught), []
    for w in pending:
        if issubclass(w.category, ConfigWarning):
            typer.echo(f"warning: {w.message}", err=True)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def cli_overrides(size: str | None, arch: AttentionKind | None, sets: list[str] | None) -> list[str]:
    """The CLI's --size, --arch and --set as ``--set``-style overrides (later wins)."""
    overrides: list[str] = []
    if size is not None:
        overrides.append(f"model.size={size}")
    if arch is not None:
        overrides.append(f"model.attention.kind={arch}")
    return overrides + list(sets or [])


def cli_config(config: Path | None, size: str | None, arch: AttentionKind | None, sets: list[str] | None) -> ResolvedConfig:
    """Load a resolved config from the CLI's CONFIG, --size, --arch and --set (later wins)."""
    return load_config(config, cli_overrides(size, arch, sets))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
