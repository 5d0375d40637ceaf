"""The run directory's records (``diffsweep.rundir``): ``run.json`` and ``job.json`` are typed
records, written by one writer and read back strictly; readers for ``status`` show what they can."""

from __future__ import annotations

import json

import pytest

from diffsweep.config import ConfigError
from diffsweep.rundir import (
    JobRecord,
    RunRecord,
    read_job_state,
    read_run_file,
    run_info,
    write_job_state,
    write_run_file,
)


def test_records_round_trip_and_leave_out_what_is_unset(tmp_path):
    write_run_file(tmp_path, "abc", "sqlite:///m.db", "k1")
    assert read_run_file(tmp_path) == run_info(tmp_path) == RunRecord("abc", "sqlite:///m.db", "k1")
    write_job_state(tmp_path, "running", job_id="12_0", starts=2, pid=7, step=3, total=10, seconds_per_step=0.25)
    job = read_job_state(tmp_path)
    assert (job.state, job.job_id, job.starts, job.pid, job.step, job.total, job.seconds_per_step) == \
        ("running", "12_0", 2, 7, 3, 10, 0.25)
    assert job.updated and job.host and job.reason is None and job.evaluated == ()
    written = json.loads((tmp_path / "job.json").read_text())
    assert "reason" not in written and "evaluated" not in written  # unset fields are not written
    write_job_state(tmp_path, "finished", step=10, run_id="abc", evaluated=["outliers"])
    assert read_job_state(tmp_path).evaluated == ("outliers",)


def test_a_field_the_record_does_not_have_is_refused_when_written():
    with pytest.raises(TypeError):
        JobRecord(state="running", stepz=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(("text", "why"), [
    ("", "not a readable run record"),
    ("[1, 2]", "expected a run record (a JSON object), got [1, 2]"),
    ('{"run_id": "a"}', "tracking_uri: is required"),
    ('{"run_id": "a", "tracking_uri": "b", "runid": "c"}', "runid: unknown field (did you mean 'run_id'?)"),
])
def test_a_damaged_run_json_is_one_error_naming_the_file_and_the_field(tmp_path, text, why):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_run_file(tmp_path)
    assert caught.value.key == str(tmp_path / "run.json") and why in caught.value.message, caught.value
    assert "restore it, or delete it" in caught.value.message
    assert run_info(tmp_path) is None  # status shows what it can instead


def test_missing_or_unreadable_job_records_read_as_none(tmp_path):
    assert read_job_state(tmp_path) is None and read_run_file(tmp_path) is None
    (tmp_path / "job.json").write_text('{"state": "running", "step": "three"}')
    assert read_job_state(tmp_path) is None


def test_a_code_snapshot_records_its_checkout_and_a_checkout_has_no_record(tmp_path):
    from diffsweep.rundir import SnapshotRecord, read_snapshot_record, write_snapshot_record

    assert read_snapshot_record(tmp_path) is None
    write_snapshot_record(tmp_path, "0123abc", "false")
    assert read_snapshot_record(tmp_path) == SnapshotRecord("0123abc", "false")
