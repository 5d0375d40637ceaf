"""Compile the fused DIFF kernels for an NVIDIA GPU on any machine, no GPU needed, and report each
config's shared memory, registers and register spills (from ``ptxas -v``, which ships in the
triton wheel).

Triton's interpreter checks the kernels' arithmetic on CPU but not what only the GPU compiler
sees: ``tl.dot`` shape rules, shared-memory limits, register pressure. This does. Must run in a
process without ``TRITON_INTERPRET`` (the kernels would be interpreted functions).

    python -m diffsweep_kernels.compile_report --dtype bf16 --qk-dim 128 --v-dim 256
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.autotuner import Autotuner

from diffsweep_kernels import triton_configs, triton_diff

SM90_SHARED_LIMIT = 227 * 1024  # bytes of shared memory one H100 block may use
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class Compiled:
    kernel: str
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    shared_bytes: int
    registers: int
    spill_bytes: int

    @property
    def fits(self) -> bool:
        return self.shared_bytes <= SM90_SHARED_LIMIT


STRIDES = ["stride_qb", "stride_qh", "stride_qt", "stride_kb", "stride_kh", "stride_kt",
           "stride_vb", "stride_vh", "stride_vt"]
FP32_POINTERS = {"LAM", "LSE1", "LSE2", "DELTA1", "R"}
POINTERS = {
    "pre": ["O", "O2", "DO", "LAM", "DELTA1", "R"],
    "fwd": ["Q1", "K1", "Q2", "K2", "V", "LAM", "O", "O2", "LSE1", "LSE2"],
    "dkdv": ["Q1", "K1", "Q2", "K2", "V", "LAM", "DO", "LSE1", "LSE2", "DELTA1", "R", "DK1", "DK2", "DV_"],
    "dq": ["Q1", "K1", "Q2", "K2", "V", "LAM", "DO", "LSE1", "LSE2", "DELTA1", "R", "DQ1", "DQ2"],
}
KERNELS = {"pre": triton_diff._bwd_preprocess, "fwd": triton_diff._fwd_kernel, "dkdv": triton_diff._dkdv_kernel,
           "dq": triton_diff._dq_kernel}
CONFIGS = triton_configs.ALL_CONFIGS  # every config, whatever DIFFSWEEP_TRITON_AUTOTUNE selects for runs


def _signature(kernel: str, dtype: torch.dtype, constexprs: dict) -> dict[str, str]:
    pointer = "*" + TRITON_TYPES[dtype]
    sig = {name: "*fp32" if name in FP32_POINTERS else pointer for name in POINTERS[kernel]}
    do_strides = ["stride_dob", "stride_doh", "stride_dot"]
    if kernel == "pre":
        return sig | {name: "i32" for name in do_strides + ["H", "T"]} | {name: "constexpr" for name in constexprs}
    strides = STRIDES + (do_strides if kernel != "fwd" else [])
    sig |= {name: "i32" for name in strides} | {"H": "i32", "T": "i32", "sm_scale": "fp32"}
    return sig | {name: "constexpr" for name in constexprs}


def compile_preprocess(dtype: torch.dtype, v_dim: int, arch: int = 90) -> Compiled:
    """The backward's row-sum kernel, with the tile the wrapper picks for ``v_dim``."""
    dims = triton_diff._dims(1, 16, v_dim, dtype)
    rows = triton_diff._preprocess_rows(dims["BLOCK_DV"])
    config = triton.Config({"BLOCK_M": rows, "BLOCK_N": 0}, num_warps=4, num_stages=1)
    return compile_config("pre", config, dtype, 16, v_dim, arch=arch)


def compile_config(kernel: str, config: triton.Config, dtype: torch.dtype, qk_dim: int, v_dim: int,
                   group: int = 1, arch: int = 90) -> Compiled:
    """Compile one autotune config of ``kernel`` ("fwd", "dkdv" or "dq") to a cubin for ``sm_{arch}``."""
    if triton_diff.INTERPRET:
        raise RuntimeError("compile_report needs a process without TRITON_INTERPRET=1")
    constexprs = triton_diff._dims(group, qk_dim, v_dim, dtype) | config.kwargs
    if kernel == "pre":
        constexprs = {"DV": v_dim, "BLOCK_DV": constexprs["BLOCK_DV"], "BLOCK_M": config.kwargs["BLOCK_M"]}
    jit = KERNELS[kernel]
    if isinstance(jit, Autotuner):
        jit = jit.fn  # the JITFunction it tunes
    source = ASTSource(fn=jit, signature=_signature(kernel, dtype, constexprs), constexprs=constexprs)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "kernel.ptx"
        ptx.write_text(compiled.asm["ptx"])
        suffix = "a" if arch >= 90 else ""
        log = subprocess.run([str(ptxas), "-v", f"--gpu-name=sm_{arch}{suffix}", str(ptx), "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    return Compiled(kernel, config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps,
                    config.num_stages, compiled.metadata.shared, int(registers.group(1)) if registers else -1,
                    int(spills.group(1)) if spills else 0)


def report(dtype: torch.dtype, qk_dim: int, v_dim: int, group: int = 1, kernels=("fwd", "dkdv", "dq")) -> list[Compiled]:
    """Every autotune config of each kernel, compiled for H100 (the configs a GPU would time)."""
    return [compile_preprocess(dtype, v_dim)] + [
        compile_config(k, c, dtype, qk_dim, v_dim, group) for k in kernels for c in CONFIGS[k]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--qk-dim", type=int, default=128)
    parser.add_argument("--v-dim", type=int, default=256)
    parser.add_argument("--group", type=int, default=1, help="query heads per K/V head (GQA)")
    args = parser.parse_args()
    print(f"sm_90, {args.dtype}, QK dim {args.qk_dim}, V dim {args.v_dim}, GQA group {args.group}")
    print(f"{'kernel':6} {'M':>4} {'N':>4} {'warps':>5} {'stages':>6} {'shared KiB':>10} {'regs':>5} {'spill B':>8}")
    dims = triton_diff._dims(args.group, args.qk_dim, args.v_dim, DTYPES[args.dtype])
    for row in report(DTYPES[args.dtype], args.qk_dim, args.v_dim, args.group):
        d = asdict(row)
        note = "" if row.fits else "  (over the shared-memory limit: the autotuner skips it)"
        if row.kernel != "pre" and not triton_configs.tile_fits(row.block_m, row.block_n, dims["BLOCK_DV"]):
            note += "  (pruned for this V dim: never timed)"
        print(f"{d['kernel']:6} {d['block_m']:>4} {d['block_n']:>4} {d['num_warps']:>5} {d['num_stages']:>6} "
              f"{d['shared_bytes'] / 1024:>10.0f} {d['registers']:>5} {d['spill_bytes']:>8}{note}")


if __name__ == "__main__":
    main()
