"""The sweep commands as a user meets them: plan output, dry runs, changed runs, and bad input
(one line, exit 2, nothing submitted, no ledger or run directory written)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.config.test_bounds import billion_laughs
from tests.helpers.cli import run as cli
from tests.launch.conftest import write_sweep

REPO = Path(__file__).resolve().parents[2]


def test_plan_table_and_json(tmp_path):
    r = cli("plan", str(REPO / "sweeps/table6-ablation.yaml"), "--profile", "h100-example", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "diff_v1-1.4B-hd_128-lam_0.8-s0" in r.stdout and "total: 21 runs" in r.stdout and "GPU-hours" in r.stdout
    r = cli("plan", str(REPO / "sweeps/table6-ablation.yaml"), "--profile", "h100-example", "--json", cwd=tmp_path)
    data = json.loads(r.stdout)
    assert data["counts"] == {"new": 21} and len(data["runs"]) == 21  # 7 rows x 3 seeds
    row = data["runs"][0]
    for key in ("key", "name", "arch", "size", "params", "tokens", "flops", "gpu_hours", "gpus", "time_min", "state"):
        assert key in row
    assert data["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in data["runs"]))
    assert not (tmp_path / "runs").exists()  # plan writes nothing


def test_dry_run_submits_nothing(tmp_path, text_dataset):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--executor", "local", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "would submit transformer-tiny-xs-s0" in r.stdout and "nothing submitted" in r.stdout
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_budget_refuses_the_launch(tmp_path):
    r = cli("launch", str(REPO / "sweeps/table6-ablation.yaml"), "--profile", "h100-example", "--budget", "100",
            "--dry-run", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.startswith("error: --budget: launching 21 runs needs about") and "over the budget of 100.0" in r.stderr


def test_plan_gives_large_runs_several_gpus_from_the_memory_estimate(tmp_path):
    r = cli("plan", str(REPO / "sweeps/fig3a-size-scan.yaml"), "--profile", "h100-example", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    gpus = {run["size"]: run["gpus"] for run in json.loads(r.stdout)["runs"]}
    assert gpus["830M"] == 1 and gpus["13.1B"] == 8  # FSDP over one node's 8 H100s


def test_a_run_that_fits_on_no_gpus_of_the_profile_is_refused(tmp_path):
    small = tmp_path / "small-gpus.yaml"
    small.write_text("executor: slurm\ngpu: {name: T4, memory_gb: 16, peak_tflops: 65, mfu: 0.3}\n"
                     "gpus_per_node: 1\nexecutor_params: {partition: gpu}\n")
    sweep = tmp_path / "ddp.yaml"
    sweep.write_text("grid: {model.size: [830M, 1.4B]}\nset: {train.parallel: ddp}\n")
    r = cli("plan", str(sweep), "--profile", str(small), cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: run transformer-830M-s0: does not fit") and "does not fit on small-gpus's T4 GPUs (16 GB)" in r.stderr
    assert "try train.parallel=fsdp" in r.stderr


BAD = [
    ("grid: {model.size: [tiny-xs]\n", r"t.yaml: not valid YAML (line 2"),
    # input that used to hang for minutes or end in a traceback
    ("grid:\n" + "".join(f"  {k}: {line.split(': ', 1)[1]}\n" for k, line in zip(
        ["train.lr", "train.eps", "train.weight_decay", "train.grad_clip", "train.min_lr", "train.decay_fraction",
         "train.spike_threshold", "model.rope_theta", "model.norm_eps"], billion_laughs().splitlines())),
     "aliases expand to more than 10,000 values"),
    ("grid: &g\n  model.size: [tiny-xs, *g]\n", "alias *g is inside the node it names"),
    ("grid: {model.size: [tiny-xs]}\nseeds: 1000000000\n", "expands to 1,000,000,000 runs"),
    ("grid: {model.d_model: [1099511627776]}\n", "model.d_model: 1099511627776 is over the limit of 262,144 (a model"),
    ("grid: {model.size: [tiny-xs]}\nset: {train.seed: -1}\n", "train.seed: expected an integer in [0, 2**63 - 1]"),
    ("extends: t.yaml\n", "sweeps extend each other in a cycle"),
    ("grid: {model.sise: [tiny-xs]}\n", "grid.model.sise: unknown config key (did you mean 'model.size'?)"),
    ("name: t\n", "empty sweep"),
    ("zip: [{train.lr: [0.1, 0.2], train.warmup_steps: [1]}]\n", "conflicting lengths"),
    ("grid: {model.size: [2B]}\n", "model.size: expected one of [830M"),
    ("grid: {data.path: ['`reboot`']}\n", "contains '`'"),
    ("grid: {model.size: [tiny-xs]}\nlaunch: {profile: nowhere}\n", "unknown profile 'nowhere'"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_bad_sweeps_fail_cleanly(tmp_path, text, message):
    (tmp_path / "t.yaml").write_text(text)
    for command in ("plan", "launch"):
        start = time.monotonic()
        r = cli(command, "t.yaml", "--executor", "local", cwd=tmp_path)
        assert time.monotonic() - start < 15  # a process start on a busy 2-core box, not minutes
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.yaml"]  # no ledger, run dir or store


def test_bad_profile_key_fails_before_anything_is_written(tmp_path, text_dataset):
    (tmp_path / "p.yaml").write_text("executor: slurm\ngpus_per_node: 1\nexecutor_params: {partitoin: debug}\n")
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--profile", str(tmp_path / "p.yaml"), cwd=tmp_path)
    assert r.returncode == 2 and "executor_params.partitoin: submitit's Slurm executor does not accept" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_no_slurm_for_executor_slurm(tmp_path, text_dataset):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    r = cli("launch", str(sweep), "--executor", "slurm", cwd=tmp_path,
            env={"PATH": "/usr/local/nonexistent", "SLURM_CONF": str(tmp_path / "nope.conf")})
    assert r.returncode == 2 and r.stderr.startswith("error: --executor: slurm:"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_missing_dataset_and_bad_only(tmp_path):
    write_sweep(tmp_path / "t.yaml", tmp_path / "no-data")
    r = cli("launch", "t.yaml", "--executor", "local", cwd=tmp_path)
    assert r.returncode == 2 and "is not a prepared dataset" in r.stderr
    r = cli("launch", "t.yaml", "--executor", "local", "--only", "nomatch", cwd=tmp_path)
    assert r.returncode == 2 and "--only: 'nomatch' matches no run" in r.stderr
    r = cli("launch", "t.yaml", "--executor", "local", "--only", "(", cwd=tmp_path)
    assert r.returncode == 2 and "not a valid regular expression" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_renamed_run_keeps_its_directory_and_state_and_a_changed_run_names_the_field(tmp_path, text_dataset, store):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset, steps=3, kinds=("transformer",))
    launched = sweep.read_text()
    r = cli("launch", str(sweep), "--executor", "local", "--wait", cwd=tmp_path, env=store)
    assert r.returncode == 0, r.stdout + r.stderr
    # a new axis renames the existing run (same config, so same key) and adds one
    sweep.write_text(launched + "  train.weight_decay: [0.05, 0.1]\n")
    r = cli("plan", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
    rows = {row["name"]: row for row in json.loads(r.stdout)["runs"]}
    old = rows["transformer-tiny-xs-weight_decay_0.05-s0"]
    assert old["state"] == "done" and old["run_dir"].endswith("transformer-tiny-xs-s0-" + old["key"])
    assert old["mlflow_run_id"] is not None and old["job_id"] is not None
    assert rows["transformer-tiny-xs-weight_decay_0.1-s0"]["state"] == "new"
    r = cli("launch", str(sweep), "--executor", "local", "--dry-run", cwd=tmp_path, env=store)
    assert "would submit transformer-tiny-xs-weight_decay_0.1-s0" in r.stdout and r.stdout.count("would submit") == 1
    # a changed setting: the run of that name is "changed", naming the field
    sweep.write_text(launched.replace("train.warmup_steps: 2", "train.warmup_steps: 1"))
    r = cli("plan", str(sweep), "--executor", "local", "--json", cwd=tmp_path, env=store)
    (row,) = json.loads(r.stdout)["runs"]
    assert (row["state"], row["detail"]) == ("changed", "train.warmup_steps")
    r = cli("plan", str(sweep), "--executor", "local", cwd=tmp_path, env=store)
    assert "changed (train.warmup_steps)" in r.stdout


def test_corrupt_ledger_and_out_that_is_a_file(tmp_path, text_dataset):
    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    (tmp_path / "runs" / "t").mkdir(parents=True)
    for text in ("[]", '{"format": "diffsweep-ledger/1", "entries": []}', "{not json"):
        (tmp_path / "runs" / "t" / "ledger.json").write_text(text)
        for command in ("plan", "status", "launch", "cancel"):
            r = cli(command, str(sweep), "--executor", "local", cwd=tmp_path)
            assert r.returncode == 2 and "unreadable sweep ledger" in r.stderr, (command, text, r.stderr)
    (tmp_path / "file").write_text("x")
    for command in ("plan", "launch", "cancel"):
        r = cli(command, str(sweep), "--executor", "local", "--out", "file", cwd=tmp_path)
        assert r.returncode == 2 and "exists and is not a directory" in r.stderr, r.stderr


def test_concurrent_launches_of_one_sweep_are_refused(tmp_path, text_dataset):
    from diffsweep.launch.submit import launch_lock

    sweep = write_sweep(tmp_path / "t.yaml", text_dataset)
    with launch_lock(tmp_path / "runs" / "t"):
        r = cli("launch", str(sweep), "--executor", "local", cwd=tmp_path)
    assert r.returncode == 2 and "another launch or cancel" in r.stderr
    assert not (tmp_path / "runs" / "t").exists()
