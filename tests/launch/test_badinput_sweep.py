"""Bad input to plan / launch / status / cancel / logs / reconcile and doctor, as a user meets it:
one ``error:`` line naming the option, exit 2, and nothing submitted, locked, created, changed or
deleted (the folder tree is the same before and after)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from diffsweep.config import ConfigError
from tests.helpers.badinput import diffsweep, refused, untouched
from tests.launch.conftest import write_sweep


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """A tiny local sweep beside a user's folder with a file, and a plain file (its dataset need not
    exist: every refusal here comes before the dataset is looked at)."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own\n")
    (tmp_path / "afile").write_text("x\n")
    return write_sweep(tmp_path / "t.yaml", tmp_path / "no-dataset", kinds=("transformer",))


STORE = {"MLFLOW_TRACKING_URI": "sqlite:///store/mlflow.db"}  # relative: under tmp_path, so a store made shows


@pytest.mark.parametrize(("args", "needles"), [
    (["--budget", "nan"], ["--budget"]),
    (["--budget", "-1"], ["--budget", "-1"]),
    (["--max-parallel", "0"], ["--max-parallel"]),
    (["--retries", "-1"], ["--retries"]),
    (["--audit-threshold", "nan"], ["--audit-threshold"]),
    (["--only", ""], ["--only", "''"]),
    (["--out", "mine"], ["--out", "mine", "notes.txt", "expected a sweep output directory"]),
    (["--out", ""], ["--out", "expected a sweep output directory"]),  # '' is the working directory here
    (["--out", "afile"], ["--out", "afile", "not a directory"]),
])
def test_launch_refuses_bad_options_before_anything_is_made(tmp_path, sweep, args, needles):
    with untouched(tmp_path):
        r = diffsweep("launch", str(sweep), "--executor", "local", *args, cwd=tmp_path, env=STORE)
    refused(r, *needles)


@pytest.mark.parametrize("command", ["plan", "status", "cancel", "reconcile"])
def test_the_sweep_commands_refuse_a_users_folder_as_out(tmp_path, sweep, command):
    with untouched(tmp_path):
        r = diffsweep(command, str(sweep), "--out", "mine", cwd=tmp_path, env=STORE)
    refused(r, "--out", "notes.txt")


@pytest.mark.parametrize("command", ["plan", "status", "cancel"])
def test_an_empty_only_is_refused_not_read_as_every_run(tmp_path, sweep, command):
    with untouched(tmp_path):
        r = diffsweep(command, str(sweep), "--executor", "local", "--only", " ", cwd=tmp_path, env=STORE)
    refused(r, "--only")


def test_the_default_output_beside_the_sweep_is_refused_when_it_holds_a_users_files(tmp_path, sweep):
    (tmp_path / "runs" / "t").mkdir(parents=True)
    (tmp_path / "runs" / "t" / "results.csv").write_text("a,b\n")
    with untouched(tmp_path):
        r = diffsweep("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=STORE)
    refused(r, "launch.output", "results.csv")


@pytest.mark.parametrize("name", ["..launch.lock.login1.4242.68c88c9a", ".launch.lock.break",
                                  "..ledger.lock.vm.17.0123abcd", ".launch.lock", ".ledger.json.4242.tmp",
                                  ".ledger.json.tmp"])
def test_the_files_of_another_launch_taking_its_lock_are_not_a_users(tmp_path, sweep, name):
    """A second launch that looks while the first is taking the lock finds the lock's temporary
    file (or its ``.break``, or the ledger's temporary file) in a sweep directory that has no ledger
    yet: that is a launch in progress, not a user's folder (CI once saw "holds files that are not a sweep's" here)."""
    (tmp_path / "runs" / "t").mkdir(parents=True)
    (tmp_path / "runs" / "t" / name).write_text("{}")
    r = diffsweep("plan", str(sweep), "--executor", "local", cwd=tmp_path, env=STORE)
    assert r.returncode == 0, r.stderr
    assert "not a sweep's" not in r.stderr


def test_a_base_that_is_a_sweep_file_is_named_with_what_was_expected(tmp_path, sweep):
    (tmp_path / "b.yaml").write_text("name: b\nbase: t.yaml\ngrid:\n  train.lr: [0.001]\n")
    with untouched(tmp_path):
        r = diffsweep("plan", "b.yaml", "--executor", "local", cwd=tmp_path)
    line = refused(r, "b.yaml: base", str(sweep), "is a sweep file", "expected a run config YAML")
    assert "'grid'" in line


@pytest.mark.parametrize(("text", "needles"), [
    ("model:\n  size: tiny-xs\nfoo: 1\n", ["'foo'", "expected a run config YAML"]),
    (None, ["is not a file", "expected a run config YAML"]),  # base: a folder
])
def test_a_base_that_is_no_run_config_is_named(tmp_path, text, needles):
    if text is None:
        (tmp_path / "rc.yaml").mkdir()
    else:
        (tmp_path / "rc.yaml").write_text(text)
    (tmp_path / "b.yaml").write_text("name: b\nbase: rc.yaml\ngrid:\n  train.lr: [0.001]\n")
    with untouched(tmp_path):
        r = diffsweep("plan", "b.yaml", "--executor", "local", cwd=tmp_path)
    refused(r, "b.yaml: base", "rc.yaml", *needles)


@pytest.mark.parametrize(("options", "key"), [
    ({"budget": math.nan}, "budget"), ({"budget": -0.5}, "budget"), ({"budget": math.inf}, "budget"),
    ({"max_parallel": 0}, "max_parallel"), ({"retries": -1}, "retries"),
    ({"audit_threshold": math.nan}, "audit_threshold"), ({"audit_threshold": 1.5}, "audit_threshold"),
])
def test_launch_sweep_refuses_non_finite_and_out_of_range_numbers_itself(tmp_path, sweep, options, key):
    """The library's own bound checks (not only the CLI's): NaN compares false with every bound, so
    ``budget=nan`` once submitted the runs."""
    from diffsweep.launch.api import SweepTarget, launch_sweep
    from diffsweep.sweep import load_sweep

    target = SweepTarget(spec=load_sweep(sweep), executor="local")
    with untouched(tmp_path), pytest.raises(ConfigError) as exc:
        launch_sweep(target, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", **options)
    assert exc.value.key == key


def test_doctor_refuses_a_file_as_out(tmp_path):
    (tmp_path / "afile").write_text("x\n")
    for out, needle in (("afile", "is not a directory"), ("afile/sub", "which is not one")):
        with untouched(tmp_path):
            r = diffsweep("doctor", "--executor", "local", "--out", out, cwd=tmp_path, env=STORE)
        refused(r, "--out", needle)


def test_doctor_refuses_a_bad_timeout(tmp_path):
    from diffsweep.launch.doctor.checks import check_doctor_options

    with untouched(tmp_path):
        r = diffsweep("doctor", "--executor", "local", "--timeout", "0", cwd=tmp_path, env=STORE)
    refused(r, "--timeout")
    for bad in (math.nan, math.inf, 0.5):
        with pytest.raises(ConfigError) as exc:
            check_doctor_options(tmp_path, bad)
        assert exc.value.key == "timeout_s"


def test_a_passing_doctor_leaves_no_folder_it_made(tmp_path):
    """The runs directory doctor checks is made for the check and removed again when all pass."""
    (tmp_path / "store").mkdir()
    with untouched(tmp_path):
        r = diffsweep("doctor", "--executor", "local", "--out", "new/runs", cwd=tmp_path, env=STORE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checks passed" in r.stdout


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("old", "new", "key"), [
    ("max_time_hours: 48 ", "max_time_hours: .inf", "max_time_hours"),
    ("memory_gb: 80", "memory_gb: .inf", "gpu.memory_gb"),
    ("peak_tflops: 989", "peak_tflops: .inf", "gpu.peak_tflops"),
    ("mfu: 0.40", "mfu: .nan", "gpu.mfu"),
])
def test_a_profile_with_a_non_finite_number_is_refused(tmp_path, sweep, old, new, key):
    """``.inf`` once passed the profile's positive-number check and ended in an OverflowError."""
    text = (REPO / "slurm/profiles/h100-example.yaml").read_text()
    assert old in text
    (tmp_path / "p.yaml").write_text(text.replace(old, new))
    with untouched(tmp_path):
        r = diffsweep("plan", str(sweep), "--profile", "p.yaml", cwd=tmp_path, env=STORE)
    refused(r, f"p.yaml: {key}", "expected a positive")
