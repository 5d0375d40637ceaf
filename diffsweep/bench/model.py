"""Full-model training throughput: tokens/s of one training step per architecture at one size.

A step is what the trainer does for one micro-batch: forward (bf16 autocast on a GPU by default,
fp32 on CPU), cross-entropy in fp32, backward, gradient clipping, AdamW step (the project's
optimizer). Token ids are random (throughput does not depend on them). Models are built through
the config (``load_config`` with ``model.size``, ``model.attention.kind``, ``model.attention.backend``)
and ``build_model``, one architecture at a time (freed before the next, so a large size fits);
each row is the median of ``steps`` timed steps after ``warmup`` untimed ones.
"""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from typing import TypedDict

import torch
from torch.nn import functional as F

from diffsweep.bench.common import (
    CPU_NOTE,
    describe_device,
    dtype_name,
    failure_reason,
    resolve_device,
    resolve_dtype,
    time_call,
)
from diffsweep.config import SIZES, AttentionKind, Backend, ConfigError, EnvironmentUnavailable, load_config
from diffsweep.model import counting
from diffsweep.model.transformer import build_model
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


GPU_DEFAULTS: _Defaults = {"size": "1.4B", "seq": 2048, "micro_batch": 4, "steps": 10, "warmup": 3}
CPU_DEFAULTS: _Defaults = {"size": "tiny-m", "seq": 256, "micro_batch": 8, "steps": 10, "warmup": 2}


def _time_steps(cfg, device: torch.device, dtype: torch.dtype, seq: int, micro_batch: int, steps: int,
                warmup: int, compile_model: bool) -> list[float]:
    model = build_model(cfg.model, device=device, compute_dtype=dtype)
    optimizer = build_optimizer(model, cfg.train)
    forward = torch.compile(model) if compile_model else model
    tokens = torch.randint(0, cfg.model.vocab_size, (micro_batch, seq + 1), device=device)
    autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = forward(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        optimizer.step()

    times = [time_call(step, device) for _ in range(warmup + steps)]
    return times[warmup:]


def run_model(*, size: str | None = None, kinds: list[str] | None = None, backend: str = "sdpa",
              seq: int | None = None, micro_batch: int | None = None, steps: int | None = None,
              warmup: int | None = None, device: str = "auto", dtype: str | None = None,
              compile_model: bool = False) -> dict:
    """Training tokens/s of each kind (default: all three) at ``size``; returns the results as data.

    Defaults: on a GPU 1.4B, T = 2048, micro-batch 4, bf16 autocast; on CPU tiny-m, T = 256,
    micro-batch 8, fp32, 1 thread. The ratio is tokens/s over the Transformer's (or the first kind's).
    """
    if size is not None and size not in SIZES:
        raise ConfigError("size", f"expected a size preset, one of [{', '.join(SIZES)}], got '{size}'")
    chosen = [_kind(k) for k in kinds] if kinds else list(AttentionKind)
    try:
        backend_name = Backend(backend)
    except ValueError:
        raise ConfigError("backend", f"expected one of [{', '.join(b.value for b in Backend)}], "
                          f"got '{backend}'") from None
    for flag, value, least in (("seq", seq, 1), ("micro_batch", micro_batch, 1), ("steps", steps, 1),
                               ("warmup", warmup, 0)):
        if value is not None and value < least:
            raise ConfigError(flag, f"expected an integer >= {least}, got {value}")
    if compile_model and warmup == 0:
        raise ConfigError("warmup", "with --compile, at least 1 warm-up step (the first step compiles)")
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev, allowed=("bf16", "fp32"))
    d = GPU_DEFAULTS if dev.type == "cuda" else CPU_DEFAULTS
    size, seq, micro_batch = size or d["size"], seq or d["seq"], micro_batch or d["micro_batch"]
    steps, warmup = steps or d["steps"], d["warmup"] if warmup is None else warmup
    baseline = AttentionKind.TRANSFORMER if AttentionKind.TRANSFORMER in chosen else chosen[0]

    rows: list[ModelRow] = []
    for kind in dict.fromkeys(chosen):
        cfg = load_config(None, [f"model.size={size}", f"model.attention.kind={kind.value}",
                                 f"model.attention.backend={backend_name.value}"])
        row: ModelRow = {"kind": kind.value, "backend": backend_name.value, "params": counting.num_params(cfg.model),
               "non_embedding_params": counting.num_non_embedding_params(cfg.model), "reason": None,
               "ms_per_step": None, "tokens_per_s": None, "ratio": None}
        torch.manual_seed(0)
        try:
            times = _time_steps(cfg, dev, torch_dtype, seq, micro_batch, steps, warmup, compile_model)
        except EnvironmentUnavailable as exc:
            row["reason"] = str(exc).removeprefix(f"model.attention.backend: '{backend_name.value}' ")
        except RuntimeError as exc:  # out of memory
            row["reason"] = failure_reason(exc)
        else:
            t = statistics.median(times)
            row["ms_per_step"], row["tokens_per_s"] = t * 1e3, micro_batch * seq / t
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        rows.append(row)
    base = next(r for r in rows if r["kind"] == baseline.value)
    for row in rows:
        if row["tokens_per_s"] is not None and base["tokens_per_s"] is not None:
            row["ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
    return {
        "device": describe_device(dev), "dtype": dtype_name(torch_dtype), "size": size, "seq": seq,
        "micro_batch": micro_batch, "tokens_per_step": micro_batch * seq, "steps": steps, "warmup": warmup,
        "compile": compile_model, "baseline": baseline.value, "note": None if dev.type == "cuda" else CPU_NOTE,
        "rows": rows,
    }


def _kind(name: str) -> AttentionKind:
    try:
        return AttentionKind(name)
    except ValueError:
        raise ConfigError("kinds", f"expected one of [{', '.join(k.value for k in AttentionKind)}], "
                          f"got '{name}'") from None


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
    for col in ("params", "non-embedding", "ms/step", "tokens/s", "ratio"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        table.add_row(r["kind"], escape(r["backend"]),
                      f"{r['params']:,}", f"{r['non_embedding_params']:,}",
                      "—" if r["ms_per_step"] is None else f"{r['ms_per_step']:.1f}",
                      "—" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}",
                      "—" if r["ratio"] is None else f"{r['ratio']:.3f}")
    console.print(table)
    for r in result["rows"]:
        if r["reason"] is not None:
            console.print(f"  {r['kind']} / {r['backend']}: {r['reason']}", markup=False, highlight=False)
    console.print(f"ratio = tokens/s / {result['baseline']}'s tokens/s (measured in this run).", highlight=False)
