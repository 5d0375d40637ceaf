"""The root command group: Typer's own usage errors as the project's one line, and the checks every
option gets whatever its command.

Typer parses each option from its annotation and, on a bad value (``--port abc``, ``--port 70000``,
an unknown option or command), prints a usage box of five or six lines. The project's rule is one
line, ``error: KEY: what was expected``, exit 2, as the closed choices and the library's
``ConfigError`` already print. Typer also accepts ``nan`` and ``inf`` for a ``float`` option and an
``int`` of any size; no option of this CLI means either, and each would reach a bound check that
NaN passes (``nan > budget`` is false) or a NumPy/torch call that overflows. So the root group checks
every option's parsed value once, here, before any command runs: a float must be finite and an int
must fit in 64 bits. Range and type checks of an option live in its annotation (``min=``, ``max=``);
what an option's value means (a budget no larger than the sweep, a path that is not an input) is
checked by the library function the command calls.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import typer
from typer.core import TyperGroup

# Typer's exception classes, found from the one it exports: Typer releases either use Click's or
# vendor their own copy (typer._click), and the names are the same in both.
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

INT64_MAX = 2**63 - 1
EXIT_USAGE = 2

# Pydantic's error types for a CLI value (Typer validates options with a TypeAdapter), as what was
# expected: the message then reads like the project's others.
_EXPECTED = {
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "int_type": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "finite_number": "a finite number",
}
_BOUNDS = {"greater_than_equal": "at least {ge}", "greater_than": "more than {gt}",
           "less_than_equal": "at most {le}", "less_than": "less than {lt}"}


def _values(value: Any) -> Iterator[Any]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _values(item)
    else:
        yield value


def check_value(value: Any) -> str | None:
    """What is wrong with a parsed option value that no option accepts, or None."""
    for v in _values(value):
        if isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            return f"expected a finite number, got {v}"
        if isinstance(v, int) and abs(v) > INT64_MAX:
            return f"expected an integer of at most 2**63 - 1, got {v}"
    return None


def _checked(param: Any) -> None:
    """Run ``check_value`` on ``param``'s parsed value, before the callback it already has."""
    callback = param.callback

    def check(ctx: Any, p: Any, value: Any) -> Any:
        problem = check_value(value)
        if problem is not None:
            raise typer.BadParameter(problem, ctx=ctx, param=p)
        return callback(ctx, p, value) if callback is not None else value

    param.callback = check


def _walk(command: Any) -> Iterator[Any]:
    yield command
    for sub in getattr(command, "commands", {}).values():
        yield from _walk(sub)


def param_key(exc: Any) -> str:
    """The flag (``--port``) or argument (``SWEEP``) a usage error is about, or ''."""
    param = getattr(exc, "param", None)
    if param is None:
        return str(getattr(exc, "param_hint", "") or "")
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")] or list(getattr(param, "opts", []))
    if getattr(param, "param_type_name", "") == "argument" or not opts:
        return (param.human_readable_name or param.name or "").upper()
    return max(opts, key=len)


def _finite(text: Any) -> bool:
    try:
        return math.isfinite(float(text))
    except (TypeError, ValueError):
        return True  # not a number at all: the parser's message says so


def _pydantic_message(exc: BaseException) -> str | None:
    """'expected an integer, got '1.5B'' from the pydantic error behind Typer's BadParameter."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if not callable(errors):
        return None
    try:
        first = errors()[0]
    except Exception:  # noqa: BLE001 (not the error we know: fall back to Typer's text)
        return None
    kind, got, ctx = first.get("type", ""), first.get("input"), first.get("ctx") or {}
    if not _finite(got):  # `nan` fails a bound too (`nan >= 1` is false): say why it cannot be one
        return f"expected a finite number, got {got}"
    if kind in _EXPECTED:
        expected = _EXPECTED[kind]
    elif kind in _BOUNDS:
        return f"expected {_BOUNDS[kind].format(**ctx)}, got {got}"  # a number as typed, unquoted
    else:
        return None
    return f"expected {expected}, got {got!r}" if got is not None else f"expected {expected}"


def one_line(exc: Any) -> str:
    """A Click/Typer usage error as the project's one line (without ``error: ``)."""
    message = _pydantic_message(exc) or str(getattr(exc, "message", "") or exc)
    message = " ".join(message.split()).rstrip(".")
    if isinstance(exc, typer.BadParameter) and not type(exc).__name__ == "MissingParameter":
        key = param_key(exc)
        return f"{key}: {message}" if key else message
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else ""
    message = message[:1].lower() + message[1:]
    return f"{where}: {message}" if where else message


class Root(TyperGroup):
    """The ``diffsweep`` group: every option checked (``check_value``) and every usage error one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in _walk(self):
            for param in command.params:
                _checked(param)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, windows_expand_args: bool = True, **extra: Any) -> Any:
        common = {"args": args, "prog_name": prog_name, "complete_var": complete_var,
                  "windows_expand_args": windows_expand_args, **extra}
        if not standalone_mode:
            return super().main(standalone_mode=False, **common)
        try:
            rv = super().main(standalone_mode=False, **common)
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        except UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `diffsweep data` alone: the help is the answer
                exc.show()  # type: ignore[attr-defined]
                sys.exit(exc.exit_code)  # type: ignore[attr-defined]
            typer.echo(f"error: {one_line(exc)}", err=True)
            sys.exit(EXIT_USAGE)
        except ClickException as exc:
            typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)  # type: ignore[attr-defined]
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        # Not standalone, Typer returns a command's result or, after ``typer.Exit``, its code.
        sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)
