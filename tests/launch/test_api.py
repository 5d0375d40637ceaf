"""The sweep commands' library API: a sweep parsed once (``SweepTarget``) in, typed reports out,
and errors that name the argument at fault (the CLI shows its flag). Nothing here submits a job."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from diffsweep.config import ConfigError
from diffsweep.launch.api import (
    LaunchReport,
    SweepTarget,
    cancel_sweep,
    launch_sweep,
    plan_sweep,
    reconcile_sweep,
    sweep_status,
)
from diffsweep.launch.plan import SweepPlan
from diffsweep.sweep import load_sweep
from tests.launch.conftest import write_sweep


def target(tmp_path: Path, **kw) -> SweepTarget:
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ngrid: {model.size: [tiny-xs, tiny-s]}\n")
    return SweepTarget(spec=load_sweep(path), executor="local", out=tmp_path / "out", **kw)


def test_plan_reconcile_and_status_of_a_sweep_never_launched(tmp_path):
    t = target(tmp_path)
    plan = plan_sweep(t, check=True)
    assert [r.run.size for r in plan.runs] == ["tiny-xs", "tiny-s"] and plan.counts() == {"new": 2}
    assert plan.profile.executor == "local" and plan.out == tmp_path / "out" and plan.ledger is None
    assert reconcile_sweep(t) == []
    seen: list = []
    status = sweep_status(t, on_reconciled=seen.append)
    assert seen == [[]] and status.reconciled == [] and status.plan.counts() == {"new": 2}
    assert not (tmp_path / "out").exists()  # planning writes nothing


def test_only_selects_runs(tmp_path):
    assert [r.run.size for r in plan_sweep(target(tmp_path, only="tiny-s")).runs] == ["tiny-s"]


def test_a_dry_run_reports_the_selection_and_submits_nothing(tmp_path, text_dataset):
    t = SweepTarget(spec=load_sweep(write_sweep(tmp_path / "t.yaml", text_dataset)), executor="local",
                    out=tmp_path / "out")
    planned: list[SweepPlan] = []
    shown: list[LaunchReport] = []
    report = launch_sweep(t, dry_run=True, on_planned=planned.append, on_selected=shown.append,
                          on_reconciled=lambda marked: pytest.fail("a dry run reconciles nothing"))
    assert planned == [report.plan] and shown == [report]
    assert report.dry_run and report.submitted == [] and report.reconciled == []
    assert [r.run.kind for r in report.selection.submit] == ["transformer", "diff_v1"] and report.selection.skip == []
    assert report.where == "the local queue"
    assert report.gpu_hours == sum(r.estimate.gpu_hours for r in report.plan.runs)
    assert not (tmp_path / "out" / "ledger.json").exists()


def test_cancel_refuses_a_sweep_never_launched(tmp_path):
    with pytest.raises(ConfigError):
        cancel_sweep(target(tmp_path))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kw, field", [
    ({"only": "("}, "only"),
    ({"only": "nomatch"}, "only"),
    ({"executor": "pbs"}, "executor"),
])
def test_errors_name_the_argument_not_a_flag(tmp_path, kw, field):
    with pytest.raises(ConfigError) as caught:
        plan_sweep(replace(target(tmp_path), **kw))
    assert caught.value.key == field


def test_a_launch_over_budget_is_refused_by_field(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("name: big\ngrid: {model.size: [1.4B]}\n")
    t = SweepTarget(spec=load_sweep(path), profile="h100-example", out=tmp_path / "out")
    with pytest.raises(ConfigError) as caught:
        launch_sweep(t, dry_run=True, budget=0.001)
    assert caught.value.key == "budget"


def test_run_logs_finds_a_run_and_its_attempts_logs(tmp_path):
    from diffsweep.launch.api import run_logs
    from diffsweep.launch.ledger import Attempt, Entry, Ledger, write_ledger

    out = tmp_path / "runs" / "s"
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "1.out").write_text("step 1 loss 5.0\n")
    (tmp_path / "f" / "1.err").write_text("a warning\n")
    first = Attempt(executor="local", submitted="2026-11-24T00:00:00", code_dir="c", folder=str(tmp_path / "f"),
                    job_id="999999999", state="submitted", stdout=str(tmp_path / "f" / "1.out"),
                    stderr=str(tmp_path / "f" / "1.err"))
    second = replace(first, stdout=str(tmp_path / "f" / "2.out"), stderr=str(tmp_path / "f" / "2.err"))
    write_ledger(out, Ledger(sweep="s", experiment="e", tracking_uri="u", entries={"abc123": Entry(
        key="abc123", name="transformer-tiny-xs-s0", run_dir=str(out / "r"), identity={}, attempts=[first, second])}))

    latest = run_logs("transformer-tiny-xs-s0", out=out)
    assert latest.out == out and latest.entry.key == "abc123"
    assert [a.number for a in latest.attempts] == [2]
    assert latest.attempts[0].files == [] and latest.attempts[0].no_logs  # says why there are none
    every = run_logs("abc", search=tmp_path, attempt="all")  # a key prefix, found under runs/*/
    assert [a.number for a in every.attempts] == [1, 2]
    assert every.attempts[0].files == [tmp_path / "f" / "1.out", tmp_path / "f" / "1.err"]
    assert every.attempts[0].no_logs is None and "1" in every.attempts[0].header
    with pytest.raises(ConfigError):
        run_logs("nosuch", search=tmp_path)
