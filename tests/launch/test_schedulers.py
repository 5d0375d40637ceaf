"""The scheduler interface: a scheduler is one class plus its registration, and the launcher asks
it instead of branching on its name. A fake scheduler registered here is planned, estimated,
asked for states and cancelled without any code knowing its name; an unknown name fails with
the list of known ones (it is never taken for Slurm)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from diffsweep.config import ConfigError
from diffsweep.launch import scheduler as schedulers
from diffsweep.launch.ledger import Attempt, Entry, Ledger
from diffsweep.launch.profile_choice import choose_profile, parse_profile, with_overrides
from diffsweep.launch.profiles import Profile
from diffsweep.launch.resources import estimate_resources
from diffsweep.launch.scheduler import Scheduler, get_scheduler, register, scheduler_names
from diffsweep.launch.state import attempt_state, scheduler_states
from diffsweep.sweep import expand, load_sweep


class FakeScheduler(Scheduler):
    """A cluster that reserves resources and reports every job as pending."""

    name = "fake"
    label = "the fake cluster"
    runs_jobs = "on the fake cluster"
    asked: ClassVar[list[list[str]]] = []
    cancelled: ClassVar[list[list[str]]] = []

    def default_profile(self) -> Profile:
        return Profile(name="fake", executor=self.name, gpus_per_node=4)

    def parameter_names(self) -> frozenset[str]:
        return frozenset({"queue"})

    def submit(self, submission):
        raise AssertionError("not submitted in these tests")

    def states(self, attempts):
        FakeScheduler.asked.append(sorted(a.job_id for a in attempts))
        return {a.job_id: "PENDING (Priority)" for a in attempts}

    def cancel(self, attempts):
        FakeScheduler.cancelled.append(sorted(a.job_id for a in attempts))
        return {}, ""


@pytest.fixture
def fake():
    register("fake", FakeScheduler)
    FakeScheduler.asked.clear()
    yield get_scheduler("fake")
    schedulers.SCHEDULERS.unregister("fake")


def sweep(tmp_path: Path):
    path = tmp_path / "s.yaml"
    path.write_text("grid: {model.size: [tiny-xs]}\n")
    return load_sweep(path)


def attempt(executor: str, job_id: str | None = "7", **kw) -> Attempt:
    return Attempt(**{"executor": executor, "submitted": "t", "code_dir": "c", "folder": "f", "job_id": job_id, **kw})


def test_builtin_schedulers_are_registered_in_order():
    assert scheduler_names()[:2] == ["slurm", "local"]
    assert get_scheduler("slurm").label == "Slurm" and get_scheduler("local").label == "the local queue"


def test_an_unknown_scheduler_is_an_error_listing_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as caught:
        choose_profile(sweep(tmp_path), None, "pbs")
    assert (caught.value.key, caught.value.message) == ("executor", "unknown scheduler 'pbs'; expected one of [slurm, local]")
    with pytest.raises(ConfigError) as caught:
        parse_profile({"executor": "pbs"}, "p.yaml", "p")
    assert caught.value.key == "p.yaml: executor"


def test_a_ledger_naming_an_unknown_scheduler_is_an_error_not_slurm(tmp_path):
    ledger = Ledger(sweep="s", experiment="e", tracking_uri="u",
                    entries={"k": Entry(key="k", name="n", run_dir=str(tmp_path), identity={},
                                        attempts=[attempt("pbs", "12")])})
    with pytest.raises(ConfigError, match=r"unknown scheduler 'pbs'; expected one of \[slurm, local\]"):
        scheduler_states(ledger)


def test_a_registered_scheduler_is_chosen_estimated_and_asked_by_name(tmp_path, fake):
    spec = sweep(tmp_path)
    profile = choose_profile(spec, None, "fake")
    assert profile.executor == "fake" and profile.gpus_per_node == 4
    e = estimate_resources(expand(spec).runs[0], profile, reserves=get_scheduler(profile.executor).reserves_resources)
    assert e.resources.gpus == 1 and e.resources.mem_gb > 0  # it reserves resources, unlike local
    assert with_overrides(profile, ["queue=short"], None).executor_params == {"queue": "short"}
    with pytest.raises(ConfigError, match="does not accept this parameter"):
        with_overrides(profile, ["partition=gpu"], None)
    entries = {k: Entry(key=k, name=k, run_dir=str(tmp_path / k), identity={}, attempts=[a])
               for k, a in (("a", attempt("fake", "1")), ("b", attempt("local", "999999999", job_start=1)),
                            ("c", attempt("fake", "2")))}
    states = scheduler_states(Ledger(sweep="s", experiment="e", tracking_uri="u", entries=entries))
    assert FakeScheduler.asked == [["1", "2"]]  # one question for all of its jobs; local ones asked locally
    assert states == {"1": "PENDING (Priority)", "2": "PENDING (Priority)", "999999999": "EXITED"}
    assert attempt_state(entries["a"].latest, None, states).detail == "Priority"
    assert attempt_state(attempt("fake", "1"), None, {"1": "CANCELLED"}).detail == "cancelled in the fake cluster"


def test_local_takes_no_job_settings_and_replaces_a_declared_cluster_profile(tmp_path):
    with pytest.raises(ConfigError, match=r"^slurm_overrides: profile local runs jobs on this machine \(executor: local\)"):
        with_overrides(choose_profile(sweep(tmp_path), None, "local"), ["partition=gpu"], None)
    path = tmp_path / "c.yaml"
    path.write_text("launch: {profile: " + str(Path(__file__).resolve().parents[2] / "slurm/profiles/h100-example.yaml")
                    + "}\ngrid: {model.size: [tiny-xs]}\n")
    assert choose_profile(load_sweep(path), None, "local").executor == "local"
    assert choose_profile(load_sweep(path), None, None).name == "h100-example"


def test_logs_are_the_recorded_paths_else_where_submitit_writes_them(tmp_path):
    folder = tmp_path / "jobs" / "12_3"
    folder.mkdir(parents=True)
    (folder / "12_3_0_log.out").write_text("out\n")
    recorded = attempt("slurm", "12_3", folder=str(folder), stdout=str(tmp_path / "x.out"), stderr=None)
    assert get_scheduler("slurm").log_files(recorded) == []  # recorded, not written yet
    (tmp_path / "x.out").write_text("x\n")
    assert get_scheduler("slurm").log_files(recorded) == [tmp_path / "x.out"]
    assert get_scheduler("slurm").log_files(attempt("slurm", "12_3", folder=str(folder))) == [folder / "12_3_0_log.out"]
