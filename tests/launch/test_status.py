"""What a user reads about a launched sweep: pending runs with Slurm's reason and job ids, the
resources as submitted, ``launch --wait``'s progress lines, ``logs`` of every attempt (and of runs
with no logs yet), the recorded reason of a run stopped by a stray signal, orphaned runs, and which
names ``logs`` accepts. Slurm tests run on the localhost cluster (see tests/launch/test_slurm.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from diffsweep.rundir import read_job_state
from diffsweep.train.checkpoint import list_checkpoints
from tests.helpers.cli import run as cli
from tests.helpers.held import StepHold
from tests.launch.conftest import (
    TINY_SET,
    held,
    held_at,
    ledger,
    pending,
    require_slurm,
    training,
    wait_for,
    write_sweep,
)
from tests.launch.slurm_jobs import squeue_ids


@pytest.fixture
def scancel_after():
    """Register a sweep directory; its Slurm jobs are cancelled when the test ends, passed or not
    (a failed test must not leave jobs holding the shared cluster)."""
    outs: list[Path] = []
    yield outs.append
    for out in outs:
        if (out / "ledger.json").is_file():
            ids = [a["job_id"] for e in ledger(out)["entries"].values() for a in e["attempts"] if a["job_id"]]
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)


def zip_sweep(path: Path, dataset: Path, kinds: list[str], steps: list[int], extra: str = "") -> Path:
    """A sweep whose runs differ in kind and length (paired axes)."""
    settings = {**TINY_SET, "data.path": str(dataset), "train.checkpoint_every": 500, "train.keep_checkpoints": 2,
                "train.log_every": 100, "train.eval_every": 1000}
    lines = ["name: t", "set:"] + [f"  {k}: {v}" for k, v in settings.items()]
    lines += ["zip:", f"  - {{model.attention.kind: [{', '.join(kinds)}], train.max_steps: {steps}}}"]
    path.write_text("\n".join(lines) + "\n" + extra)
    return path


def status(sweep: Path, cwd: Path, env: dict, *extra: str) -> dict:
    r = cli("status", str(sweep), "--json", *extra, cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def rows(data: dict) -> dict:
    return {row["name"]: row for row in data["runs"]}


STAMP = r"\[\d\d:\d\d:\d\d\] "  # launch --wait's time at the start of each line


@pytest.mark.slurm
def test_pending_runs_submitted_resources_and_wait_progress_on_slurm(tmp_path, text_dataset, store, scancel_after):
    """Two runs, one at a time; the second waits in Slurm (held, so it waits as long as the test
    needs). status shows it pending with Slurm's reason and its array task, logs says it has no
    logs yet, status under another profile still shows what was submitted, and launch --wait
    prints queued vs running, a running run's step and every state change as plain lines.

    The one that runs is long and cancelled by the test: a short one could finish before status
    or --wait ever saw it running (it did on a fast CI machine). It is held (SIGSTOP) once it has
    trained a step: still running to Slurm, using no CPU while status is read."""
    require_slurm()
    kinds = {"diff_v1": 5000, "diff_v2": 20}  # the long one is cancelled
    sweep = zip_sweep(tmp_path / "t.yaml", text_dataset, list(kinds), list(kinds.values()),
                      extra="launch: {profile: localhost, max_parallel: 1}\n")
    long, second = "diff_v1-tiny-xs-steps_5000-s0", "diff_v2-tiny-xs-steps_20-s0"
    out = tmp_path / "runs" / "t"
    scancel_after(out)
    hold = StepHold(tmp_path / "hold", 2)  # the short second run waits at step 2 until --wait has seen it running
    waiting = subprocess.Popen([sys.executable, "-m", "diffsweep", "launch", str(sweep), "--wait"], cwd=tmp_path,
                               env={**os.environ, **store, **hold.env()}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in waiting.stdout:
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: (out / "ledger.json").is_file() and len(ledger(out)["entries"]) == 2, 120, "the ledger")
        jobs = {e["name"]: e["attempts"][0]["job_id"] for e in ledger(out)["entries"].values()}
        dirs = {e["name"]: out / "runs" / f"{e['name']}-{e['key']}" for e in ledger(out)["entries"].values()}
        assert jobs[second].endswith("_1")  # the array's second task waits for a free slot (array_parallelism 1)
        subprocess.run(["scontrol", "uhold", jobs[second]], check=True, capture_output=True)

        def one_running():
            s = status(sweep, tmp_path, store)
            return s if s["counts"] == {"pending": 1, "running": 1} else None

        pid = wait_for(lambda: training(dirs[long]), 480, f"{long} to train")["pid"]
        with held(pid):
            pending_row = rows(wait_for(one_running, 120, "one running, one pending"))[second]
            assert (pending_row["state"], pending_row["job_id"], pending_row["detail"]) == (
                "pending", jobs[second], "JobHeldUser")
            step_line = re.compile(rf"  {long}: step \d+/5000 \(\d+%\), ~(<1 min|\d+ min|\d+:\d\d h) left")
            wait_for(lambda: any(step_line.fullmatch(line) for line in list(lines)), 300, "a step line from --wait")
            table = cli("status", str(sweep), cwd=tmp_path, env=store).stdout
            assert re.search(rf"{re.escape(jobs[second])}\s*│\s*pending \(JobHeldUser\)", table), table
            assert "RUNNING" not in table  # a running run shows its step, not Slurm's word for it
            r = cli("logs", second, cwd=tmp_path, env=store)
            assert r.returncode == 0, r.stderr
            assert r.stdout.splitlines()[-1] == f"{second}: job {jobs[second]} is pending (JobHeldUser); no logs yet"

            # another profile would ask for other resources; status shows what the jobs asked for
            big = tmp_path / "big.yaml"
            big.write_text("executor: slurm\ngpus_per_node: 2\ncpus_per_gpu: 1\nmem_per_gpu_gb: 7\n"
                           "min_time_minutes: 90\nexecutor_params: {partition: debug}\n")
            for row in status(sweep, tmp_path, store, "--profile", str(big))["runs"]:
                assert (row["resources_source"], row["submitted_profile"]) == ("submitted", "localhost")
                assert (row["gpus"], row["time_min"], row["mem_gb"]) == (1, 60, 2)
            table = cli("status", str(sweep), "--profile", str(big), cwd=tmp_path, env=store).stdout
            assert table.count("1 GPU, 1:00 h, 2 GB") == 2 and "1:30 h" not in table
        r = cli("cancel", str(sweep), "--only", "^diff_v1-", cwd=tmp_path, env=store)
        assert r.returncode == 0 and f"cancelled {long}" in r.stdout, r.stdout + r.stderr
        hold.release(pid)  # it stops at the step it is held at (or before it)
        subprocess.run(["scontrol", "release", jobs[second]], check=True, capture_output=True)
        running = re.compile(rf"{STAMP}{re.escape(second)}: pending -> running$")
        wait_for(lambda: any(running.match(line) for line in list(lines)), 300, f"--wait to see {second} running")
        hold.release()
        assert waiting.wait(timeout=600) == 1  # not every run finished: one was cancelled
    finally:
        if waiting.poll() is None:
            waiting.kill()
    reader.join(timeout=10)
    stdout, stderr = "\n".join(lines), waiting.stderr.read()
    assert stderr.endswith(f"error: not every run finished (1 done, 1 cancelled); see `diffsweep status {sweep}`\n")
    assert "submitted 2 runs as Slurm array" in stdout
    stamp = STAMP
    assert re.search(rf"^{stamp}1 pending, 1 running; ETA ~", stdout, re.M), stdout  # queued is not running
    for change in (f"{long}: running -> cancelled", f"{second}: pending -> running",
                   f"{second}: running -> done (20 steps)"):
        assert re.search(rf"^{stamp}{re.escape(change)}", stdout, re.M), (change, stdout)
    assert re.fullmatch(rf"{stamp}1 done, 1 cancelled", lines[-1]), stdout


@pytest.mark.slurm
def test_a_stray_sigterm_shows_its_reason_and_logs_show_every_attempt_and_requeue(tmp_path, text_dataset, store,
                                                                                  scancel_after):
    """Preempted with USR2 (Slurm requeues the same job: a second start in the same log files),
    then killed by a stray SIGTERM (saved and stopped, Slurm says FAILED): status shows the
    job's reason, launch resubmits it (attempt 2). logs shows the latest attempt, --attempt 1 the
    first with both starts marked, --attempt all both; the MLflow run name finds it too. The
    first start waits at step 20 (a checkpoint, ``StepHold``) for the preemption."""
    require_slurm()
    steps = 150
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=steps, kinds=("diff_v1",),
                        extra="launch: {profile: localhost}\n")
    sweep.write_text(sweep.read_text().replace("train.checkpoint_every: 2", "train.checkpoint_every: 20"))
    out = tmp_path / "runs" / "t"
    scancel_after(out)
    hold = StepHold(tmp_path / "hold", 20)
    assert cli("launch", str(sweep), cwd=tmp_path, env=store | hold.env()).returncode == 0
    (entry,) = ledger(out)["entries"].values()
    name, job_id = entry["name"], entry["attempts"][0]["job_id"]
    run_dir = out / "runs" / f"{name}-{entry['key']}"
    (pid,) = hold.wait(timeout=300)
    assert list_checkpoints(run_dir / "checkpoints")
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True)  # preemption: Slurm requeues the job
    wait_for(lambda: hold.signalled(pid), 120, "the job to handle USR2", poll=0.05)
    hold.release()

    job = wait_for(lambda: training(run_dir, starts=2), 300, "the requeued job to train", poll=0.05)
    os.kill(job["pid"], signal.SIGTERM)  # not diffsweep's cancel: e.g. an administrator's kill

    def failed():
        row = status(sweep, tmp_path, store)["runs"][0]
        return row if row["state"] == "failed" else None

    # the job leaves Slurm's queue (a cheap question asked often), then status says why
    wait_for(lambda: job_id not in squeue_ids(), 300, f"job {job_id} to end")
    row = wait_for(failed, 120, "the run to fail")
    assert re.fullmatch(r"stopped by SIGTERM at step \d+ after saving a checkpoint; launch the sweep again to "
                        r"resume", row["detail"]), row
    assert "failed (stopped by SIGTERM at step" in cli("status", str(sweep), cwd=tmp_path, env=store).stdout

    r = cli("launch", str(sweep), cwd=tmp_path, env=store)  # resubmittable: it resumes from its checkpoint
    assert r.returncode == 0 and "submitted 1 runs" in r.stdout, r.stdout + r.stderr
    wait_for(lambda: (job := read_job_state(run_dir)) and job.state == "finished", 300, "the run to finish")
    wait_for(lambda: status(sweep, tmp_path, store)["counts"] == {"done": 1}, 120, "status to say done")
    second = ledger(out)["entries"][entry["key"]]["attempts"][1]["job_id"]

    latest = cli("logs", name, cwd=tmp_path, env=store).stdout
    assert latest.startswith(f"==> {name} ({entry['key']}), attempt 2 of 2: slurm job {second}, submitted ")
    assert f"; now done ({steps} steps) <==" in latest.splitlines()[0]
    assert f"finished {steps} steps" in latest and "preempted by SIGTERM" not in latest
    first = cli("logs", name, "--attempt", "1", cwd=tmp_path, env=store).stdout
    assert first.startswith(f"==> {name} ({entry['key']}), attempt 1 of 2: slurm job {job_id}, submitted ")
    starts = [line for line in first.splitlines() if line.startswith(f"==> diffsweep: job {job_id} started")]
    # each start is marked in stdout and in stderr; the second one after Slurm's requeue
    assert [line.endswith(", start 2 (after 1 requeue) <==") for line in starts] == [False, True, False, True], first
    assert "preempted by SIGUSR2" in first and "preempted by SIGTERM" in first and "--- stderr (" in first
    both = cli("logs", name, "--attempt", "all", cwd=tmp_path, env=store).stdout
    assert both.index("attempt 1 of 2") < both.index("attempt 2 of 2")
    r = cli("logs", name, "--attempt", "3", cwd=tmp_path, env=store)
    assert (r.returncode, r.stderr) == (2, (f"error: --attempt: expected a number from 1 to 2 (the attempts of {name}) "
                                           "or 'all', got '3'\n"))

    from mlflow.tracking import MlflowClient

    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    mlflow_name = MlflowClient(store["MLFLOW_TRACKING_URI"]).get_run(run_id).info.run_name
    assert mlflow_name != name
    r = cli("logs", mlflow_name, cwd=tmp_path, env=store)
    assert r.returncode == 0 and r.stdout == latest, r.stderr


def test_orphaned_runs_are_shown_and_cancelled_and_names_in_several_sweeps(tmp_path, text_dataset, store):
    """A row renamed with a new config (an lr added) leaves its launched run orphaned: plan and
    status show it with what to do, launch says it leaves it alone, and cancel --only KEY stops it
    while it runs (held: see tests/launch/test_local.py). A name found in two sweeps makes logs ask
    for --sweep."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=12, kinds=("transformer",))
    out = tmp_path / "runs" / "t"
    hold = StepHold(tmp_path / "hold", 2)
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store | hold.env()).returncode == 0
    (old,) = ledger(out)["entries"].values()
    with held_at(hold) as pid:
        sweep.write_text(sweep.read_text() + "  train.lr: [0.002]\n")  # renames the row, with a new key

        data = json.loads(cli("plan", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store).stdout)
        (new,) = data["runs"]
        assert (new["name"], new["state"]) == ("transformer-tiny-xs-lr_0.002-s0", "new")
        (orphan,) = data["orphaned"]
        assert (orphan["key"], orphan["name"], orphan["successor"]) == (old["key"], "transformer-tiny-xs-s0", None)
        assert orphan["state"] == "running"
        table = cli("status", str(sweep), "--executor", "local", cwd=tmp_path, env=store).stdout
        assert "1 launched runs that the sweep no longer makes (orphaned)" in table and old["key"] in table
        assert f"diffsweep cancel {sweep} --only KEY" in " ".join(table.split()) and "; 1 orphaned;" in table
        r = cli("launch", str(sweep), "--executor", "local", "--dry-run", cwd=tmp_path, env=store)
        assert f"orphaned transformer-tiny-xs-s0 ({old['key']}, " in r.stdout and "left as it is" in r.stdout

        r = cli("cancel", str(sweep), "--executor", "local", "--only", old["key"], cwd=tmp_path, env=store)
        assert r.returncode == 0 and "cancelled transformer-tiny-xs-s0\ncancelled 1 runs" in r.stdout, \
            r.stdout + r.stderr
        wait_for(lambda: pending(pid, signal.SIGTERM), 60, "the cancel's SIGTERM to reach the job", poll=0.05)
    wait_for(lambda: status(sweep, tmp_path, store, "--executor", "local")["orphaned"][0]["state"] == "cancelled",
             120, "the orphan to stop")

    # a second sweep with a run of the same name
    other = write_sweep(tmp_path / "u.yaml", text_dataset, steps=3, kinds=("transformer",), name="u")
    r = cli("launch", str(other), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^\[.*\] transformer-tiny-xs-s0: (pending|running) -> done \(3 steps\)$", r.stdout, re.M), r.stdout
    assert r.stdout.rstrip().endswith("] 1 done")
    r = cli("logs", "transformer-tiny-xs-s0", cwd=tmp_path, env=store)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "is a run of several sweeps: t (" in r.stderr and "u (" in r.stderr
    assert r.stderr.rstrip().endswith("pick one with --sweep SWEEP.yaml")
    r = cli("logs", "transformer-tiny-xs-s0", "--sweep", str(other), cwd=tmp_path, env=store)
    assert r.returncode == 0 and "attempt 1 of 1" in r.stdout and "finished 3 steps" in r.stdout, r.stderr


def test_cancel_of_a_sweep_never_launched_is_refused_and_creates_nothing(tmp_path, text_dataset):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("cancel", str(sweep), "--executor", "local", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (f"error: {sweep}: sweep t was never launched (no ledger in {tmp_path / 'runs' / 't'}); "
                        "nothing to cancel\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]


def test_logs_of_a_run_waiting_in_the_local_queue(tmp_path, text_dataset, store):
    """One run at a time: the second waits in the local queue (the first is held running: see
    tests/launch/test_local.py), and logs says so (exit 0)."""
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=12, extra="launch: {max_parallel: 1}\n")
    hold = StepHold(tmp_path / "hold", 2)
    assert cli("launch", str(sweep), "--executor", "local", cwd=tmp_path, env=store | hold.env()).returncode == 0
    with held_at(hold) as pid:
        s = status(sweep, tmp_path, store, "--executor", "local")
        assert sorted(r["state"] for r in s["runs"]) == ["pending", "running"], s
        queued = max(s["runs"], key=lambda r: r["key"])  # the queue starts runs in key order, one at a time
        assert (queued["state"], queued["detail"], queued["job_id"]) == ("pending", "local queue", None)
        r = cli("logs", queued["name"], cwd=tmp_path, env=store)
        assert r.returncode == 0, r.stderr
        head, message = r.stdout.splitlines()
        assert head.startswith(f"==> {queued['name']} ({queued['key']}), attempt 1 of 1: local (queued), submitted ")
        assert head.endswith("; now pending (local queue) <==")
        assert message == f"{queued['name']}: waiting in the local queue; no logs yet"
        assert cli("cancel", str(sweep), "--executor", "local", cwd=tmp_path, env=store).returncode == 0
        wait_for(lambda: pending(pid, signal.SIGTERM), 60, "the cancel's SIGTERM to reach the job", poll=0.05)
    wait_for(lambda: not {"pending", "running"} & set(status(sweep, tmp_path, store, "--executor", "local")["counts"]),
             120, "the runs to stop")


def test_a_ledger_from_before_resources_were_recorded_still_reads(tmp_path):
    """Attempts written before ``profile``/``resources`` existed: read, shown with the estimate."""
    from diffsweep.launch.ledger import read_ledger
    from diffsweep.launch.plan import submitted_resources

    old = {"executor": "slurm", "submitted": "2025-01-01T00:00:00+00:00", "code_dir": "c", "folder": "f",
           "job_id": "12_0", "state": "submitted", "stdout": "o", "stderr": "e", "reconciled": None,
           "queue_pid": None, "queue_start": None, "job_start": None}
    (tmp_path / "ledger.json").write_text(json.dumps({
        "format": "diffsweep-ledger/1", "sweep": "t", "experiment": "t", "tracking_uri": "sqlite:///x.db",
        "entries": {"abc": {"key": "abc", "name": "n", "run_dir": "d", "identity": {}, "attempts": [old],
                            "mlflow_run_id": None}}}))
    entry = read_ledger(tmp_path).entries["abc"]
    assert (entry.latest.profile, entry.latest.resources) == (None, None)
    assert submitted_resources(entry) is None
    entry.latest.profile, entry.latest.resources = "localhost", {"nodes": 1, "gpus_per_node": 1, "tasks_per_node": 1,
                                                                 "cpus_per_task": 1, "mem_gb": 2, "time_min": 60}
    resources, profile = submitted_resources(entry)
    assert (resources.describe(), profile) == ("1 GPU, 1:00 h, 2 GB", "localhost")
