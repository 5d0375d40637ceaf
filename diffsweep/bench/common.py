"""What both benchmarks share: the device and dtype from the command line, timing one call, the
peak memory of one call on a GPU, and the configs Triton's autotuner chose."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import torch

from diffsweep.config import ConfigError, EnvironmentUnavailable

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CPU_NOTE = "CPU: tiny shapes; ratios only"


def resolve_device(name: str) -> torch.device:
    """``auto`` (CUDA when visible, else CPU), ``cpu`` or ``cuda``. On CPU, one thread."""
    if name not in ("auto", "cpu", "cuda"):
        raise ConfigError("device", f"expected one of [auto, cpu, cuda], got '{name}'")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise EnvironmentUnavailable("--device: 'cuda' needs a CUDA GPU, and none is visible")
    if name == "cpu":
        torch.set_num_threads(1)  # robust on a shared box; ratios are what CPU numbers are for
    return torch.device(name)


def resolve_dtype(name: str | None, device: torch.device, allowed: tuple[str, ...] = tuple(DTYPES)) -> torch.dtype:
    """The ``--dtype`` (default: bf16 on a GPU, fp32 on CPU)."""
    if name is None:
        name = "bf16" if device.type == "cuda" else "fp32"
    if name not in allowed:
        raise ConfigError("dtype", f"expected one of [{', '.join(allowed)}], got '{name}'")
    return DTYPES[name]


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory the benchmark can use: the GPU's total, or this machine's physical memory
    on CPU (None where the OS does not say). Shapes whose lower bound exceeds it are refused."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


def describe_device(device: torch.device) -> str:
    """The machine in words, for the output's header."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda}, torch {torch.__version__})"
    return (f"CPU {_cpu_model()} ({os.cpu_count()} cores, {torch.get_num_threads()} thread(s) used, "
            f"torch {torch.__version__})")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes: CUDA events around it on a GPU, ``perf_counter`` on CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def peak_allocated(fn: Callable[[], object], device: torch.device) -> int:
    """CUDA bytes allocated at the peak of one call of ``fn`` above what was allocated before it
    (``torch.cuda.max_memory_allocated``: tensors only, not the CUDA context or the allocator's cache)."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def triton_autotune() -> dict[str, str | None] | None:
    """The config Triton's autotuner last chose for each DIFF V1 kernel (``triton_diff.chosen_configs``);
    read right after a shape's first forward+backward, that shape's choice. None without Triton."""
    try:
        from diffsweep_kernels import triton_diff
    except ImportError:
        return None
    return triton_diff.chosen_configs()


def failure_reason(exc: BaseException) -> str:
    """One line for a row that could not run (out of memory, no kernel for these inputs)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return "out of memory"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"failed: {type(exc).__name__}: {first}"[:500]
