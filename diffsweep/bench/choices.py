"""The closed choices of ``diffsweep bench`` as StrEnums (its ``--device`` and ``--dtype``).

Standard library only, so the CLI can use them as Typer options without loading torch for
``diffsweep --help``; ``diffsweep.bench.common`` maps them to torch devices and dtypes.
"""

from __future__ import annotations

from enum import StrEnum


class Device(StrEnum):
    """Where a benchmark runs."""

    AUTO = "auto"  # CUDA when visible, else CPU
    CPU = "cpu"
    CUDA = "cuda"


class Dtype(StrEnum):
    """The precision a benchmark computes in (``diffsweep.bench.common.DTYPES``)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


MODEL_DTYPES = (Dtype.BF16, Dtype.FP32)  # bench model: bf16 autocast or fp32 (no fp16 loss scaling)
