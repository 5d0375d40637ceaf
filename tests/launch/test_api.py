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
