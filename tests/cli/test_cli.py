"""The CLI as a user runs it: ``diffsweep model``, ``config`` and the shared error and warning
handling, run in this process (tests.helpers.cli.run); real processes only where the process is
the point (the console script, what start-up imports, a command that must exit)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from diffsweep.config import load_config
from diffsweep.model import counting
from tests.helpers.cli import run, run_process


def test_console_script_and_module_agree():
    """Real processes: the installed console script and ``python -m diffsweep`` are the point."""
    exe = shutil.which("diffsweep")
    assert exe, "the diffsweep console script is installed"
    script = subprocess.run([exe, "model", "info", "--size", "830M", "--json"], capture_output=True, text=True,
                            timeout=120)
    module = run_process("model", "info", "--size", "830M", "--json", timeout=120)
    assert script.returncode == module.returncode == 0
    assert json.loads(script.stdout) == json.loads(module.stdout)


def test_model_info_json_reports_counts_flops_and_lambda_init():
    r = run("model", "info", "--size", "1.4B", "--arch", "diff_v1", "--json", "--check")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    m = load_config(None, ["model.size=1.4B", "model.attention.kind=diff_v1"]).model
    assert data["params"] == data["meta_params"] == counting.num_params(m)
    assert data["non_embedding_params"] == counting.num_non_embedding_params(m)
    assert data["train_flops_per_token"] == counting.train_flops_per_token(m, 2048)
    assert data["attention"]["heads"] == 8 and data["attention"]["v_dim"] == 256
    assert len(data["lambda_init"]["per_layer"]) == 24
    assert data["lambda_init"]["per_layer"][0] == pytest.approx(0.2)


def test_model_info_table_output():
    r = run("model", "info", "--size", "1.4B", "--arch", "diff_v1")
    assert r.returncode == 0, r.stderr
    for text in ("1,413,861,376", "λ_init per layer", "lambda_q1", "V head dim"):
        assert text in r.stdout


def test_model_compare_shows_mismatch_in_percent():
    r = run("model", "compare", "--size", "1.4B", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert set(rows) == {"transformer", "diff_v1", "diff_v2"}
    assert rows["transformer"]["attention"]["heads"] == 16  # the Transformer gets twice the DIFF heads
    assert rows["diff_v1"]["attention"]["heads"] == 8
    assert rows["diff_v2"]["attention"]["query_heads"] == 32
    assert abs(rows["diff_v1"]["params_vs_baseline_pct"]) < 0.1
    # The suggested FFN size really brings diff_v2 to parameter parity with the Transformer.
    ffn = rows["diff_v2"]["parity_ffn_hidden"]
    assert ffn < rows["diff_v2"]["model"]["ffn_hidden"]
    matched = run("model", "info", "--size", "1.4B", "--arch", "diff_v2", "--set", f"model.ffn_hidden={ffn}", "--json")
    pct = 100 * abs(json.loads(matched.stdout)["params"] - rows["transformer"]["params"]) / rows["transformer"]["params"]
    assert pct < 0.01
    table = run("model", "compare", "--size", "1.4B")
    assert table.returncode == 0 and "Δ parameters" in table.stdout and "%" in table.stdout


def test_compare_keeps_explicit_head_settings(tmp_path):
    path = tmp_path / "gqa.yaml"
    path.write_text("model:\n  size: tiny-m\n  attention:\n    num_kv_heads: 1\n")
    r = run("model", "compare", str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert {row["attention"]["kv_heads"] for row in json.loads(r.stdout)["rows"].values()} == {1}


def test_config_show_round_trips_and_marks_derived_fields(tmp_path):
    r = run("config", "show", "--size", "tiny-s", "--arch", "diff_v2", "--set", "train.lr=1e-3")
    assert r.returncode == 0, r.stderr
    assert "num_heads: null  # derived: 6" in r.stdout
    path = tmp_path / "shown.yaml"
    path.write_text(r.stdout)
    again = run("config", "show", str(path))
    assert again.stdout == r.stdout
    # the shown file is a base for any kind: diff_v1 re-derives its own head count
    v1 = run("model", "info", str(path), "--arch", "diff_v1", "--json")
    assert json.loads(v1.stdout)["attention"]["heads"] == 3


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["model", "info", "--set", "model.attention.lamda_init=exp_decay"], "model.attention.lamda_init"),
        (["model", "info", "--set", "model.attention.kind=diff"], "model.attention.kind"),
        (["model", "info", "--set", "model.attention.head_dim=100"], "model.attention.head_dim"),
        (["model", "info", "--set", "model.attention.num_kv_heads=3"], "model.attention.num_kv_heads"),
        (["model", "info", "--size", "2B"], "model.size"),
        (["model", "compare", "--size", "2B"], "model.size"),
        (["config", "show", "missing.yaml"], "missing.yaml"),
        (["model", "info", "--set", "nonsense"], "--set"),
        (["model", "info", "--set", "model.d_model=1099511627776"], "model.d_model"),
        (["model", "compare", "--set", "model.n_layers=1000000"], "model.n_layers"),
        (["config", "show", "--set", "train.seed=-1"], "train.seed"),
    ],
)
def test_config_errors_exit_2_with_one_line_naming_the_key(args, key, tmp_path):
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}"), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_bad_arch_is_one_line_naming_the_key():
    r = run("model", "info", "--arch", "diff_v3")
    assert r.returncode == 2
    assert r.stderr == "error: model.attention.kind: expected one of [transformer, diff_v1, diff_v2], got 'diff_v3'\n"


def test_check_builds_on_meta_whatever_backend_is_configured():
    # Counting does not depend on the kernel, so `--check` builds with the reference backend and
    # works even when the configured backend (flash) is absent on this machine.
    r = run("model", "info", "--size", "tiny-xs", "--set", "model.attention.backend=flash", "--check", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["meta_params"] == data["params"]


def test_environment_errors_exit_3_with_one_line():
    import typer
    from typer.testing import CliRunner

    from diffsweep.cli.common import handle_errors
    from diffsweep.config import EnvironmentUnavailable

    app = typer.Typer()

    @app.command()
    @handle_errors
    def needs_gpu() -> None:
        raise EnvironmentUnavailable("model.attention.backend: 'flash' needs a CUDA GPU, and none is visible")

    result = CliRunner().invoke(app, [])
    assert result.exit_code == 3
    assert result.output == "error: model.attention.backend: 'flash' needs a CUDA GPU, and none is visible\n"


def test_compare_with_kv_group_size_stays_parameter_matched():
    r = run("model", "compare", "--size", "1.4B", "--set", "model.attention.kv_group_size=4", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [rows[k]["attention"]["kv_heads"] for k in ("transformer", "diff_v1", "diff_v2")] == [4, 2, 4]
    assert abs(rows["diff_v1"]["params_vs_baseline_pct"]) < 0.01


def test_info_names_overrides_of_the_size_preset():
    r = run("model", "info", "--size", "1.4B", "--set", "model.n_layers=12", "--json")
    assert json.loads(r.stdout)["overrides_of_size"] == ["model.n_layers"]
    assert "overridden: n_layers" in run("model", "info", "--size", "1.4B", "--set", "model.n_layers=12").stdout


def test_warnings_come_before_the_error():
    r = run("model", "info", "--set", "model.attention.lambda_init=constant:0.5", "--set", "train.lr=0")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("warning: model.attention.lambda_init") and lines[-1].startswith("error: train.lr")


def test_no_effect_setting_prints_a_warning():
    r = run("model", "info", "--size", "tiny-xs", "--set", "model.attention.lambda_init=constant:0.5", "--json")
    assert r.returncode == 0
    assert r.stderr.startswith("warning: model.attention.lambda_init") and "no effect" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # said once, not once per validation pass


def test_help_imports_neither_torch_nor_mlflow():
    """A fresh interpreter: what ``--help`` imports at start-up is the point."""
    code = (
        "import sys\n"
        "from diffsweep.cli import app\n"
        "for argv in (['--help'], ['model', '--help'], ['model', 'info', '--help'], ['config', '--help']):\n"
        "    try:\n"
        "        app(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "heavy = sorted(m for m in ('torch', 'mlflow', 'scipy', 'submitit') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == "0.1.0"


def test_no_option_help_has_bracketed_text_that_rich_would_swallow():
    """Rich reads ``[default: x]`` in a help string as markup and prints nothing for it."""
    import re

    import typer.main

    from diffsweep.cli import app

    def commands(cmd):
        yield cmd
        for sub in getattr(cmd, "commands", {}).values():
            yield from commands(sub)

    bad = [(cmd.name, param.name) for cmd in commands(typer.main.get_command(app)) for param in cmd.params
           if re.search(r"\[[a-z ]+:", getattr(param, "help", None) or "")]
    assert not bad, bad


WARNING_COMMAND = """
import warnings
import numpy as np
import typer
from diffsweep.cli.common import handle_errors
from diffsweep.config import ConfigError, ConfigWarning

def command(ending):
    warnings.warn("foreign warning", UserWarning)
    warnings.warn("config warning", ConfigWarning)
    with np.errstate(over="warn"):
        np.exp(np.float64(1000.0))  # numpy's own RuntimeWarning, raised inside the library
    if ending == "error":
        raise ConfigError("train.lr", "bad value")
    print("done")

typer.run(handle_errors(command))  # as the CLI's commands run: inside a Typer app
"""


@pytest.mark.parametrize("ending", ["ok", "error"])
def test_every_kind_of_warning_is_shown_once_and_the_command_exits(ending):
    """A fresh interpreter: the hang this guards against kept the process from exiting, and Python's
    warning filters and once-per-location registry are interpreter state a test process shares."""
    # Foreign warnings used to be re-recorded by the very loop that showed them: the command did
    # its work and then spun forever at 100% CPU.
    r = subprocess.run([sys.executable, "-c", WARNING_COMMAND, ending], capture_output=True, text=True, timeout=60)
    assert r.returncode == (0 if ending == "ok" else 2), r.stderr
    assert r.stderr.count("foreign warning") == 1
    assert r.stderr.count("warning: config warning") == 1
    assert r.stderr.count("overflow encountered in exp") == 1
    assert ("done" in r.stdout) == (ending == "ok")
    assert r.stderr.count("error: train.lr: bad value") == (ending == "error")
