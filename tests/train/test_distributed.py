"""Training on several processes as a user runs it: ``torchrun -m diffsweep train`` with two CPU
processes on gloo, DDP and FSDP2, against single-process training of the same global batch; and
checkpoints that resume on a different number of processes.

Real processes throughout: torchrun and its worker processes are what is tested. The launched runs
track to a copy of an empty store (``store``); the one-process references they are compared with are
trained once per module and config (``reference``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from diffsweep.train.checkpoint import checkpoint_path, checkpoint_step, list_checkpoints
from tests.helpers.held import StepHold
from tests.helpers.tracking import mlflow_client
from tests.helpers.training import (
    History,
    assert_same,
    histories,
    only_run,
    process_env,
    reference_histories,
    single,
    tiny,
    torchrun,
)

GROUP_PROBE = Path(__file__).parent / "group_probe"  # a sitecustomize that counts live DDP models at teardown


# One xdist group: the module-scoped references are trained by one worker, not by each.
pytestmark = pytest.mark.xdist_group("distributed")


@pytest.fixture(scope="module")
def reference(text_dataset, tmp_path_factory, mlflow_store) -> Callable[..., dict[str, History]]:
    """``reference(*extra)``: ``reference_histories`` of the tiny run with ``extra``, trained once per
    module (a config shared by several tests is trained once, here, not once per test) into the
    session's store."""
    root = tmp_path_factory.mktemp("reference")
    done: dict[tuple[str, ...], dict[str, History]] = {}

    def get(*extra: str) -> dict[str, History]:
        if extra not in done:
            done[extra] = reference_histories(text_dataset, root / str(len(done)), mlflow_store, *extra)
        return done[extra]
    return get


# 5 validation windows in micro-batches of 2: rank 0 gets two, rank 1 one (and a spare forward)
LIKE_ONE = ("train.max_steps=6", "train.eval_every=3", "train.eval_tokens=160", "train.checkpoint_every=3")


def _trains_like_one(dataset: Path, tmp_path: Path, uri: str, reference: Callable[..., dict[str, History]],
                     extra: tuple[str, ...], parallel: str) -> subprocess.CompletedProcess:
    """``torchrun`` of the tiny run with ``extra`` on two processes trains as one process does (the
    same global batch: the same history), rank 0 alone prints and tracks, and neither process holds a
    DDP model when it destroys its process group."""
    probe = tmp_path / "probe"  # how many DDP models each process still held when it destroyed its group
    probe.mkdir()
    env = process_env(uri) | {"DIFFSWEEP_GROUP_PROBE": str(probe),
                                "PYTHONPATH": os.pathsep.join([str(GROUP_PROBE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(torchrun(dataset, *extra, f"train.parallel={parallel}"), cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # none: the model is freed before the group is destroyed (else gloo's destructor can deadlock)
    assert {p.name: p.read_text() for p in probe.iterdir()} == {"rank0": "0", "rank1": "0"}
    assert result.stdout.count("step 6/6") == 1  # rank 0 alone prints
    run_id, run = only_run(uri)  # rank 0 alone tracks: one MLflow run
    assert run.info.status == "FINISHED"
    assert run.data.metrics["train/tokens"] == 6 * 128  # the global batch, not a per-process one
    assert_same(histories(uri, run_id), reference(*extra))
    return result


# DIFF V1 on two processes, DDP and FSDP2, is trained against one process by the resume tests below
# (ddp-2-then-1: the steps before the interruption; fsdp-1-then-2-then-1: the steps between the two);
# the Transformer on FSDP2 by the damaged-shard test.
@pytest.mark.parametrize(("kind", "parallel"), [("transformer", "ddp"), ("diff_v2", "fsdp")])
def test_two_processes_train_like_one_with_the_same_global_batch(text_dataset, tmp_path, store, reference, kind,
                                                                 parallel):
    _trains_like_one(text_dataset, tmp_path, store["MLFLOW_TRACKING_URI"], reference,
                     (f"model.attention.kind={kind}", *LIKE_ONE), parallel)


def _interrupt(args: list[str], cwd: Path, store: str, at_step: int, sig: signal.Signals,
               processes: int) -> tuple[int, Path, str]:
    """Run ``args`` (``processes`` training processes), send ``sig`` to each while they are held
    at step ``at_step`` (as Slurm signals every task): the step of the newest checkpoint, the
    run's folder and what the command printed."""
    hold = StepHold(cwd / f"hold-{at_step}", at_step)
    proc = subprocess.Popen(args, cwd=cwd, env=process_env(store) | hold.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for pid in hold.wait(processes, alive=[proc]):
        os.kill(pid, sig)
    hold.release()
    out, err = proc.communicate(timeout=300)
    assert f"preempted by {sig.name} at step {at_step}" in out, err[-3000:]
    run_dir = next((cwd / "runs").iterdir())
    return checkpoint_step(list_checkpoints(run_dir / "checkpoints")[-1]), run_dir, out


LONG = ("model.attention.kind=diff_v1", "train.max_steps=40", "train.eval_every=20", "train.checkpoint_every=40")


@pytest.mark.parametrize(("parallel", "processes"), [("fsdp", (1, 2, 1)), ("ddp", (2, 1))],
                         ids=["fsdp-1-then-2-then-1", "ddp-2-then-1"])
def test_a_checkpoint_resumes_on_another_number_of_processes(text_dataset, tmp_path, store, reference, parallel,
                                                              processes):
    """Preempted (SIGTERM, as Slurm sends) on ``processes[0]`` processes and resumed by the same
    command on the next number, preempted again and resumed on the next (FSDP: one process, two,
    one; both directions in one run): the MLflow run continues and its whole history equals an
    uninterrupted run's."""
    uri = store["MLFLOW_TRACKING_URI"]
    launch = {1: lambda *e: single(text_dataset, *LONG, *e), 2: lambda *e: torchrun(text_dataset, *LONG, *e)}
    command = {n: launch[n](f"train.parallel={parallel}") for n in set(processes)}
    saved, run_dir, _ = _interrupt(command[processes[0]], tmp_path, uri, 5, signal.SIGTERM, processes[0])
    assert saved == 5

    def written_by(n: int, step: int) -> None:  # each FSDP process wrote its own shards (DDP's replicas once)
        if parallel == "fsdp":
            shards = sorted(p.name for p in checkpoint_path(run_dir / "checkpoints", step).glob("*.distcp"))
            assert shards == [f"__{rank}_0.distcp" for rank in range(n)]

    for before, n in zip(processes, processes[1:-1]):  # resumed, and preempted again past step 20
        written_by(before, saved)
        then, _, out = _interrupt(command[n], tmp_path, uri, 20, signal.SIGTERM, n)
        assert f"resuming {run_dir.name} at step {saved}" in out and then == 20
        saved = then
    written_by(processes[-2], saved)
    resumed = subprocess.run(command[processes[-1]], cwd=tmp_path, env=process_env(uri), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming {run_dir.name} at step {saved}" in resumed.stdout
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    assert only_run(uri)[0] == run_id and mlflow_client(uri).get_run(run_id).info.status == "FINISHED"
    assert_same(histories(uri, run_id), reference(*LONG))


def test_a_global_batch_that_does_not_split_over_the_processes_is_refused(text_dataset, tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = subprocess.run(torchrun(text_dataset, "train.micro_batch_size=4"), cwd=tmp_path, env=process_env(store),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert ("error: train.micro_batch_size: 2 processes x 4 sequences per micro-batch do not divide the 4 "
            "sequences of a global batch") in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_checkpoint_with_optimizer_state_by_position_is_refused_on_two_processes(text_dataset, tmp_path):
    """Single-file checkpoints from before multi-process training keyed the optimizer state by
    position, which only the same single-process model reads: on two processes each says so in
    one line before building anything, and no run starts."""
    import torch

    from diffsweep.config.identity import run_key
    from diffsweep.data.dataset import open_dataset
    from diffsweep.model.transformer import build_model
    from diffsweep.train.checkpoint import SINGLE_FILE_FORMAT
    from diffsweep.train.optim import build_optimizer

    cfg = tiny(text_dataset)
    model = build_model(cfg.model)
    optimizer = build_optimizer(model, cfg.train)
    model(torch.randint(0, cfg.model.vocab_size, (2, 16))).float().logsumexp(-1).mean().backward()
    optimizer.step()
    path = tmp_path / "old" / "step_00000001.pt"
    path.parent.mkdir()
    torch.save({"format": SINGLE_FILE_FORMAT, "step": 1, "tokens_seen": 128, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scheduler": {}, "rng": {"torch": torch.get_rng_state(), "cuda": []},
                "data": {"seed": 0, "next_step": 2, "fingerprint": open_dataset(text_dataset).meta.fingerprint},
                "run_key": run_key(cfg), "mlflow_run_id": None, "metrics_state": {"spikes": {"history": [], "count": 0}}},
               path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = subprocess.run([*torchrun(text_dataset), "--resume", str(path)], cwd=tmp_path, env=process_env(store),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert (f"error: {path}: step 1 was written by an older diffsweep (optimizer state by position); resume it "
            "on one process") in result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow
def test_two_fsdp_processes_train_like_one_and_a_damaged_shard_is_skipped_by_every_process_alike(
        text_dataset, tmp_path, store, reference):
    """The Transformer on two FSDP2 processes trains as one process does; each process checksums
    the shard it writes into the checkpoint's checksums.json. With 64 bytes flipped in rank 1's
    shard of the newest checkpoint, a relaunch on two processes checks the shards split between
    them (rank 1 finds it) and both fall back to the checkpoint before it; rank 0 warns once; the
    steps are trained again to the same shards and the same history."""
    from diffsweep.train.checkpoint import CHECKSUMS_FILE, load_checkpoint, verify_shards

    uri = store["MLFLOW_TRACKING_URI"]
    extra = ("model.attention.kind=transformer", *LIKE_ONE)
    _trains_like_one(text_dataset, tmp_path, uri, reference, extra, "fsdp")
    run_dir = next((tmp_path / "runs").iterdir())
    previous, newest = list_checkpoints(run_dir / "checkpoints")
    written = json.loads((newest / CHECKSUMS_FILE).read_text())["files"]
    assert set(written) == {"__0_0.distcp", "__1_0.distcp", ".metadata", "train_state.pt"}
    shard = newest / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 64])
    shard.write_bytes(bytes(data))

    again = subprocess.run(torchrun(text_dataset, *extra, "train.parallel=fsdp"), cwd=tmp_path, env=process_env(uri),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("warning:") == 1, again.stdout
    assert f"{newest.relative_to(tmp_path)}/__1_0.distcp: corrupt (CRC-32" in again.stdout
    assert f"resuming {run_dir.name} at step 3 of 6 on 2 processes" in again.stdout
    load_checkpoint(newest)
    verify_shards(newest)
    rewritten = json.loads((newest / CHECKSUMS_FILE).read_text())["files"]
    assert {k: rewritten[k] for k in ("__0_0.distcp", "__1_0.distcp")} == \
        {k: written[k] for k in ("__0_0.distcp", "__1_0.distcp")}  # the same weights, bit for bit
    run_id, run = only_run(uri)
    assert run.info.status == "FINISHED"
    assert [s for s, _ in histories(uri, run_id)["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert_same(histories(uri, run_id), reference(*extra))
