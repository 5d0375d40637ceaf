"""``train.compile`` on the CPU (inductor's C++ code): a compiled tiny run of each kind trains,
evaluates, checkpoints, is preempted and resumes without compiling a graph again; its resume is
bitwise the uninterrupted compiled run, and its losses are eager's within bf16 rounding."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from diffsweep.config import ConfigError
from diffsweep.train.checkpoint import list_checkpoints, load_checkpoint
from diffsweep.train.trainer import train
from tests.conftest import TINY_RUN
from tests.helpers.cli import run
from tests.helpers.training import KINDS, history, quiet, recorder, tiny

# The shapes of tests/model/test_compile_on_cpu.py and the device kit's CPU rehearsal (tiny-3xs, bf16
# autocast, 2 x 32 tokens): one block graph per kind, compiled once and then read from inductor's cache.
SHAPE = ("model.size=tiny-3xs", "train.precision=bf16")
# Compiled vs eager under bf16 autocast: inductor keeps fused ops' intermediates in fp32 where eager
# rounds each op's output to bf16 (unit roundoff 2^-9), and twelve AdamW steps carry that on.
# Measured 2026-12-07 on the three kinds: train and validation loss within 6.8e-5 relative (fp32
# runs: within 9e-8); bound 1e-3 (a wrong graph, e.g. a layer's λ_init taken for another's, moves
# the loss by 1e-2 or more).
LOSS_REL = 1e-3


@pytest.mark.slow  # one block compiled per kind (~10-20 CPU-s of C++ on a cold cache), four runs
@pytest.mark.parametrize("kind", KINDS)
def test_a_compiled_run_is_preempted_and_resumes_bitwise_without_a_recompile(kind, text_dataset, store_client,
                                                                             tmp_path):
    compiled_cfg = tiny(text_dataset, *SHAPE, f"model.attention.kind={kind}", "train.compile=true")

    def preempt_at_5(step, metrics):
        if step == 5:
            os.kill(os.getpid(), signal.SIGUSR2)

    torch._dynamo.reset()
    # Evaluation (every 4 steps), probes, checkpoints (every 2), the preemption and the resume in a
    # new model: a graph compiled again anywhere in them is an error here.
    with torch._dynamo.config.patch(error_on_recompile=True):
        full: dict = {}
        whole = train(compiled_cfg, tmp_path / "full", experiment=f"compiled-{kind}", callbacks=(recorder(full),),
                      echo=quiet)
        resumed: dict = {}
        first = train(compiled_cfg, tmp_path / "run", experiment=f"compiled-{kind}",
                      callbacks=(recorder(resumed), preempt_at_5), echo=quiet)
        assert (first.status, first.step) == ("preempted", 5)
        assert load_checkpoint(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])["step"] == 5
        second = train(compiled_cfg, tmp_path / "run", experiment=f"compiled-{kind}",
                       callbacks=(recorder(resumed),), echo=quiet)
    assert whole.status == second.status == "finished" and sorted(full) == list(range(1, 13))
    assert resumed == full  # every metric of every step, bit for bit (recompiles included)
    assert all(m["train/recompiles"] == 0 for m in full.values())
    compile_s = history(store_client, whole.run_id, "train/compile_s")
    assert [step for step, _ in compile_s] == [2] and compile_s[0][1] > 0  # logged once, at the second step
    assert [step for step, _ in history(store_client, second.run_id, "train/compile_s")] == [2, 7]  # each process

    eager: dict = {}
    train(tiny(text_dataset, *SHAPE, f"model.attention.kind={kind}", "train.compile=false"), tmp_path / "eager",
          experiment=f"eager-{kind}", callbacks=(recorder(eager),), echo=quiet)
    assert "train/recompiles" not in eager[1]
    for step in full:
        for key in ("train/loss", "val/loss"):
            if key in eager[step]:
                assert full[step][key] == pytest.approx(eager[step][key], rel=LOSS_REL), (step, key)


def test_compile_true_with_a_backend_not_checked_under_it_is_refused_before_anything_is_made(text_dataset,
                                                                                              store_client, tmp_path):
    cfg = tiny(text_dataset, "model.attention.kind=diff_v1", "model.attention.backend=flash", "train.compile=true")
    with pytest.raises(ConfigError, match=r"train\.compile: true, but attention backend 'flash' is not checked"):
        train(cfg, tmp_path / "run", echo=quiet)
    assert not (tmp_path / "run").exists()
    # the command line: one line, exit 2, no run directory
    done = run("train", "--out", str(tmp_path / "runs"), *(f"--set={o}" for o in TINY_RUN),
               f"--set=data.path={text_dataset}", "--set=model.attention.backend=flash", "--set=train.compile=true",
               cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "train.compile: true" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
