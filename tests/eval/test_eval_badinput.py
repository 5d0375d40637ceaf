"""Bad input to ``diffsweep eval`` as a user meets it: one ``error:`` line naming what to fix, exit 2,
no traceback, and nothing created, changed or deleted (no MLflow store or run, no files in the run
directory or beside the target)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.badinput import diffsweep, refused, untouched

# The session's trained run is trained once, by the worker of test_runner and test_downstream.
pytestmark = pytest.mark.xdist_group("trained_run")

# --probe-set items and flags refused on a real trained run (the session's tiny DIFF V1 run):
# (arguments after the target, what the error line names)
ON_A_RUN = [
    (["--probe", "nosuch"], ["--probe", "nosuch", "outliers"]),
    ([], ["--probe", "expected at least one probe"]),
    (["--probe", "outliers", "--probe-set", "outliers.tokns=2"], ["outliers.tokns", "did you mean 'tokens'"]),
    (["--probe", "outliers", "--probe-set", "outliers"], ["--probe-set", "PROBE.KEY=VALUE"]),
    (["--probe", "outliers", "--probe-set", "needle.samples=2"], ["--probe-set", "not asked for"]),
    (["--probe", "outliers", "--probe-set", "outliers.tokens=abc"], ["outliers.tokens", "integer"]),
    (["--probe", "outliers", "--probe-set", "outliers.tokens=1.5"], ["outliers.tokens", "integer"]),
    (["--probe", "needle", "--probe-set", "needle.allow_longer=maybe"], ["needle.allow_longer", "true or false"]),
    (["--probe", "needle", "--probe-set", "needle.depths=[nan]"], ["needle.depths", "finite"]),
    (["--probe", "nll_position", "--probe-set", "nll_position.rope_theta=nan"], ["nll_position.rope_theta", "finite"]),
    (["--probe", "nll_position", "--probe-set", "nll_position.rope_theta=inf"], ["nll_position.rope_theta", "finite"]),
    (["--probe", "outliers", "--probe-set", "outliers.tokens=-5"], ["outliers.tokens", "positive", "-5"]),
    (["--probe", "outliers", "--probe-set", "outliers.micro_batch=0"], ["outliers.micro_batch", "positive"]),
    (["--probe", "needle", "--probe-set", "needle.samples=0"], ["needle.samples", "positive"]),
    (["--probe", "attention_focus", "--probe-set", "attention_focus.context=-5"], ["attention_focus.context", "-5"]),
    (["--probe", "attention_focus", "--probe-set", "attention_focus.depths=[]"], ["attention_focus.depths"]),
    (["--probe", "nll_position", "--probe-set", "nll_position.documents=0"], ["nll_position.documents", "positive"]),
    (["--probe", "quantization", "--probe-set", "quantization.granularity=channel"],
     ["quantization.granularity", "tensor", "head", "row", "channel"]),
    (["--probe", "quantization", "--probe-set", "quantization.bits=[4, 32]"], ["quantization.bits", "2..16"]),
    (["--probe", "outliers", "--only", "diff"], ["--only", "sweep YAML"]),
    (["--probe", "outliers", "--launch"], ["--launch", "sweep YAML"]),
    (["--probe", "outliers", "--wait"], ["--wait", "--launch"]),
]


def _store_folder(uri: str) -> Path:
    return Path(uri.removeprefix("sqlite:///")).parent


@pytest.mark.parametrize("args, needles", ON_A_RUN, ids=[" ".join(a) or "no-probe" for a, _ in ON_A_RUN])
def test_bad_settings_and_flags_on_a_run(args, needles, trained_run, mlflow_store, tmp_path):
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    with untouched(tmp_path), untouched(trained_run), untouched(_store_folder(mlflow_store)):
        r = diffsweep("eval", str(trained_run), *args, cwd=tmp_path, env=env)
    refused(r, *needles)


def _targets(root: Path) -> dict[str, Path]:
    """Things that are not a run, a checkpoint or a sweep."""
    (root / "notes.txt").write_text("not a run\n")
    (root / "config.yaml").write_text("model: {size: tiny-xs}\n")  # a run config, not a sweep
    (root / "empty").mkdir()
    return {"missing": root / "nosuch", "missing-yaml": root / "nosuch.yaml", "text-file": root / "notes.txt",
            "config-yaml": root / "config.yaml", "empty-folder": root / "empty"}


@pytest.mark.parametrize("which, needles", [
    ("missing", ["nosuch", "not found"]),
    ("missing-yaml", ["nosuch.yaml", "not found"]),
    ("text-file", ["notes.txt", "not a sweep YAML"]),
    ("config-yaml", ["config.yaml", "model", "unknown sweep key"]),
    ("empty-folder", ["empty", "has no checkpoint"]),
])
def test_a_target_that_is_no_run_checkpoint_or_sweep(which, needles, tmp_path):
    target = _targets(tmp_path)[which]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    with untouched(tmp_path):
        r = diffsweep("eval", str(target), "--probe", "outliers", cwd=tmp_path, env=env)
    refused(r, *needles)


def test_json_is_not_for_launch(tmp_path, text_dataset):
    from tests.launch.conftest import write_sweep

    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    for extra, needles in ((["--launch", "--json"], ["--json", "--launch"]), (["--launch", "--force"], ["--force"])):
        with untouched(tmp_path):
            r = diffsweep("eval", str(sweep), "--probe", "outliers", *extra, "--executor", "local", cwd=tmp_path,
                          env=env)
        refused(r, *needles)
