"""``diffsweep bench``'s results while it runs (in-process, CPU, smallest settings): what
``on_progress`` gets after each row, the ``--out`` file a killed run leaves, the peak memory beside
the planner's estimate, and the configs Triton's autotuner chose. No timed assertions."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from diffsweep.bench.attention import run_attention
from diffsweep.bench.common import triton_autotune
from diffsweep.bench.model import run_model
from diffsweep.bench.output import result_writer
from diffsweep.config import load_config
from diffsweep.model.memory import GIB, estimate_memory
from tests.helpers.gpu import needs_cuda

TINY_MODEL = {"size": "tiny-3xs", "seq": 16, "micro_batch": 1, "steps": 1, "warmup": 0, "device": "cpu"}
CONFIG = re.compile(r"BLOCK_M=\d+ BLOCK_N=\d+ warps=\d+ stages=\d+")


def _positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_run_model_reports_every_row_as_it_is_measured():
    docs: list[dict] = []
    # The baseline (transformer) second: the first row's ratio is unknown until it is measured.
    result = run_model(**TINY_MODEL, kinds=["diff_v1", "transformer"], on_progress=docs.append)
    assert [[row["kind"] for row in doc["rows"]] for doc in docs] == [[], ["diff_v1"], ["diff_v1", "transformer"]]
    assert [doc["complete"] for doc in docs] == [False] * 3 and result["complete"] is True
    assert docs[1]["rows"][0]["ratio"] is None and _positive(docs[1]["rows"][0]["tokens_per_s"])
    assert docs[2]["rows"][1]["ratio"] == 1.0 and _positive(docs[2]["rows"][0]["ratio"])
    assert result["rows"] == docs[-1]["rows"] and {**docs[-1], "complete": True} == result
    assert json.loads(json.dumps(docs)) == docs  # every report is plain JSON
    for row in result["rows"]:
        assert _positive(row["compile_s"]) and row["autotune"] is None
        # CPU: no peak measured, said so; the estimate is the planner's for what ran (T=16, micro-batch 1, fp32).
        assert row["peak_alloc_bytes"] is None and row["estimate_ratio"] is None
        cfg = load_config(None, ["model.size=tiny-3xs", f"model.attention.kind={row['kind']}", "train.seq_len=16",
                                 "train.micro_batch_size=1", "train.batch_tokens=16", "train.precision=fp32"])
        estimate = estimate_memory(cfg, world_size=1, gpu_memory_bytes=80 * GIB, device="cpu")
        assert row["estimate_bytes"] == row["estimate_excl_overhead_bytes"] == estimate.total  # no overhead on CPU
        assert row["estimate_grads_bytes"] == estimate.grads == 4 * row["params"]
    assert result["peak_memory"].startswith("not measured on CPU") and "grads" in result["memory_note"]


def test_a_killed_bench_model_leaves_the_rows_measured_so_far(tmp_path):
    out = tmp_path / "model.json"
    write = result_writer(out)

    def killed_after_the_first_row(result: dict) -> None:
        write(result)
        if result["rows"]:
            raise KeyboardInterrupt  # what a time limit does, after the row was written

    with pytest.raises(KeyboardInterrupt):
        run_model(**TINY_MODEL, on_progress=killed_after_the_first_row)
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and [row["kind"] for row in doc["rows"]] == ["transformer"]
    assert _positive(doc["rows"][0]["tokens_per_s"]) and doc["rows"][0]["ratio"] == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]  # no temporary file left behind


def test_run_attention_reports_after_the_first_calls_and_every_round():
    docs: list[dict] = []
    result = run_attention(layouts=["tiny-2xs"], seqs=[16, 32], batch_tokens=32, backends=["sdpa"], reps=2, warmup=1,
                           device="cpu", on_progress=docs.append)
    # Once at the start; per case: after the first calls, after each of 2 timed rounds, when complete.
    assert [[(c["seq"], c["complete"]) for c in doc["cases"]] for doc in docs] == [
        [], [(16, False)], [(16, False)], [(16, False)], [(16, True)],
        [(16, True), (32, False)], [(16, True), (32, False)], [(16, True), (32, False)], [(16, True), (32, True)]]
    assert [doc["complete"] for doc in docs] == [False] * 9 and result["complete"] is True
    assert docs[-1]["cases"] == result["cases"] and docs[0]["baseline"] is None and docs[1]["baseline"] == "sdpa"
    runnable = [i for i, row in enumerate(result["cases"][0]["rows"]) if row["reason"] is None]
    assert len(runnable) == 3  # transformer, diff_v1 and diff_v2 through SDPA
    for doc, rounds in zip(docs[1:4], (0, 1, 2), strict=True):
        rows = doc["cases"][0]["rows"]
        assert [rows[i]["rounds"] for i in runnable] == [rounds] * 3
        assert all(_positive(rows[i]["compile_s"]) for i in runnable)  # known from the first calls on
        assert all((rows[i]["fwd_ms"] is None) == (rounds == 0) for i in runnable)
        assert all((rows[i]["fwd_bwd_ratio"] is None) == (rounds == 0) for i in runnable)
    assert docs[3]["cases"][0]["rows"] == result["cases"][0]["rows"]  # the last round's report is the result
    for row in result["cases"][1]["rows"]:
        assert row["autotune"] is None and row["peak_alloc_bytes"] is None  # CPU
    assert json.loads(json.dumps(docs)) == docs


@pytest.mark.gpu  # on CUDA when there, else in Triton's interpreter
def test_triton_autotune_reads_the_real_kernels():
    pytest.importorskip("triton", reason="needs the triton package (on CPU it runs in the interpreter)")
    from diffsweep_kernels import triton_diff

    device = "cuda" if torch.cuda.is_available() else "cpu"
    q1, k1, q2, k2 = (torch.randn(1, 1, 16, 16, device=device, requires_grad=True) for _ in range(4))
    v = torch.randn(1, 1, 16, 32, device=device, requires_grad=True)
    lam = torch.tensor(0.5, device=device, requires_grad=True)
    triton_diff.diff_attention(q1, k1, q2, k2, v, lam, scale=0.25).sum().backward()
    configs = triton_autotune()
    assert configs is not None and set(configs) == {"fwd", "dkdv", "dq"}
    assert all(CONFIG.fullmatch(value or "") for value in configs.values()), configs


@pytest.mark.gpu
@needs_cuda
def test_on_a_gpu_rows_carry_peak_memory_and_the_triton_configs():
    # tiny-l at T=256 in bf16 for both: one shape, so Triton autotunes once.
    model = run_model(size="tiny-l", seq=256, micro_batch=2, steps=1, warmup=1, device="cuda", backend="triton",
                      kinds=["diff_v1"])
    (row,) = model["rows"]
    assert row["reason"] is None, row["reason"]
    assert _positive(row["peak_alloc_bytes"]) and _positive(row["estimate_ratio"]) and _positive(row["compile_s"])
    assert row["estimate_bytes"] > row["estimate_excl_overhead_bytes"]  # the GPU's fixed overhead
    assert _positive(row["outside_allocator_bytes"])  # at least the CUDA context
    if model["peak_bf16_tflops"] is not None:  # a GPU in the table (an H100 on the device machine)
        assert row["mfu"] == pytest.approx(row["model_tflops"] / model["peak_bf16_tflops"]) and 0 < row["mfu"] < 1
    assert all(CONFIG.fullmatch(value or "") for value in row["autotune"].values()), row["autotune"]
    attention = run_attention(layouts=["tiny-l"], seqs=[256], batch_tokens=512, backends=["triton"], reps=1,
                              warmup=0, device="cuda")
    rows = {(r["kind"], r["kernel"]): r for r in attention["cases"][0]["rows"]}
    triton = rows[("diff_v1", "triton")]
    assert triton["reason"] is None and all(CONFIG.fullmatch(v or "") for v in triton["autotune"].values())
    for r in rows.values():
        if r["reason"] is None:
            assert _positive(r["peak_alloc_bytes"]) and _positive(r["compile_s"]) and _positive(r["fwd_tflops"])


def test_a_row_whose_kernel_raises_any_error_fails_alone(monkeypatch):
    """A kernel that raises something other than a RuntimeError (a Triton compile error, a
    ValueError from a shape check) fails its own row with the reason; the other rows are measured."""
    from diffsweep.config import Backend
    from diffsweep.model.attention.backends import BACKENDS, ReferenceBackend

    class Broken(ReferenceBackend):
        def attend(self, q, k, v, *, scale):
            raise ValueError("no kernel for these shapes\nsecond line")

        def diff_attend(self, q1, k1, q2, k2, v, lam, *, scale):
            return self.attend(q1, k1, v, scale=scale)

    monkeypatch.setitem(BACKENDS, Backend.REFERENCE, Broken())
    result = run_attention(layouts=["tiny-2xs"], seqs=[16], batch_tokens=32, reps=1, warmup=0, device="cpu",
                           backends=["reference", "sdpa"])
    rows = {(r["kind"], r["kernel"]): r for r in result["cases"][0]["rows"]}
    assert rows[("diff_v1", "reference")]["reason"] == "failed: ValueError: no kernel for these shapes"
    assert rows[("diff_v1", "reference")]["fwd_ms"] is None
    assert rows[("diff_v1", "sdpa")]["reason"] is None and rows[("diff_v1", "sdpa")]["fwd_ms"] > 0
