"""Full-model training throughput: tokens/s of one training step per architecture at one size.

A step is what the trainer does for one micro-batch: forward (bf16 autocast on a GPU by default,
fp32 on CPU), cross-entropy in fp32, backward, gradient clipping, AdamW step (the project's
optimizer). Token ids are random (throughput does not depend on them). Models are built through
the config (``load_config`` with ``model.size``, ``model.attention.kind``, ``model.attention.backend``)
and ``build_model``, one architecture at a time (freed before the next, so a large size fits);
each row is the median of ``steps`` timed steps after ``warmup`` untimed ones.

Each row also has: the first step's seconds (``compile_s``: Triton's autotuning and compilation,
or ``torch.compile``'s), the configs Triton's autotuner chose (``--backend triton`` on a GPU), and
on a GPU the peak allocated memory of the kind's steps beside the planner's estimate
(``diffsweep.model.memory.estimate_memory``; ``MEMORY_NOTE`` says what is compared).
``run_model``'s ``on_progress`` gets the results so far after each kind (``--out`` writes them).
A shape over a run config's limits (``train.seq_len``, tokens per micro-batch), or one no kind can
fit in the device's memory by the planner's estimate, is refused before any model is built.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from contextlib import nullcontext
from typing import TypedDict

import torch
from torch.nn import functional as F

from diffsweep.bench.common import (
    CPU_NOTE,
    describe_device,
    device_memory,
    dtype_name,
    failure_reason,
    resolve_device,
    resolve_dtype,
    time_call,
    triton_autotune,
)
from diffsweep.config import (
    SIZES,
    AttentionKind,
    Backend,
    ConfigError,
    EnvironmentUnavailable,
    Precision,
    ResolvedConfig,
    load_config,
)
from diffsweep.config.enums import TRANSFORMER
from diffsweep.config.kinds import kind_names, kind_spec
from diffsweep.config.validate import MAX_MICRO_BATCH_TOKENS, MAX_SEQ_LEN
from diffsweep.model import counting
from diffsweep.model.compile import compile_blocks
from diffsweep.model.memory import GIB, estimate_memory
from diffsweep.model.transformer import build_model
from diffsweep.train.metrics import peak_flops
from diffsweep.train.optim import build_optimizer


class _Defaults(TypedDict):
    size: str
    seq: int
    micro_batch: int
    steps: int
    warmup: int


class ModelRow(TypedDict):
    """One kind's line of ``run_model``'s ``rows`` (the timings None where ``reason`` says why)."""

    kind: str
    backend: str
    params: int
    non_embedding_params: int
    reason: str | None
    ms_per_step: float | None
    tokens_per_s: float | None
    ratio: float | None
    compile_s: float | None  # the first step (with warmup 0 also counted in the median)
    autotune: dict[str, str | None] | None  # --backend triton on a GPU: the configs chosen
    peak_alloc_bytes: int | None  # GPU: max_memory_allocated over the kind's steps
    estimate_bytes: int  # estimate_memory's total (on a GPU with GPU_OVERHEAD_BYTES)
    estimate_excl_overhead_bytes: int  # the same without the fixed overhead: what peak_alloc_bytes can see
    estimate_grads_bytes: int  # the gradients in it (alive during the forward only with accumulation)
    estimate_ratio: float | None  # peak_alloc_bytes / estimate_excl_overhead_bytes
    # GPU: memory in use on the device that PyTorch's allocator does not hold (CUDA context, cuBLAS and
    # cuDNN workspaces), after the kind's steps: what the planner's GPU_OVERHEAD_BYTES stands for.
    outside_allocator_bytes: int | None
    model_tflops: float | None  # counting.train_flops_per_token x tokens/s (the FLOPs of the math, no recompute)
    mfu: float | None  # model_tflops / the GPU's dense bf16 peak (train.metrics.peak_flops; None on CPU or unknown GPU)


GPU_DEFAULTS: _Defaults = {"size": "1.4B", "seq": 2048, "micro_batch": 4, "steps": 10, "warmup": 3}
CPU_DEFAULTS: _Defaults = {"size": "tiny-m", "seq": 256, "micro_batch": 8, "steps": 10, "warmup": 2}
MAX_STEPS = 1_000_000  # timed or warm-up steps: a benchmark, not a training run
GPU_MEMORY_DEFAULT = 80 * GIB  # estimate_memory's GPU size where there is none (it only sets ``fits``)
# The planner over-estimates a step's memory by up to 1.07x (analysis/benchmarks/RESULTS.md, "The memory
# planner under bf16 autocast"): a shape is refused only when even estimate / 1.1 does not fit.
ESTIMATE_SLACK = 1.1

PEAK_MEMORY = {
    "cuda": "torch.cuda.max_memory_allocated over the kind's warm-up and timed steps, reset once its model and "
            "optimizer are built (parameters and, from the first step on, AdamW state included; the CUDA context, "
            "library workspaces and the allocator's cached blocks not)",
    "cpu": "not measured on CPU (peak_alloc_bytes null): the process's resident set also holds the allocator's "
           "cache and the previous kinds' freed memory; analysis/benchmarks/calibrate_memory.py measures CPU peaks "
           "in fresh processes",
}
MEMORY_NOTE = (
    "estimate_bytes: estimate_memory(world_size=1, this T and micro-batch, the run's precision, no activation "
    "checkpointing), on a GPU with its fixed GPU_OVERHEAD_BYTES (CUDA context etc., which max_memory_allocated does "
    "not see); estimate_ratio = peak_alloc_bytes / estimate_excl_overhead_bytes. The estimate keeps gradients "
    "(estimate_grads_bytes) alive through the forward, as under gradient accumulation; these steps run one "
    "micro-batch each and free the gradients before it (zero_grad(set_to_none=True)), so an exact estimate gives a "
    "ratio of about 1 - estimate_grads_bytes / estimate_excl_overhead_bytes and 1. The estimate models fused "
    "attention kernels (no T x T scores), not the reference backend"
)


def _estimate_config(cfg: ResolvedConfig, seq: int, micro_batch: int, dtype: torch.dtype) -> ResolvedConfig:
    """``cfg`` with the training settings this benchmark runs (the estimate reads them from ``train``)."""
    precision = Precision.FP32 if dtype == torch.float32 else Precision.BF16
    train = dataclasses.replace(cfg.train, seq_len=seq, micro_batch_size=micro_batch, precision=precision,
                                activation_checkpointing=False)
    return dataclasses.replace(cfg, train=train)


def _time_steps(cfg, device: torch.device, dtype: torch.dtype, seq: int, micro_batch: int, steps: int,
                warmup: int, compile_model: bool) -> tuple[list[float], int | None, int | None]:
    """Every step's seconds (warm-up included), and on a GPU the peak allocated bytes over them and
    the device memory in use outside PyTorch's allocator after them."""
    model = build_model(cfg.model, device=device, compute_dtype=dtype)
    optimizer = build_optimizer(model, cfg.train)
    tokens = torch.randint(0, cfg.model.vocab_size, (micro_batch, seq + 1), device=device)
    if compile_model:  # as the trainer compiles (train.compile): each block, one graph for all
        compile_blocks(model)
    forward = model
    autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = forward(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    times = [time_call(step, device) for _ in range(warmup + steps)]
    if device.type != "cuda":
        return times, None, None
    free, total = torch.cuda.mem_get_info(device)
    return times, torch.cuda.max_memory_allocated(device), total - free - torch.cuda.memory_reserved(device)


def run_model(*, size: str | None = None, kinds: list[str] | None = None, backend: str = "sdpa",
              seq: int | None = None, micro_batch: int | None = None, steps: int | None = None,
              warmup: int | None = None, device: str = "auto", dtype: str | None = None,
              compile_model: bool = False, on_progress: Callable[[dict], None] | None = None) -> dict:
    """Training tokens/s of each kind (default: all three) at ``size``; returns the results as data
    (``"complete": true``). ``on_progress`` gets the results so far, in the same form with
    ``"complete": false``, once the arguments are checked and after each kind's row
    (``bench model --out`` writes them).

    Defaults: on a GPU 1.4B, T = 2048, micro-batch 4, bf16 autocast; on CPU tiny-m, T = 256,
    micro-batch 8, fp32, 1 thread. The ratio is tokens/s over the Transformer's (or the first kind's).
    """
    if size is not None and size not in SIZES:
        raise ConfigError("size", f"expected a size preset, one of [{', '.join(SIZES)}], got '{size}'")
    chosen = [_kind(k) for k in kinds] if kinds else kind_names()
    try:
        backend_name = Backend(backend)
    except ValueError:
        raise ConfigError("backend", f"expected one of [{', '.join(b.value for b in Backend)}], "
                          f"got '{backend}'") from None
    for flag, value, least, most in (("seq", seq, 1, MAX_SEQ_LEN), ("micro_batch", micro_batch, 1, MAX_MICRO_BATCH_TOKENS),
                                     ("steps", steps, 1, MAX_STEPS), ("warmup", warmup, 0, MAX_STEPS)):
        if value is not None and not least <= value <= most:
            raise ConfigError(flag, f"expected an integer in [{least}, {most:,}], got {value}")
    if compile_model and warmup == 0:
        raise ConfigError("warmup", "with --compile, at least 1 warm-up step (the first step compiles)")
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev, allowed=("bf16", "fp32"))
    d = GPU_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS
    size, seq, micro_batch = size or d["size"], seq or d["seq"], micro_batch or d["micro_batch"]
    steps, warmup = steps or d["steps"], d["warmup"] if warmup is None else warmup
    if seq * micro_batch > MAX_MICRO_BATCH_TOKENS:  # the limit a run's config has (train.micro_batch_size)
        raise ConfigError("micro_batch" if micro_batch > 1 else "seq", f"{micro_batch} sequences of {seq:,} tokens "
                          f"is over the limit of {MAX_MICRO_BATCH_TOKENS:,} tokens per step")
    baseline = TRANSFORMER if TRANSFORMER in chosen else chosen[0]
    gpu = dev.type == "cuda"
    gpu_memory = torch.cuda.get_device_properties(dev).total_memory if gpu else GPU_MEMORY_DEFAULT
    device_flops = peak_flops(dev) if torch_dtype == torch.bfloat16 else None  # the trainer's train/mfu denominator
    peak_tflops = device_flops / 1e12 if device_flops else None
    configs = {kind: load_config(None, [f"model.size={size}", f"model.attention.kind={kind}",
                                        f"model.attention.backend={backend_name.value}"])
               for kind in dict.fromkeys(chosen)}
    estimates = {kind: estimate_memory(_estimate_config(cfg, seq, micro_batch, torch_dtype), world_size=1,
                                       gpu_memory_bytes=gpu_memory, device=dev.type, micro_batch_size=micro_batch,
                                       activation_checkpointing=False) for kind, cfg in configs.items()}
    _check_memory(estimates, device_memory(dev), dev.type, seq, micro_batch)
    header = {
        "device": describe_device(dev), "dtype": dtype_name(torch_dtype), "size": size, "seq": seq,
        "micro_batch": micro_batch, "tokens_per_step": micro_batch * seq, "steps": steps, "warmup": warmup,
        "compile": compile_model, "baseline": baseline, "note": None if gpu else CPU_NOTE,
        "peak_bf16_tflops": peak_tflops,
        "peak_memory": PEAK_MEMORY[dev.type], "memory_note": MEMORY_NOTE,
    }
    report = on_progress or (lambda result: None)

    rows: list[ModelRow] = []
    report(_result(header, rows, baseline, complete=False))
    for kind, cfg in configs.items():
        estimate = estimates[kind]
        row: ModelRow = {"kind": kind, "backend": backend_name.value, "params": counting.num_params(cfg.model),
               "non_embedding_params": counting.num_non_embedding_params(cfg.model), "reason": None,
               "ms_per_step": None, "tokens_per_s": None, "ratio": None, "compile_s": None, "autotune": None,
               "peak_alloc_bytes": None, "estimate_bytes": estimate.total,
               "estimate_excl_overhead_bytes": estimate.total - estimate.overhead,
               "estimate_grads_bytes": estimate.grads, "estimate_ratio": None, "outside_allocator_bytes": None,
               "model_tflops": None, "mfu": None}
        torch.manual_seed(0)
        try:
            times, peak, outside = _time_steps(cfg, dev, torch_dtype, seq, micro_batch, steps, warmup,
                                               compile_model)
        except EnvironmentUnavailable as exc:
            row["reason"] = str(exc).removeprefix(f"model.attention.backend: '{backend_name.value}' ")
        except Exception as exc:  # noqa: BLE001 (out of memory, a Triton compile error: the kind's row fails)
            row["reason"] = failure_reason(exc)
        else:
            t = statistics.median(times[warmup:])
            tokens_per_s = micro_batch * seq / t
            model_tflops = counting.train_flops_per_token(cfg.model, seq) * tokens_per_s / 1e12
            row["ms_per_step"], row["tokens_per_s"], row["compile_s"] = t * 1e3, tokens_per_s, times[0]
            row["model_tflops"] = model_tflops
            if peak_tflops is not None:
                row["mfu"] = model_tflops / peak_tflops
            row["outside_allocator_bytes"] = outside
            if gpu and backend_name is Backend.TRITON:
                row["autotune"] = triton_autotune()
            if peak is not None:
                row["peak_alloc_bytes"] = peak
                row["estimate_ratio"] = peak / row["estimate_excl_overhead_bytes"]
        if gpu:
            torch.cuda.empty_cache()
        rows.append(row)
        report(_result(header, rows, baseline, complete=False))
    return _result(header, rows, baseline, complete=True)


def _check_memory(estimates: dict, memory: int | None, device: str, seq: int, micro_batch: int) -> None:
    """Refuse a shape that cannot run on this device for any kind: what the planner's estimate
    counts as live at once even without gradients (estimate less overhead and gradients, over
    ``ESTIMATE_SLACK``: a lower bound of each step's peak) over the device's memory. A shape that
    fits one kind runs: the others' rows say "out of memory"."""
    if memory is None:
        return
    need = min(e.total - e.overhead - e.grads for e in estimates.values()) / ESTIMATE_SLACK
    if need > memory:
        raise ConfigError("seq", f"T={seq:,} with micro-batch {micro_batch} needs at least {need / 1e9:,.1f} GB "
                          f"per step (the planner's estimate), more than this {device}'s {memory / 1e9:,.1f} GB; "
                          "expected a smaller --seq or --micro-batch")


def _result(header: dict, rows: list[ModelRow], baseline: AttentionKind, *, complete: bool) -> dict:
    """The results: ``header``, then copies of ``rows`` with their ratio to the baseline's tokens/s
    (None until the baseline's row is measured)."""
    base = next((r for r in rows if r["kind"] == baseline), None)
    shown: list[ModelRow] = []
    for row in rows:
        ratio = None
        if base is not None and row["tokens_per_s"] is not None and base["tokens_per_s"] is not None:
            ratio = row["tokens_per_s"] / base["tokens_per_s"]
        shown.append({**row, "ratio": ratio})
    return {**header, "complete": complete, "rows": shown}


def _kind(name: str) -> AttentionKind:
    kind_spec(name, "kinds")  # an unknown name lists every registered kind
    return name


def render(result: dict) -> None:
    """The results as one rich table, reasons listed under it."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    console.print(f"model training throughput on {result['device']}, {result['dtype']}"
                  f"{', torch.compile' if result['compile'] else ''}; median of {result['steps']} steps after "
                  f"{result['warmup']} warm-up step(s)")
    if result["note"]:
        console.print(result["note"])
    table = Table(title=f"size {result['size']}, T={result['seq']}, micro-batch {result['micro_batch']} "
                        f"({result['tokens_per_step']:,} tokens/step)", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False)
    table.add_column("attention")
    table.add_column("backend")
    for col in ("params", "ms/step", "tokens/s", "ratio", "TF/s", "MFU"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        table.add_row(r["kind"], escape(r["backend"]), f"{r['params']:,}",
                      "—" if r["ms_per_step"] is None else f"{r['ms_per_step']:.1f}",
                      "—" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}",
                      "—" if r["ratio"] is None else f"{r['ratio']:.3f}",
                      "—" if r["model_tflops"] is None else f"{r['model_tflops']:.3g}",
                      "—" if r["mfu"] is None else f"{r['mfu']:.1%}")
    console.print(table)
    for r in result["rows"]:
        if r["reason"] is not None:
            console.print(f"  {r['kind']} / {r['backend']}: {r['reason']}", markup=False, highlight=False)
        if r["autotune"] is not None:
            configs = "; ".join(f"{k} {v or '—'}" for k, v in r["autotune"].items())
            console.print(f"  {r['kind']} / {r['backend']}: first step {r['compile_s']:.2f} s (autotune + compile); "
                          f"chose {configs}", markup=False, highlight=False)
    peak = result["peak_bf16_tflops"]
    console.print(f"ratio = tokens/s / {result['baseline']}'s tokens/s (measured in this run). TF/s = training FLOPs "
                  "per token (the math's, no recomputation) x tokens/s; MFU = TF/s / "
                  + (f"this GPU's dense bf16 peak, {peak:g} TFLOP/s." if peak else "a GPU's bf16 peak (none here)."),
                  highlight=False)
    memory = Table(title="memory (MB)", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    memory.add_column("attention")
    for col in ("peak", "estimate", "excl. overhead", "of it grads", "peak/estimate"):
        memory.add_column(col, justify="right")
    for r in result["rows"]:
        memory.add_row(r["kind"], "—" if r["peak_alloc_bytes"] is None else f"{r['peak_alloc_bytes'] / 1e6:,.1f}",
                       f"{r['estimate_bytes'] / 1e6:,.1f}", f"{r['estimate_excl_overhead_bytes'] / 1e6:,.1f}",
                       f"{r['estimate_grads_bytes'] / 1e6:,.1f}",
                       "—" if r["estimate_ratio"] is None else f"{r['estimate_ratio']:.3f}")
    console.print(memory)
    console.print(f"peak: {result['peak_memory']}. estimate: the planner's (estimate_memory), with its fixed GPU "
                  "overhead and without (what peak can see); peak/estimate = peak / the estimate excluding it, about "
                  "1 - grads/estimate to 1 when the estimate is right: it keeps gradients alive through the forward, "
                  "these steps free them (memory_note in --json).", highlight=False)
