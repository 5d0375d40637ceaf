"""``diffsweep bench ...``: attention kernels and full-model training throughput, side by side."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from diffsweep.bench.choices import MODEL_DTYPES, Device, Dtype
from diffsweep.cli.common import JsonOpt, choice, handle_errors, name_choice, print_json
from diffsweep.config import SIZES, AttentionKind, Backend
from diffsweep.config.kinds import kind_names

app = typer.Typer(help="Benchmarks that print numbers: attention kernels, full-model training throughput.",
                  no_args_is_help=True)

DeviceOpt = Annotated[Device, choice(Device, "--device", "Where to run (auto: CUDA when visible).")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Also write the results as JSON to this file, rewritten "
                                             "after every measured row (\"complete\": false until the end), so a "
                                             "run killed by a time limit keeps what it measured.", show_default=False)]


@app.command()
@handle_errors  # each parameter is named as the library's field it sets: errors name its flag
def attention(
    layouts: Annotated[list[str] | None, name_choice(lambda: SIZES, "--layout", "Head layout of a size preset: "
                                                    "{choices} (repeatable) (default: 1.4B and 3B on a GPU, tiny-l on "
                                                    "CPU).", expected="a size preset, one of", metavar="SIZE",
                                                    show_default=False)] = None,
    seqs: Annotated[list[int] | None, typer.Option("--seq", help="Sequence length (repeatable) (default: 2048 and "
                                                  "4096 on a GPU, 256 and 512 on CPU).", show_default=False)] = None,
    batch_tokens: Annotated[int | None, typer.Option("--batch-tokens", help="Tokens per batch, B = N // T "
                                                     "(default: 16384 on a GPU, 2048 on CPU).",
                                                     show_default=False)] = None,
    dtype: Annotated[Dtype | None, choice(Dtype, "--dtype", "Precision (default: bf16 on a GPU, fp32 on CPU).",
                                          show_default=False)] = None,
    device: DeviceOpt = Device.AUTO,
    backends: Annotated[list[Backend] | None, choice(Backend, "--backend", "DIFF V1 backend(s) to time (repeatable) "
                                                    "(default: all).", show_default=False)] = None,
    reps: Annotated[int, typer.Option("--reps", help="Timed rounds (the median is reported).")] = 10,
    warmup: Annotated[int, typer.Option("--warmup", help="Untimed rounds first.")] = 2,
    json_: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Forward and forward+backward time, TFLOP/s and the ratio to the baseline of baseline attention,
    DIFF V1 (each backend) and DIFF V2; the first call's seconds (Triton: autotune + compile) and
    the configs Triton chose; on a GPU each kernel's peak allocated memory."""
    from diffsweep.bench.output import check_out, result_writer

    check_out(out)
    from diffsweep.bench.attention import render, run_attention

    result = run_attention(layouts=layouts, seqs=seqs, batch_tokens=batch_tokens, dtype=_value(dtype),
                           device=device.value, backends=[b.value for b in backends] if backends else None, reps=reps,
                           warmup=warmup, on_progress=result_writer(out))
    _show(result, out, json_, render)


@app.command()
@handle_errors
def model(
    size: Annotated[str | None, name_choice(lambda: SIZES, "--size", "Size preset: {choices} (default: 1.4B on a "
                                            "GPU, tiny-m on CPU).", expected="a size preset, one of", metavar="SIZE",
                                            show_default=False)] = None,
    kinds: Annotated[list[AttentionKind] | None, name_choice(kind_names, "--kind", "Attention kind(s) (repeatable) "
                                                            "(default: all).", show_default=False)] = None,
    backend: Annotated[Backend, choice(Backend, "--backend", "Attention backend of every model.")] = Backend.SDPA,
    seq: Annotated[int | None, typer.Option("--seq", help="Sequence length (default: 2048 on a GPU, 256 on CPU).",
                                            show_default=False)] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="Sequences per step (default: 4 on a "
                                                    "GPU, 8 on CPU).", show_default=False)] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Timed steps (default: 10).",
                                              show_default=False)] = None,
    warmup: Annotated[int | None, typer.Option("--warmup", help="Untimed steps first (default: 3 on a GPU, 2 on "
                                               "CPU).", show_default=False)] = None,
    device: DeviceOpt = Device.AUTO,
    dtype: Annotated[Dtype | None, choice(Dtype, "--dtype", "Precision, bf16 as autocast (default: bf16 on a "
                                          "GPU, fp32 on CPU).", members=MODEL_DTYPES, show_default=False)] = None,
    compile_model: Annotated[bool, typer.Option("--compile/--no-compile", help="torch.compile each model.")] = False,
    json_: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Full-model training tokens/s (forward, backward, AdamW step) of each architecture at one size,
    with parameter counts and the ratio to the Transformer; the first step's seconds, the configs
    Triton chose (--backend triton), and on a GPU the peak allocated memory beside the planner's
    estimate."""
    from diffsweep.bench.output import check_out, result_writer

    check_out(out)
    from diffsweep.bench.model import render, run_model

    result = run_model(size=size, kinds=list(kinds) if kinds else None, backend=backend.value, seq=seq,
                       micro_batch=micro_batch, steps=steps, warmup=warmup, device=device.value,
                       dtype=_value(dtype), compile_model=compile_model, on_progress=result_writer(out))
    _show(result, out, json_, render)


def _value(dtype: Dtype | None) -> str | None:
    return None if dtype is None else dtype.value


def _show(result: dict, out: Path | None, json_: bool, render: Callable[[dict], None]) -> None:
    """The finished benchmark's results into ``--out`` (if given), then as JSON or a table."""
    from diffsweep.bench.output import write_result

    if out is not None:
        write_result(out, result)
    if json_:
        print_json(result)
    else:
        render(result)
