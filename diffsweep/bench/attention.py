"""Attention alone: the baseline vs DIFF V1 (each backend) vs DIFF V2, forward and forward+backward.

Head layouts come from the size presets (``load_config`` + ``attention_call``), so a layout is the
attention one layer of that model runs. Rows: the baseline (on a GPU SDPA's FlashAttention kernel,
and its cuDNN kernel beside it; on CPU plain SDPA), then every other registered kind: one row per
backend for a kind whose call is differential (DIFF V1), else one SDPA row. Each row times the real
attention module of one layer (``AttentionModule.core``: the backend call, the kind's combination and
per-head norm) on inputs made by its own ``project``, so the benchmark runs the model's code, not a
copy of its math. Rows are timed round-robin (warm-up, then the median of ``reps``), so machine load
affects them alike and the ratio ``t_baseline / t`` is the trustworthy figure. FLOPs are counted as
``FLOP_CONVENTION`` says. See docs/kernels.md, 'Benchmarks: `diffsweep bench`'.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TypedDict

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from diffsweep.bench.common import (
    CPU_NOTE,
    describe_device,
    device_memory,
    dtype_name,
    failure_reason,
    peak_allocated,
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
    ResolvedModel,
    load_config,
)
from diffsweep.config.enums import TRANSFORMER
from diffsweep.config.kinds import kind_names, kind_spec
from diffsweep.config.validate import MAX_MICRO_BATCH_TOKENS, MAX_SEQ_LEN
from diffsweep.model.attention.backends import BACKENDS, AttentionBackend, AttentionCall, resolve_backend
from diffsweep.model.layers import Rotary
from diffsweep.model.transformer import attention_call, attention_module

# The same for every row: a matmul (M×K)·(K×N) counts 2·M·N·K; per query head the baseline multiplies
# QKᵀ (dim d) and PV (dim d); DIFF V1 two QKᵀ of dim d and two PV of dim 2d (1.5× the baseline's attention
# FLOPs at equal parameters); DIFF V2 the baseline's formula over its 2h query heads. The causal mask halves
# the full T×T products. Forward+backward counts 3× the forward (backward ≈ 2× forward). These are the FLOPs
# of the math: a kernel that recomputes (SDPA's split V recomputes QKᵀ per V chunk, flash recomputes the
# forward in the backward) is not credited for it.
FLOP_CONVENTION = (
    "FLOPs: 2·M·N·K per matmul of the math (per query head QKᵀ and PV; DIFF V1 two QKᵀ of dim d and two PV "
    "of dim 2d = 1.5x the baseline; DIFF V2 the baseline's over 2h query heads), halved for the causal mask; "
    "fwd+bwd = 3 x fwd; kernel recomputation not counted"
)

GPU_LAYOUTS, GPU_SEQS, GPU_BATCH_TOKENS = ("1.4B", "3B"), (2048, 4096), 16_384
CPU_LAYOUTS, CPU_SEQS, CPU_BATCH_TOKENS = ("tiny-l",), (256, 512), 2_048
MAX_ROUNDS = 1_000_000  # timed or warm-up rounds: a benchmark, not a training run


def layout_models(size: str) -> dict[AttentionKind, ResolvedModel]:
    """The model config of the size preset ``size`` for each registered kind."""
    return {kind: load_config(None, [f"model.size={size}", f"model.attention.kind={kind}"]).model
            for kind in kind_names()}


def layout_calls(size: str) -> dict[AttentionKind, AttentionCall]:
    """The attention call each kind makes in one layer of the size preset ``size``."""
    return {kind: attention_call(model) for kind, model in layout_models(size).items()}


def forward_flops(call: AttentionCall, batch: int, seq: int) -> int:
    """Forward FLOPs of causal attention ``call`` over ``batch`` sequences of ``seq`` tokens."""
    maps = 2 if call.differential else 1  # DIFF V1: two softmax maps, each against the full V
    full = maps * 2 * batch * call.num_q_heads * seq * seq * (call.qk_dim + call.v_dim)  # QKᵀ + PV
    return full // 2  # causal: half of the T×T products


def forward_backward_flops(call: AttentionCall, batch: int, seq: int) -> int:
    return 3 * forward_flops(call, batch, seq)


class SdpaKernel(AttentionBackend):
    """SDPA restricted to one of PyTorch's kernels: the GPU baseline (FlashAttention, or cuDNN)."""

    name = Backend.SDPA

    def __init__(self, kernel: SDPBackend) -> None:
        self.kernel = kernel

    def attend(self, q, k, v, *, scale):
        with sdpa_kernel(self.kernel):  # the backward runs the kernel the forward picked
            return BACKENDS[Backend.SDPA].attend(q, k, v, scale=scale)


Forward = Callable[[], torch.Tensor]


def module_inputs(model: ResolvedModel, backend: AttentionBackend, B: int, T: int, device: torch.device,
                  dtype: torch.dtype) -> tuple[Forward, list[torch.Tensor]]:
    """The real attention module of one layer of ``model`` on ``backend``: a forward over leaf inputs
    (what its ``project`` makes of random input, detached) and those leaves."""
    with torch.device(device):
        module = attention_module(model.attention.kind)(model, 1, backend)
    module.reset_parameters()  # nn.Linear's own init for the projections: their values do not matter here
    module.to(dtype)
    x = torch.randn(B, T, model.d_model, device=device, dtype=dtype)
    with torch.no_grad():
        projected = module.project(x, Rotary(T, model.attention.head_dim, model.rope_theta, device=device))
    leaves = [t.detach().requires_grad_() for t in projected]
    return (lambda: module.core(*leaves)), leaves


@dataclass
class Row:
    """One line of the table: what runs, then its timings (or why it could not run)."""

    kind: AttentionKind
    kernel: str
    call: AttentionCall
    model: ResolvedModel
    backend: AttentionBackend | None = None
    reason: str | None = None
    forward: Forward | None = None
    leaves: list[torch.Tensor] = field(default_factory=list)
    grad_out: torch.Tensor | None = None
    fwd_s: list[float] = field(default_factory=list)
    fwd_bwd_s: list[float] = field(default_factory=list)
    compile_s: float | None = None  # the first forward + first forward+backward
    autotune: dict[str, str | None] | None = None  # Triton on a GPU: the configs chosen for this shape
    peak_alloc_bytes: int | None = None  # GPU: one forward+backward's peak above the live inputs

    def forward_backward(self) -> None:
        assert self.forward is not None, "first_calls makes the inputs"
        torch.autograd.grad(self.forward(), self.leaves, self.grad_out)

    def release(self) -> None:
        """Drop the inputs (the timings stay)."""
        self.forward, self.leaves, self.grad_out = None, [], None

    def fail(self, reason: str) -> None:
        self.reason = reason
        self.release()


def _resolve(kind: AttentionKind, name: Backend, model: ResolvedModel, device: torch.device,
             dtype: torch.dtype) -> Row:
    call = attention_call(model)
    try:
        backend = resolve_backend(name, call, device=device, dtype=dtype)
    except EnvironmentUnavailable as exc:
        return Row(kind, name.value, call, model,
                   reason=str(exc).removeprefix(f"model.attention.backend: '{name.value}' "))
    if name is Backend.TRITON and device.type == "cpu":
        return Row(kind, name.value, call, model, reason="runs on CPU only interpreted (TRITON_INTERPRET=1): a "
                   "correctness check, not a timing")
    return Row(kind, name.value, call, model, backend=backend)


def plan_rows(models: dict[AttentionKind, ResolvedModel], device: torch.device, dtype: torch.dtype,
              backends: tuple[Backend, ...]) -> list[Row]:
    """The rows of one layout, baseline first; then each kind, through every backend if its call is
    differential (the backends differ there), else through SDPA."""
    base_kind = TRANSFORMER
    base, call = models[base_kind], attention_call(models[base_kind])
    if device.type == "cuda":
        rows = [Row(base_kind, "sdpa-flash", call, base, backend=SdpaKernel(SDPBackend.FLASH_ATTENTION)),
                Row(base_kind, "sdpa-cudnn", call, base, backend=SdpaKernel(SDPBackend.CUDNN_ATTENTION))]
    else:
        rows = [Row(base_kind, "sdpa", call, base, backend=BACKENDS[Backend.SDPA]),
                Row(base_kind, "sdpa-cudnn", call, base, reason="cuDNN attention needs a CUDA GPU")]
    for kind, model in models.items():
        if kind is not base_kind:
            names = backends if kind_spec(kind).differential else (Backend.SDPA,)
            rows += [_resolve(kind, name, model, device, dtype) for name in names]
    return rows


def first_calls(row: Row, batch: int, seq: int, device: torch.device, dtype: torch.dtype) -> None:
    """Make the row's inputs and time its first forward and forward+backward (``compile_s``: Triton
    autotunes and compiles its kernels in them); then on a GPU the configs Triton chose
    (``autotune``) and the peak allocated memory of one more forward+backward."""
    assert row.backend is not None, "a runnable row has its backend"
    forward, row.leaves = module_inputs(row.model, row.backend, batch, seq, device, dtype)
    row.forward = forward
    out: list[torch.Tensor] = []

    def first_forward() -> None:
        with torch.no_grad():
            out.append(forward())

    compile_s = time_call(first_forward, device)
    row.grad_out = torch.randn_like(out.pop())
    row.compile_s = compile_s + time_call(row.forward_backward, device)
    if device.type == "cuda":
        if row.kernel == Backend.TRITON:
            row.autotune = triton_autotune()
        row.peak_alloc_bytes = peak_allocated(row.forward_backward, device)


def measure(rows: list[Row], batch: int, seq: int, device: torch.device, dtype: torch.dtype, *, reps: int,
            warmup: int, on_round: Callable[[], None] | None = None) -> None:
    """Time every runnable row round-robin: its first calls, ``warmup`` rounds, then ``reps`` timed
    rounds. ``on_round`` is called once the first calls are done and after each timed round."""
    notify = on_round or (lambda: None)
    for row in rows:
        if row.reason is not None:
            continue
        try:
            first_calls(row, batch, seq, device, dtype)
        except Exception as exc:  # noqa: BLE001 (out of memory, no kernel, a Triton compile error: one row fails)
            row.fail(failure_reason(exc))
    notify()
    for i in range(warmup + reps):
        for row in rows:
            if row.reason is not None:
                continue
            assert row.forward is not None  # first_calls made it, or the row failed
            try:
                fwd, fwd_bwd = time_call(row.forward, device), time_call(row.forward_backward, device)
            except Exception as exc:  # noqa: BLE001 (the row fails, the others go on)
                row.fail(failure_reason(exc))
                continue
            if i >= warmup:
                row.fwd_s.append(fwd)
                row.fwd_bwd_s.append(fwd_bwd)
        if i >= warmup:
            notify()
    for row in rows:
        row.release()


class AttentionRow(TypedDict):
    """One kernel's line of a case in ``run_attention`` (the timings None where ``reason`` says why)."""

    kind: str
    kernel: str
    q_heads: int
    kv_heads: int
    qk_dim: int
    v_dim: int
    fwd_flops: int
    fwd_bwd_flops: int
    reason: str | None
    fwd_ms: float | None
    fwd_bwd_ms: float | None
    fwd_tflops: float | None
    fwd_bwd_tflops: float | None
    fwd_ratio: float | None
    fwd_bwd_ratio: float | None
    rounds: int  # timed rounds in the medians so far (``reps`` once the case is complete)
    compile_s: float | None
    autotune: dict[str, str | None] | None
    peak_alloc_bytes: int | None


class AttentionCase(TypedDict):
    """One layout at one sequence length in ``run_attention``: its rows, the first the baseline;
    ``complete`` once every round has run (before, medians of the rounds so far)."""

    layout: str
    seq: int
    batch: int
    complete: bool
    rows: list[AttentionRow]


def _row_result(row: Row, base: Row, batch: int, seq: int) -> AttentionRow:
    c = row.call
    result: AttentionRow = {
        "kind": row.kind, "kernel": row.kernel, "q_heads": c.num_q_heads, "kv_heads": c.num_kv_heads,
        "qk_dim": c.qk_dim, "v_dim": c.v_dim, "fwd_flops": forward_flops(c, batch, seq),
        "fwd_bwd_flops": forward_backward_flops(c, batch, seq), "reason": row.reason,
        "fwd_ms": None, "fwd_bwd_ms": None, "fwd_tflops": None, "fwd_bwd_tflops": None,
        "fwd_ratio": None, "fwd_bwd_ratio": None, "rounds": len(row.fwd_s), "compile_s": row.compile_s,
        "autotune": row.autotune, "peak_alloc_bytes": row.peak_alloc_bytes,
    }
    if row.reason is not None or not row.fwd_s:
        return result
    fwd, fwd_bwd = statistics.median(row.fwd_s), statistics.median(row.fwd_bwd_s)
    result["fwd_ms"], result["fwd_bwd_ms"] = fwd * 1e3, fwd_bwd * 1e3
    result["fwd_tflops"] = result["fwd_flops"] / fwd / 1e12
    result["fwd_bwd_tflops"] = result["fwd_bwd_flops"] / fwd_bwd / 1e12
    if base.reason is None and base.fwd_s:
        result["fwd_ratio"] = statistics.median(base.fwd_s) / fwd
        result["fwd_bwd_ratio"] = statistics.median(base.fwd_bwd_s) / fwd_bwd
    return result


def _case_result(layout: str, seq: int, batch: int, rows: list[Row], *, complete: bool) -> AttentionCase:
    return {"layout": layout, "seq": seq, "batch": batch, "complete": complete,
            "rows": [_row_result(row, rows[0], batch, seq) for row in rows]}


def _report(on_progress: Callable[[dict], None], header: dict, cases: list[AttentionCase],
            current: Callable[[], AttentionCase] | None = None) -> None:
    """Hand ``on_progress`` the results so far: the finished cases and the one being measured."""
    shown = [*cases, *([current()] if current else [])]
    on_progress(_result(header, shown, complete=False))


def _result(header: dict, cases: list[AttentionCase], *, complete: bool) -> dict:
    return {**header, "baseline": cases[0]["rows"][0]["kernel"] if cases else None, "complete": complete,
            "cases": cases}


def run_attention(*, layouts: list[str] | None = None, seqs: list[int] | None = None,
                  batch_tokens: int | None = None, dtype: str | None = None, device: str = "auto",
                  backends: list[str] | None = None, reps: int = 10, warmup: int = 2,
                  on_progress: Callable[[dict], None] | None = None) -> dict:
    """Benchmark the attention of each layout at each sequence length; returns the results as data
    (``"complete": true``). ``on_progress`` gets the results so far, in the same form with
    ``"complete": false``, once the arguments are checked, after each case's first calls and after
    each timed round (``bench attention --out`` writes them).

    Defaults: on a GPU the 1.4B and 3B layouts at T = 2048 and 4096, bf16, 16K tokens per batch
    (B = batch_tokens // T); on CPU the tiny-l layout at T = 256 and 512, fp32, 2K tokens, 1 thread.

    A sequence length over a run config's limit, or a case whose Q, K, V and output alone exceed the
    device's memory, is refused before any row runs.
    """
    for name in layouts or ():
        if name not in SIZES:
            raise ConfigError("layouts", f"expected a size preset, one of [{', '.join(SIZES)}], got '{name}'")
    # The limits a run's config has (train.seq_len; one batch through a layer is a micro-batch).
    for s in seqs or ():
        if not 1 <= s <= MAX_SEQ_LEN:
            raise ConfigError("seqs", f"expected a sequence length in [1, {MAX_SEQ_LEN:,}], got {s}")
    if batch_tokens is not None and not 1 <= batch_tokens <= MAX_MICRO_BATCH_TOKENS:
        raise ConfigError("batch_tokens", f"expected a number of tokens in [1, {MAX_MICRO_BATCH_TOKENS:,}], "
                          f"got {batch_tokens}")
    if not 1 <= reps <= MAX_ROUNDS:
        raise ConfigError("reps", f"expected 1 to {MAX_ROUNDS:,} timed repetitions, got {reps}")
    if not 0 <= warmup <= MAX_ROUNDS:
        raise ConfigError("warmup", f"expected 0 to {MAX_ROUNDS:,} warm-up rounds, got {warmup}")
    chosen = tuple(_backend(name) for name in backends) if backends else tuple(Backend)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    gpu = dev.type == "cuda"
    layouts = layouts or list(GPU_LAYOUTS if gpu else CPU_LAYOUTS)
    seqs = seqs or list(GPU_SEQS if gpu else CPU_SEQS)
    batch_tokens = batch_tokens or (GPU_BATCH_TOKENS if gpu else CPU_BATCH_TOKENS)

    _check_memory(layouts, seqs, batch_tokens, dev, torch_dtype)

    header = {"device": describe_device(dev), "dtype": dtype_name(torch_dtype), "reps": reps, "warmup": warmup,
              "flop_convention": FLOP_CONVENTION, "note": None if gpu else CPU_NOTE}
    cases: list[AttentionCase] = []
    report = partial(_report, on_progress or (lambda result: None), header, cases)
    torch.manual_seed(0)
    report()
    for size in layouts:
        models = layout_models(size)
        for seq in seqs:
            batch = max(1, batch_tokens // seq)
            rows = plan_rows(models, dev, torch_dtype, chosen)
            measure(rows, batch, seq, dev, torch_dtype, reps=reps, warmup=warmup,
                    on_round=partial(report, partial(_case_result, size, seq, batch, rows, complete=False)))
            cases.append(_case_result(size, seq, batch, rows, complete=True))
            report()
    return _result(header, cases, complete=True)


def _check_memory(layouts: list[str], seqs: list[int], batch_tokens: int, device: torch.device,
                  dtype: torch.dtype) -> None:
    """Refuse a case that cannot run on this device: every row holds at least the baseline's Q, K,
    V and output (4 x B x T x d_model elements), a lower bound of its memory (kernels add more)."""
    memory = device_memory(device)
    if memory is None:
        return
    itemsize = torch.empty((), dtype=dtype).element_size()
    for size in layouts:
        d_model = load_config(None, [f"model.size={size}"]).model.d_model
        for seq in seqs:
            need = 4 * max(1, batch_tokens // seq) * seq * d_model * itemsize
            if need > memory:
                raise ConfigError("seqs", f"T={seq:,} at layout {size} needs at least {need / 1e9:,.1f} GB (Q, K, V "
                                  f"and output), more than this {device.type}'s {memory / 1e9:,.1f} GB; expected a "
                                  "smaller --seq")


def _backend(name: str) -> Backend:
    try:
        return Backend(name)
    except ValueError:
        allowed = ", ".join(b.value for b in Backend)
        raise ConfigError("backends", f"expected one of [{allowed}], got '{name}'") from None


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def render(result: dict) -> None:
    """The results as one rich table per (layout, sequence length), reasons listed under it."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    console.print(f"attention benchmark on {result['device']}, {result['dtype']}, "
                  f"median of {result['reps']} after {result['warmup']} warm-up round(s)")
    if result["note"]:
        console.print(result["note"])
    for case in result["cases"]:
        rows = case["rows"]
        heads = {r["kind"]: f"{r['q_heads']}/{r['kv_heads']}, {r['qk_dim']}/{r['v_dim']}" for r in rows}
        table = Table(title=f"layout {case['layout']}, T={case['seq']}, B={case['batch']}",
                      box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for col in ("attention", "kernel"):
            table.add_column(col)
        for col in ("fwd ms", "f+b ms", "fwd TF/s", "f+b TF/s", "fwd ×", "f+b ×"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(r["kind"], escape(r["kernel"]), _num(r["fwd_ms"], ".3f"), _num(r["fwd_bwd_ms"], ".3f"),
                          _num(r["fwd_tflops"], ".3g"), _num(r["fwd_bwd_tflops"], ".3g"),
                          _num(r["fwd_ratio"], ".3f"), _num(r["fwd_bwd_ratio"], ".3f"))
        console.print(table)
        console.print("  heads q/kv, QK/V dim: " + "; ".join(f"{k} {v}" for k, v in heads.items()), highlight=False)
        peaks = [f"{r['kind']}/{r['kernel']} {r['peak_alloc_bytes'] / 1e6:,.0f}" for r in rows
                 if r["peak_alloc_bytes"] is not None]
        if peaks:
            console.print("  peak MB of one forward+backward above its inputs: " + "; ".join(peaks), highlight=False)
        for r in rows:
            if r["reason"] is not None:
                console.print(f"  {r['kind']} / {r['kernel']}: {r['reason']}", markup=False, highlight=False)
            if r["autotune"] is not None:
                configs = "; ".join(f"{k} {v or '—'}" for k, v in r["autotune"].items())
                console.print(f"  {r['kind']} / {r['kernel']}: first forward and forward+backward {r['compile_s']:.2f} "
                              f"s (autotune + compile); chose {configs}", markup=False, highlight=False)
    console.print("f+b = forward+backward; TF/s = TFLOP/s; × = t_baseline / t (throughput ratio to the first row). "
                  + result["flop_convention"] + ".", highlight=False)
