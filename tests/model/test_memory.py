"""The memory estimator and planner: formulas by hand, sharding, checkpointing, the paper's sizes,
and one tiny case measured for real (peak RSS of a training step in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffsweep.config.loading import load_config
from diffsweep.model import counting
from diffsweep.model.memory import USABLE_FRACTION, estimate_memory, layer_bytes_per_token, plan_memory

GB80 = 80 * 10**9
ROOT = Path(__file__).resolve().parents[2]


def cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_formulas_by_hand_tiny_xs_fp32():
    c = cfg("model.size=tiny-xs", "train.micro_batch_size=2", "train.precision=fp32")
    P = counting.num_params(c.model)
    D, F, h, d, V, T = 64, 176, 4, 16, 4096, 256  # F: 8 * 64 // 3 = 170, rounded up to a multiple of 8
    assert (c.model.d_model, c.model.ffn_hidden, c.model.attention.num_heads, c.model.attention.head_dim) == (D, F, h, d)
    norm = 8 * D + 4 * D  # fp32 input + normalised, output saved once by the matmuls
    attention = 4 * (h * d + 2 * h * d + h * d) + 4 * h + 4 * h * d  # q, k, v, out; lse; wo input
    ffn = 4 * 4 * F
    per_token = 2 * norm + attention + ffn
    assert per_token == 5648
    assert layer_bytes_per_token(c, 4) == per_token
    e = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80, device="cpu")
    tokens = 2 * T
    assert (e.params, e.grads, e.optimizer) == (4 * P, 4 * P, 8 * P)
    assert e.fsdp_gather == e.grad_buckets == e.weight_copies == e.optimizer_step_temp == e.overhead == 0
    assert e.activation_per_layer == per_token * tokens
    assert e.activations_full == 2 * per_token * tokens + norm * tokens
    assert e.activations_checkpointed == 2 * 4 * D * tokens + per_token * tokens + norm * tokens
    assert e.logits == tokens * V * 16
    assert e.total == 16 * P + e.activations_full + e.logits


def test_gpu_bf16_adds_overhead_weight_copies_and_smaller_activations():
    c = cfg("model.size=tiny-m")  # precision auto: bf16 on a GPU, fp32 on CPU
    gpu = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80)
    cpu = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80, device="cpu")
    assert gpu.compute_bytes == 2 and cpu.compute_bytes == 4
    assert gpu.overhead > 10**9 and cpu.overhead == 0
    assert gpu.weight_copies > 0 and cpu.weight_copies == 0
    assert gpu.activations_full < cpu.activations_full


@pytest.mark.parametrize("kind", ["transformer", "diff_v1", "diff_v2"])
def test_fsdp_shards_state_and_ddp_replicates(kind):
    c = cfg("model.size=1.4B", f"model.attention.kind={kind}", "train.parallel=fsdp")
    one = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80)
    eight = estimate_memory(c, world_size=8, gpu_memory_bytes=GB80)
    sharded = eight.params + eight.grads + eight.optimizer
    assert sharded == pytest.approx((one.params + one.grads + one.optimizer) / 8, rel=1e-6)
    assert 0 < eight.fsdp_gather < sharded  # one block (or the root) gathered, not the model
    assert eight.activations == one.activations  # per micro-batch, independent of the world size
    ddp = estimate_memory(cfg("model.size=1.4B", f"model.attention.kind={kind}", "train.parallel=ddp"), world_size=8,
                   gpu_memory_bytes=GB80)
    assert ddp.params == one.params and ddp.grad_buckets == ddp.grads


@pytest.mark.parametrize("kind", ["transformer", "diff_v1", "diff_v2"])
def test_checkpointing_reduces_activations(kind):
    c = cfg("model.size=1.4B", f"model.attention.kind={kind}", "train.micro_batch_size=4")
    e = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80)
    assert e.activations_checkpointed < e.activations_full / 5
    on = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80, activation_checkpointing=True)
    assert on.activations == on.activations_checkpointed and on.total < e.total


def test_13b_needs_several_gpus_with_fsdp():
    c = cfg("model.size=13.1B", "train.parallel=fsdp")
    one = estimate_memory(c, world_size=1, gpu_memory_bytes=GB80, micro_batch_size=1, activation_checkpointing=True)
    assert 190e9 < one.params + one.grads + one.optimizer < 220e9  # the issue's ~200 GB of state
    assert not one.fits
    plan = plan_memory(c, GB80, gpus_per_node=8)
    assert plan.fits and plan.world_size >= 3 and plan.nodes == 1
    assert plan.estimate.total <= USABLE_FRACTION * GB80
    assert (c.train.batch_tokens // c.train.seq_len) % (plan.world_size * plan.micro_batch_size) == 0
    assert "GPUs" in plan.describe()


def test_13b_with_ddp_cannot_fit_and_says_why():
    plan = plan_memory(cfg("model.size=13.1B", "train.parallel=ddp"), GB80, gpus_per_node=8)
    assert not plan.fits
    assert "fsdp" in plan.reason and "activation checkpointing" in plan.reason


def test_too_small_gpus_name_the_layout_tried():
    plan = plan_memory(cfg("model.size=13.1B"), 4 * 10**9, gpus_per_node=8, max_nodes=2)
    assert not plan.fits and "16 GPUs (2 nodes)" in plan.reason


def test_1_4b_fits_on_one_80gb_gpu():
    c = cfg("model.size=1.4B")
    plan = plan_memory(c, GB80, gpus_per_node=8)
    assert plan.fits and plan.world_size == 1 and plan.micro_batch_size >= 1
    # the largest micro-batch: the next divisor up would not fit (without checkpointing)
    sequences = c.train.batch_tokens // c.train.seq_len
    bigger = [m for m in range(plan.micro_batch_size + 1, sequences + 1) if sequences % m == 0]
    if bigger and not plan.activation_checkpointing:
        assert not estimate_memory(c, world_size=1, gpu_memory_bytes=GB80, micro_batch_size=bigger[0],
                            activation_checkpointing=False).fits


def test_calibration_one_tiny_case_on_cpu():
    """Estimate / measured peak-RSS increase of two real fp32 training steps is within 0.5x-2x."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "analysis/benchmarks/calibrate_memory.py"),
                          "--case", "tiny-xs:transformer:4:0"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert 0.5 <= row["ratio"] <= 2.0, row


# bf16 autocast on CPU, the GPU stage's precision and micro-batch (4) scaled down to tiny-xs at
# T = 256: estimate / measured was 1.07 (transformer), 1.06 (diff_v1), 1.03 (diff_v2) on
# 2026-11-27 (tiny-m: 1.04, 1.03, 1.01), and 1.21, 1.19-1.20, 1.21 on 2026-12-07 (the same code on
# a VM with another kernel: ~10 MB less resident; 1.2 failed one CI run). The band is tighter than
# fp32's 0.5x-2x so that a bf16 term counted at fp32 width or forgotten (autocast's weight copies,
# bf16 logits) shows.
BF16_BAND = (0.85, 1.3)


@pytest.mark.parametrize("kind", ["transformer", "diff_v1", "diff_v2"])
def test_calibration_bf16_autocast_on_cpu(kind):
    """Estimate / measured peak-RSS increase of two bf16-autocast training steps at micro-batch 4."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, str(ROOT / "analysis/benchmarks/calibrate_memory.py"),
                          "--case", f"tiny-xs:{kind}:4:0:bf16"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["precision"] == "bf16" and row["weight_copies"] > 0  # the estimate's bf16 terms are in
    assert BF16_BAND[0] <= row["ratio"] <= BF16_BAND[1], row


def test_every_attention_kind_has_an_activation_formula():
    from diffsweep.config.kinds import KindSpec, kind_names, kind_spec

    for kind in kind_names():  # each spec gives its own saved bytes (the base class has none)
        assert type(kind_spec(kind)).saved_bytes is not KindSpec.saved_bytes, kind
