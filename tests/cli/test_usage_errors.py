"""Typer's own usage errors are the project's one line, and every option of every command refuses
NaN, infinity and integers beyond 64 bits (diffsweep/cli/usage.py) before its command runs.

The option lists are read from the CLI itself, so an option added later is covered without a test
of its own. The commands run in this process (tests.helpers.cli.run, as the console script runs
them); two tests run a real ``python -m diffsweep`` to show what a user's terminal gets at exit.
"""

from __future__ import annotations

from typing import Any

import pytest
import typer

from diffsweep.cli import app
from diffsweep.cli.usage import check_value, one_line
from tests.helpers.badinput import diffsweep, diffsweep_process, refused, untouched

ROOT = typer.main.get_command(app)


def commands(group: Any = ROOT, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for name, command in sorted(getattr(group, "commands", {}).items()):
        if getattr(command, "commands", None):
            found += commands(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


def options(kind: type) -> list[tuple[tuple[str, ...], str]]:
    """Every (command path, flag) whose option parses to ``kind`` (lists of ``kind`` included)."""
    found = []
    for path, command in commands():
        for param in command.params:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if param.param_type_name != "option" or annotation is None:
                continue
            args = getattr(annotation, "__args__", ())
            if annotation is kind or kind in args or any(kind in getattr(a, "__args__", ()) for a in args):
                found.append((path, max(param.opts, key=len)))
    return found


FLOAT_OPTIONS = options(float)
INT_OPTIONS = options(int)


def test_the_cli_has_the_options_these_tests_walk():
    # A guard against a walk that finds nothing (a Typer upgrade that renames type_descriptor).
    flags = {flag for _, flag in FLOAT_OPTIONS}
    assert {"--budget", "--level"} <= flags, flags
    assert {"--port", "--max-parallel"} <= {flag for _, flag in INT_OPTIONS}


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "+Infinity"])
@pytest.mark.parametrize(("path", "flag"), FLOAT_OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_every_float_option_refuses_a_non_finite_number(path, flag, value, tmp_path):
    with untouched(tmp_path):
        # The option first: Click checks parameters in the order they are typed, so the placeholder
        # arguments after it are never looked at.
        line = refused(diffsweep(*path, f"{flag}={value}", "placeholder", "placeholder", cwd=tmp_path))
    assert line.startswith(f"error: {flag}: expected a finite number"), line


@pytest.mark.parametrize(("path", "flag"), INT_OPTIONS, ids=lambda x: " ".join(x) if isinstance(x, tuple) else x)
def test_every_int_option_refuses_text_and_numbers_beyond_64_bits(path, flag, tmp_path):
    with untouched(tmp_path):
        text = refused(diffsweep(*path, f"{flag}=1.5B", "x", "x", cwd=tmp_path))
        assert text == f"error: {flag}: expected an integer, got '1.5B'"
        line = refused(diffsweep(*path, f"{flag}={10**30}", "x", "x", cwd=tmp_path))
    assert line.startswith(f"error: {flag}: expected") and ("2**63 - 1" in line or "at most" in line), line


@pytest.mark.parametrize(("args", "expected"), [
    (("server", "--port", "abc"), "error: --port: expected an integer, got 'abc'"),
    (("server", "--port", "70000"), "error: --port: expected at most 65535, got 70000"),
    (("launch", "--max-parallel", "0", "sweep.yaml"), "error: --max-parallel: expected at least 1, got 0"),
    (("data", "prepare", "corpus.txt", "--max-tokens", "1.5B"), "error: --max-tokens: expected an integer, got '1.5B'"),
    (("launch", "sweep.yaml", "--budget", "nan"), "error: --budget: expected a finite number, got nan"),
    (("model", "params"), "error: diffsweep model: no such command 'params'"),
    (("data", "prepare", "corpus.txt", "--bogus"), "error: diffsweep data prepare: no such option: --bogus"),
], ids=lambda x: " ".join(x) if isinstance(x, tuple) else None)
def test_a_user_sees_one_line_and_nothing_is_created(args, expected, tmp_path):
    (tmp_path / "sweep.yaml").write_text("name: s\nbase: {model: {size: tiny-s}}\ngrid: {seed: [0, 1]}\n")
    (tmp_path / "corpus.txt").write_text("Some English text.\n")
    with untouched(tmp_path):
        r = diffsweep(*args, cwd=tmp_path)
    assert refused(r) == expected


def test_no_arguments_still_prints_the_help(tmp_path):
    r = diffsweep("data", cwd=tmp_path)
    assert "Usage: diffsweep data" in r.stdout + r.stderr and "error:" not in r.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (("data", "prepare", "corpus.txt", "--bogus"), "error: diffsweep data prepare: no such option: --bogus"),
    (("model", "info", "--size", "2B"), "error: model.size: expected one of ["),  # a ConfigError
], ids=["usage error", "ConfigError"])
def test_a_real_process_prints_one_line_and_exits_2(args, expected, tmp_path):
    """The process boundary is the point: what ``python -m diffsweep`` leaves on a user's terminal
    (stdout empty, stderr the one line, nothing else) and the status the interpreter exits with."""
    (tmp_path / "corpus.txt").write_text("Some English text.\n")
    with untouched(tmp_path):
        r = diffsweep_process(*args, cwd=tmp_path)
    assert refused(r, alone=True).startswith(expected)
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr


def test_the_checks_of_a_value():
    assert check_value(1.0) is None and check_value([1, 2.5]) is None and check_value(True) is None
    assert check_value(None) is None and check_value("nan") is None  # text is its parser's business
    assert "finite" in (check_value(float("nan")) or "")
    assert "finite" in (check_value((1.0, float("-inf"))) or "")
    assert "2**63" in (check_value(2**63) or "") and check_value(2**63 - 1) is None


def test_an_error_without_a_parameter_names_the_command():
    ctx = typer.Context(ROOT, info_name="diffsweep")
    exc = typer.BadParameter.__mro__[1]("Something odd happened.", ctx=ctx)  # a UsageError
    assert one_line(exc) == "diffsweep: something odd happened"
