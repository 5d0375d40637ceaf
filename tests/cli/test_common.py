"""The CLI's shared plumbing: closed choices (an Enum or a registry of names) fail in one line
naming the flag (or the config key they set), and the library's fields are shown as flags."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from diffsweep.cli.common import choice, flag_keys, handle_errors, name_choice
from diffsweep.config import ConfigError


class Color(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


NAMES = ["a", "b"]


def app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @handle_errors(flags={"level": "--level"})
    def main(
        color: Annotated[Color, choice(Color, "--color", "A colour.")] = Color.RED,
        warm: Annotated[list[Color] | None, choice(Color, "--warm", "Warm: {choices}.", key="paint.warm",
                                                   members=(Color.RED,), metavar="WARM")] = None,
        name: Annotated[str | None, name_choice(lambda: NAMES, "--name", "A name.")] = None,
        level: int = 0,
    ) -> None:
        if level < 0:
            raise ConfigError("level", f"expected 0 or more, got {level}")
        typer.echo(f"{type(color).__name__}.{color.value} {[w.value for w in warm or []]} {name}")

    return app


@pytest.mark.parametrize("args, out", [
    ([], "Color.red [] None"),
    (["--color", "blue", "--warm", "red", "--warm", "red"], "Color.blue ['red', 'red'] None"),
    (["--name", "b"], "Color.red [] b"),
])
def test_choices_parse_to_members_and_names(args, out):
    r = CliRunner().invoke(app(), args)
    assert (r.exit_code, r.stdout.strip()) == (0, out), r.output


@pytest.mark.parametrize("args, error", [
    (["--color", "teal"], "error: --color: expected one of [red, green, blue], got 'teal'"),
    (["--warm", "blue"], "error: paint.warm: expected one of [red], got 'blue'"),
    (["--name", "c"], "error: --name: expected one of [a, b], got 'c'"),
    (["--level", "-1"], "error: --level: expected 0 or more, got -1"),
])
def test_a_bad_value_is_one_line_exit_2(args, error):
    r = CliRunner().invoke(app(), args)
    assert r.exit_code == 2 and r.stderr == error + "\n", r.output


def test_a_registered_name_is_accepted_after_start_up():
    NAMES.append("c")
    try:
        assert CliRunner().invoke(app(), ["--name", "c"]).exit_code == 0
    finally:
        NAMES.remove("c")


def test_help_lists_the_choices():
    r = CliRunner().invoke(app(), ["--help"], env={"COLUMNS": "200"})
    assert "[red|green|blue]" in r.stdout and "Warm: red." in r.stdout and "[a|b]" in r.stdout


def test_flag_keys_rekeys_only_mapped_fields():
    with pytest.raises(ConfigError) as caught, flag_keys({"n_boot": "--boot"}):
        raise ConfigError("n_boot", "expected at least 50")
    assert str(caught.value) == "--boot: expected at least 50"
    with pytest.raises(ConfigError) as caught, flag_keys({"n_boot": "--boot"}):
        raise ConfigError("model.size", "expected one of [a]")
    assert str(caught.value) == "model.size: expected one of [a]"


def test_a_field_named_as_an_option_is_shown_as_its_flag_without_a_map():
    """``handle_errors`` reads each option's flag from Typer's own declaration: a field named as the
    parameter is re-keyed without being listed (``--max-runs``, ``--dry-run/--wet``), as the whole
    key only (``dry_run.x`` is not an item of ``--dry-run``); ``flags`` still maps the fields named
    otherwise; a flag a field named otherwise maps to is not taken again from its parameter's name
    (``slurm`` names the scheduler in the library; ``--slurm`` sets ``slurm_overrides``); an
    unknown field stays as it is."""
    from diffsweep.cli.common import flags_of

    app = typer.Typer()

    @app.command()
    @handle_errors(flags={"n_boot": "--boot"})
    def main(
        max_runs: Annotated[int, typer.Option("--max-runs", help="Runs.")] = 1,
        dry_run: Annotated[bool, typer.Option("--dry-run/--wet", help="Dry.")] = False,
        boot: Annotated[int, typer.Option("--boot", help="Draws.")] = 100,
        slurm: Annotated[list[str] | None, typer.Option("--slurm", help="Settings.")] = None,
        key: str = "max_runs",
    ) -> None:
        raise ConfigError(key, "expected better")

    assert flags_of(main.__wrapped__) == {"max_runs": "--max-runs", "dry_run": "--dry-run", "boot": "--boot",
                                          "slurm": "--slurm"}
    for key, shown in (("max_runs", "--max-runs"), ("dry_run", "--dry-run"), ("n_boot", "--boot"),
                       ("max_runs: 3", "--max-runs: 3"), ("other", "other"), ("dry_run.x", "dry_run.x"),
                       ("slurm", "slurm"), ("slurm_overrides.time", "--slurm time")):
        r = CliRunner().invoke(app, ["--key", key])
        assert r.exit_code == 2 and r.stderr == f"error: {shown}: expected better\n", (key, r.output)
