"""The sweep ledger is a file users can edit: it is read with the one strict decoder, so a bad
field is named with its path, and what ``write_ledger`` wrote reads back equal."""

from __future__ import annotations

import json

import pytest

from diffsweep.config import ConfigError
from diffsweep.launch.ledger import FORMAT, Attempt, Entry, Ledger, read_ledger, write_ledger

ATTEMPT = {"executor": "local", "submitted": "2026-11-24T00:00:00", "code_dir": "c", "folder": "f"}
ENTRY = {"key": "k", "name": "n", "run_dir": "r", "identity": {"model.size": "tiny-xs"}}


def _write(tmp_path, entries):
    (tmp_path / "ledger.json").write_text(json.dumps({"format": FORMAT, "sweep": "s", "experiment": "e",
                                                      "tracking_uri": "u", "entries": entries}))


def test_round_trip(tmp_path):
    ledger = Ledger(sweep="s", experiment="e", tracking_uri="u", entries={
        "k": Entry(**ENTRY, attempts=[Attempt(**ATTEMPT, job_id="12_0", queue_pid=7, resources={"gpus": 1})])})
    write_ledger(tmp_path, ledger)
    assert read_ledger(tmp_path) == ledger
    _write(tmp_path, {"k": ENTRY})  # attempts default to none
    assert read_ledger(tmp_path).entries["k"].attempts == []


@pytest.mark.parametrize("attempt, where", [
    ({**ATTEMPT, "job_id": True}, "entries.k.attempts[0].job_id: expected a string, got True"),
    ({**ATTEMPT, "queue_pid": "7"}, "entries.k.attempts[0].queue_pid: expected"),
    ({**ATTEMPT, "bogus": 1}, "entries.k.attempts[0].bogus: unknown"),
    ({k: v for k, v in ATTEMPT.items() if k != "folder"}, "entries.k.attempts[0].folder"),
])
def test_a_bad_field_is_named_by_its_path(tmp_path, attempt, where):
    _write(tmp_path, {"k": {**ENTRY, "attempts": [attempt]}})
    with pytest.raises(ConfigError) as caught:
        read_ledger(tmp_path)
    assert caught.value.key == str(tmp_path / "ledger.json")
    assert caught.value.message.startswith(f"unreadable sweep ledger ({where}"), caught.value.message
