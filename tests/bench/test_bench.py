"""``diffsweep bench``: the FLOP convention by hand, the layouts from the presets, and both commands
run as a user runs them (CPU, smallest settings): in this process (``tests.helpers.cli.run``), but
for the run killed part-way, which is a process of its own. No timed assertions: only that every
row is there and its numbers are finite and positive."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time

import pytest

from diffsweep.bench.attention import forward_backward_flops, forward_flops, layout_calls
from diffsweep.config import Backend, load_config
from diffsweep.config.enums import DIFF_V1, DIFF_V2, TRANSFORMER
from diffsweep.config.kinds import kind_spec
from diffsweep.model import counting
from diffsweep.model.attention.backends import AttentionCall
from tests.helpers.cli import run

TINY_ATTENTION = ["--layout", "tiny-2xs", "--seq", "16", "--batch-tokens", "32", "--reps", "1", "--warmup", "0",
                  "--device", "cpu"]
TINY_MODEL = ["--size", "tiny-3xs", "--seq", "16", "--micro-batch", "1", "--steps", "1", "--warmup", "0",
              "--device", "cpu"]


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``diffsweep bench ARGS``, in this process."""
    return run("bench", *args, env=env)


def test_forward_flops_by_hand():
    B, T = 8, 2048
    # 1.4B baseline: 16 heads of d = 128; QKᵀ and PV are 2·T·T·d each per head, halved for the causal mask.
    baseline = AttentionCall(16, 16, 128, 128, differential=False)
    assert forward_flops(baseline, B, T) == B * 16 * (2 * T * T * 128 + 2 * T * T * 128) // 2
    assert forward_flops(baseline, B, T) == 137_438_953_472
    # DIFF V1: 8 heads, two maps each with QKᵀ of dim 128 and PV of dim 256.
    v1 = AttentionCall(8, 8, 128, 256, differential=True)
    assert forward_flops(v1, B, T) == B * 8 * 2 * (2 * T * T * 128 + 2 * T * T * 256) // 2
    assert forward_flops(v1, B, T) / forward_flops(baseline, B, T) == 1.5
    # DIFF V2: the baseline's formula over 32 query heads (on 16 K/V heads: GQA does not change FLOPs).
    v2 = AttentionCall(32, 16, 128, 128, differential=False)
    assert forward_flops(v2, B, T) == 2 * forward_flops(baseline, B, T)
    assert forward_backward_flops(v1, B, T) == 3 * forward_flops(v1, B, T)
    # Odd sizes stay exact integers.
    assert forward_flops(AttentionCall(1, 1, 3, 5, differential=False), 1, 7) == (2 * 7 * 7 * 3 + 2 * 7 * 7 * 5) // 2


@pytest.mark.parametrize("size", ["1.4B", "3B"])
def test_layouts_come_from_the_presets_and_agree_with_counting(size):
    calls = layout_calls(size)
    heads = {"1.4B": 16, "3B": 24}[size]
    assert calls[TRANSFORMER] == AttentionCall(heads, heads, 128, 128, differential=False)
    assert calls[DIFF_V1] == AttentionCall(heads // 2, heads // 2, 128, 256, differential=True)
    assert calls[DIFF_V2] == AttentionCall(2 * heads, heads, 128, 128, differential=False)
    # The same attention FLOPs as the model counter (per token, full T×T), halved for the causal mask.
    for kind, call in calls.items():
        a = load_config(None, [f"model.size={size}", f"model.attention.kind={kind}"]).model.attention
        assert forward_flops(call, 2, 4096) == 2 * 4096 * kind_spec(kind).attention_flops(a, 4096) // 2


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_bench_attention_json_every_row(tmp_path):
    out = tmp_path / "attention.json"
    # TRITON_INTERPRET=1 makes Triton importable on CPU: the row must still carry a reason, not a timing.
    r = bench("attention", *TINY_ATTENTION, "--json", "--out", str(out), env={"TRITON_INTERPRET": "1"})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert json.loads(out.read_text()) == data
    assert data["note"] == "CPU: tiny shapes; ratios only" and "causal" in data["flop_convention"]
    (case,) = data["cases"]
    assert (case["layout"], case["seq"], case["batch"]) == ("tiny-2xs", 16, 2)
    assert data["complete"] is True and case["complete"] is True
    rows = {(row["kind"], row["kernel"]): row for row in case["rows"]}
    expected = [("transformer", "sdpa"), ("transformer", "sdpa-cudnn"),
                *(("diff_v1", b.value) for b in Backend), ("diff_v2", "sdpa")]
    assert [(row["kind"], row["kernel"]) for row in case["rows"]] == expected
    for key in [("transformer", "sdpa"), ("diff_v1", "reference"), ("diff_v1", "sdpa"), ("diff_v2", "sdpa")]:
        row = rows[key]
        assert row["reason"] is None, key
        for field in ("fwd_ms", "fwd_bwd_ms", "fwd_tflops", "fwd_bwd_tflops", "fwd_ratio", "fwd_bwd_ratio"):
            assert _positive(row[field]), (key, field, row[field])
        assert row["fwd_tflops"] == pytest.approx(row["fwd_flops"] / (row["fwd_ms"] / 1e3) / 1e12)
        assert row["rounds"] == 1 and _positive(row["compile_s"])
        assert row["autotune"] is None and row["peak_alloc_bytes"] is None  # CUDA only
    assert rows[("transformer", "sdpa")]["fwd_ratio"] == rows[("transformer", "sdpa")]["fwd_bwd_ratio"] == 1.0
    # tiny-2xs: d_model 32, head dim 16 -> 2 baseline heads, 1 DIFF V1 head (V of 32), 4 V2 query heads on 2.
    assert rows[("diff_v1", "sdpa")]["fwd_flops"] == forward_flops(AttentionCall(1, 1, 16, 32, True), 2, 16)
    assert rows[("diff_v2", "sdpa")]["q_heads"] == 4 and rows[("diff_v2", "sdpa")]["kv_heads"] == 2
    assert rows[("diff_v1", "sdpa")]["fwd_flops"] == 1.5 * rows[("transformer", "sdpa")]["fwd_flops"]
    for key in [("transformer", "sdpa-cudnn"), ("diff_v1", "flash"), ("diff_v1", "triton")]:
        assert rows[key]["reason"], key
        assert rows[key]["fwd_ms"] is None and rows[key]["fwd_ratio"] is None
    assert "CUDA" in rows[("diff_v1", "flash")]["reason"]


def test_bench_attention_table():
    r = bench("attention", *TINY_ATTENTION, "--backend", "sdpa", "--backend", "flash")
    assert r.returncode == 0, r.stderr
    for text in ("CPU: tiny shapes; ratios only", "layout tiny-2xs, T=16, B=2", "diff_v2", "1.000",
                 "diff_v1 / flash: needs a CUDA GPU", "halved for the causal mask"):
        assert text in r.stdout, text
    assert "reference" not in r.stdout  # --backend picks the DIFF V1 rows


def test_bench_model_json_every_kind(tmp_path):
    out = tmp_path / "model.json"
    r = bench("model", *TINY_MODEL, "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert json.loads(out.read_text()) == data and data["complete"] is True
    assert data["note"] == "CPU: tiny shapes; ratios only" and data["tokens_per_step"] == 16
    assert [row["kind"] for row in data["rows"]] == ["transformer", "diff_v1", "diff_v2"]
    for row in data["rows"]:
        assert row["reason"] is None, row
        assert _positive(row["tokens_per_s"]) and _positive(row["ms_per_step"]) and _positive(row["ratio"])
        assert _positive(row["compile_s"]) and row["estimate_bytes"] > 0 and row["peak_alloc_bytes"] is None
        cfg = load_config(None, ["model.size=tiny-3xs", f"model.attention.kind={row['kind']}"]).model
        assert row["params"] == counting.num_params(cfg)
        flops = counting.train_flops_per_token(cfg, data["seq"])
        assert row["model_tflops"] == pytest.approx(flops * row["tokens_per_s"] / 1e12)
        assert row["mfu"] is None and row["outside_allocator_bytes"] is None  # a GPU's only
    assert data["rows"][0]["ratio"] == 1.0 and data["peak_bf16_tflops"] is None


def test_bench_attention_killed_partway_leaves_what_it_measured(tmp_path):
    """A time limit kills the run (SIGKILL: no clean-up) once the first case is on disk; the file
    holds it, complete, in a valid document marked incomplete. The second case (T = 8192 against
    T = 16) takes seconds where the first takes milliseconds, so the kill comes before the end.
    A process of its own: what SIGKILL leaves behind is the point."""
    out = tmp_path / "attention.json"
    args = ["--layout", "tiny-2xs", "--seq", "16", "--seq", "8192", "--batch-tokens", "8192", "--backend", "sdpa",
            "--reps", "3", "--warmup", "0", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "diffsweep", "bench", "attention", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    doc: dict = {}
    try:
        deadline = time.monotonic() + 600  # a guard against hanging (generous: a loaded CI machine)
        while proc.poll() is None and time.monotonic() < deadline:
            if out.exists():
                doc = json.loads(out.read_text())  # always whole: written atomically
                if doc["cases"] and doc["cases"][0]["complete"]:
                    break
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, stderr = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, stderr)
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["baseline"] == "sdpa"
    first = doc["cases"][0]
    assert first["complete"] is True and (first["seq"], first["batch"]) == (16, 512)
    assert all(not case["complete"] for case in doc["cases"][1:])
    timed = [row for row in first["rows"] if row["reason"] is None]
    assert [(row["kind"], row["kernel"]) for row in timed] == [("transformer", "sdpa"), ("diff_v1", "sdpa"),
                                                               ("diff_v2", "sdpa")]
    for row in timed:
        assert row["rounds"] == 3 and _positive(row["fwd_bwd_tflops"]) and _positive(row["fwd_bwd_ratio"])


def test_bench_model_unavailable_backend_gives_reasons_not_a_crash():
    r = bench("model", *TINY_MODEL, "--backend", "flash", "--kind", "diff_v1")
    assert r.returncode == 0, r.stderr
    assert "—" in r.stdout  # no numbers
    (line,) = [line for line in r.stdout.splitlines() if "diff_v1 / flash:" in line]
    assert "CUDA" in line  # "needs a CUDA GPU, ..." or "runs on CUDA devices only, ..."


@pytest.mark.parametrize("args, option", [
    (["attention", "--layout", "7B"], "--layout"),
    (["attention", "--seq", "0"], "--seq"),
    (["attention", "--backend", "cuda"], "--backend"),
    (["model", "--size", "huge"], "--size"),
    (["model", "--kind", "diff"], "--kind"),
    (["model", "--seq", "0"], "--seq"),
    (["model", "--out", "/"], "--out"),  # a folder
    (["model", "--out", "/no/such/folder/model.json"], "--out"),
    (["attention", "--out", "/no/such/folder/attention.json"], "--out"),
])
def test_bad_input_is_one_line_exit_2(args, option):
    r = bench(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"error: {option}:") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
