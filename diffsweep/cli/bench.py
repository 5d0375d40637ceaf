"""``diffsweep bench ...``: attention kernels and full-model training throughput, side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.cli.common import JsonOpt, handle_errors, print_json
from diffsweep.config import ConfigError

app = typer.Typer(help="Benchmarks that print numbers: attention kernels, full-model training throughput.",
                  no_args_is_help=True)

DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | cuda (auto: CUDA when visible).")]


@app.command()
@handle_errors
def attention(
    layout: Annotated[list[str] | None, typer.Option("--layout", help="Head layout of a size preset, e.g. 1.4B, 3B "
                                                     "(repeatable) (default: 1.4B and 3B on a GPU, tiny-l on CPU).",
                                                     show_default=False)] = None,
    seq: Annotated[list[int] | None, typer.Option("--seq", help="Sequence length (repeatable) (default: 2048 and "
                                                  "4096 on a GPU, 256 and 512 on CPU).", show_default=False)] = None,
    batch_tokens: Annotated[int | None, typer.Option("--batch-tokens", help="Tokens per batch, B = N // T "
                                                     "(default: 16384 on a GPU, 2048 on CPU).",
                                                     show_default=False)] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="bf16 | fp16 | fp32 (default: bf16 on a GPU, fp32 "
                                              "on CPU).", show_default=False)] = None,
    device: DeviceOpt = "auto",
    backend: Annotated[list[str] | None, typer.Option("--backend", help="DIFF V1 backend(s) to time (repeatable) "
                                                      "(default: all).", show_default=False)] = None,
    reps: Annotated[int, typer.Option("--reps", help="Timed rounds (the median is reported).")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed rounds first.")] = 2,
    json_: JsonOpt = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the results as JSON to this file.",
                                             show_default=False)] = None,
) -> None:
    """Forward and forward+backward time, TFLOP/s and the ratio to the baseline of baseline attention,
    DIFF V1 (each backend) and DIFF V2."""
    from diffsweep.bench.attention import render, run_attention

    _check_out(out)
    result = run_attention(layouts=layout, seqs=seq, batch_tokens=batch_tokens, dtype=dtype, device=device,
                           backends=backend, reps=reps, warmup=warmup)
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if json_:
        print_json(result)
    else:
        render(result)


@app.command()
@handle_errors
def model(
    size: Annotated[str | None, typer.Option("--size", help="Size preset (default: 1.4B on a GPU, tiny-m on CPU).",
                                             show_default=False)] = None,
    kind: Annotated[list[str] | None, typer.Option("--kind", help="transformer | diff_v1 | diff_v2 (repeatable) "
                                                   "(default: all three).", show_default=False)] = None,
    backend: Annotated[str, typer.Option("--backend", help="Attention backend of every model.")] = "sdpa",
    seq: Annotated[int | None, typer.Option("--seq", help="Sequence length (default: 2048 on a GPU, 256 on CPU).",
                                            show_default=False)] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="Sequences per step (default: 4 on a "
                                                    "GPU, 8 on CPU).", show_default=False)] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Timed steps (default: 10).",
                                              show_default=False)] = None,
    warmup: Annotated[int | None, typer.Option("--warmup", help="Untimed steps first (default: 3 on a GPU, 2 on "
                                               "CPU).", show_default=False)] = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[str | None, typer.Option("--dtype", help="bf16 (autocast) | fp32 (default: bf16 on a GPU, "
                                              "fp32 on CPU).", show_default=False)] = None,
    compile_model: Annotated[bool, typer.Option("--compile/--no-compile", help="torch.compile each model.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Full-model training tokens/s (forward, backward, AdamW step) of each architecture at one size,
    with parameter counts and the ratio to the Transformer."""
    from diffsweep.bench.model import render, run_model

    result = run_model(size=size, kinds=kind, backend=backend, seq=seq, micro_batch=micro_batch, steps=steps,
                       warmup=warmup, device=device, dtype=dtype, compile_model=compile_model)
    if json_:
        print_json(result)
    else:
        render(result)


def _check_out(out: Path | None) -> None:
    if out is not None and (out.is_dir() or not out.parent.is_dir()):
        raise ConfigError("--out", f"expected a file in an existing folder, got '{out}'")
