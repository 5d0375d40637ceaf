"""How the readers of ``data prepare``'s inputs word what goes wrong: a missing optional package (of
the ``corpora`` extra) as ``EnvironmentUnavailable`` naming the extra, a library's exception in one
line, and a JSON value's type as an error message says it."""

from __future__ import annotations

import importlib
from typing import Any

from diffsweep.config import EnvironmentUnavailable

INSTALL = "pip install 'diffsweep[corpora]'"


def optional_module(name: str, needed_for: str) -> Any:
    """Import an optional package of the ``corpora`` extra, or say which extra installs it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        package = name.split(".")[0]
        raise EnvironmentUnavailable(f"reading {needed_for} needs the {package} package: {INSTALL}") from exc


def json_type(value: Any) -> str:
    """``value``'s JSON type, as "expected ..., it is a number" says it."""
    names = {type(None): "null", bool: "a boolean", int: "a number", float: "a number", list: "an array",
             dict: "an object", str: "a string"}
    return names.get(type(value), type(value).__name__)


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
