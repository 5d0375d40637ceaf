"""What ``launch --wait`` prints while it waits (diffsweep/launch/progress.py), from given run
states: the counts, the ETA of runs side by side, each running run's line. (That the numbers come
from the jobs' own reports: tests/launch/test_status.py on Slurm, tests/launch/test_local.py.)"""

from __future__ import annotations

from diffsweep.launch.progress import RunProgress, Snapshot, duration


def test_durations_read_in_minutes_below_an_hour_and_in_hours_above():
    assert [duration(h) for h in (0.0, 0.005, 12 / 60, 59.4 / 60, 65 / 60, 25.5)] == [
        "<1 min", "<1 min", "12 min", "59 min", "1:05 h", "25:30 h"]


def test_the_eta_counts_the_runs_that_train_side_by_side():
    runs = [RunProgress("a", "running", "", 40, 400, hours_left=0.5),
            RunProgress("b", "running", "step 5", 5, 400, hours_left=0.7),
            RunProgress("c", "pending", "queued", None, None, hours_left=0.8),
            RunProgress("d", "done", "", 400, 400, hours_left=0.0)]
    snap = Snapshot(runs)
    assert snap.active and snap.counts == {"pending": 1, "running": 2, "done": 1}
    assert snap.summary() == "1 pending, 2 running, 1 done; ETA ~1:00 h"  # (0.5 + 0.7 + 0.8) h over 2 at once
    assert snap.running_lines() == ["  a: step 40/400 (10%), ~30 min left", "  b: step 5/400 (1%), ~42 min left"]
    ended = Snapshot([runs[3]])
    assert not ended.active and ended.summary() == "1 done"
