"""The fused kernel's autotune configs (``triton_diff``): tile sizes per kernel, which fit a wide V,
and ``DIFFSWEEP_TRITON_AUTOTUNE`` (read at import): ``all`` (default) autotunes over every config;
``first`` gives each kernel one config, so correctness runs compile a few kernels instead of
hundreds (the tests set it; a test checks every config on its own)."""

from __future__ import annotations

import os

import triton

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Largest head dims (tiles are padded to the next power of two of at least 16, and masked).
MAX_QK_DIM = 256
MAX_V_DIM = 512


def _configs(blocks: list[tuple[int, int, int, int]], interpret: tuple[int, int]) -> list[triton.Config]:
    """Autotune configs ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``. The interpreter cannot
    autotune (it has no timer), so it gets one config with unequal, small blocks, which the tests
    need to exercise tails and the diagonal split."""
    if INTERPRET:
        return [triton.Config({"BLOCK_M": interpret[0], "BLOCK_N": interpret[1]}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in blocks]


def tile_fits(block_m: int, block_n: int, block_dv: int) -> bool:
    """Two fp32 accumulators of BLOCK_M × Dv: with Dv ≥ 256 only tiles up to 64 fit in registers."""
    return block_dv < 256 or (block_m <= 64 and block_n <= 64)


def prune_wide_v(configs, named_args, **kwargs):
    """The autotuner's pruner: drops configs whose tiles do not fit (see ``tile_fits``). It passes
    positional arguments in ``named_args`` and keyword ones, such as the constexpr ``BLOCK_DV``,
    as keywords."""
    block_dv = {**named_args, **kwargs}["BLOCK_DV"]
    kept = [c for c in configs if tile_fits(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], block_dv)]
    return kept or configs


# Query tiles are multiples of key tiles in the forward and dQ kernels (and the reverse in dK/dV),
# so every tile left of the diagonal is whole and needs no causal mask. The lists were chosen from
# `python -m diffsweep_kernels.compile_report` (sm_90 shared memory, registers and spills at head
# dims 128/256, analysis/benchmarks/RESULTS.md); on a GPU the autotuner times them per shape.
FWD_BLOCKS = [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 8, 2), (64, 64, 4, 2), (64, 32, 8, 2), (64, 16, 8, 2),
              (32, 32, 4, 2), (32, 16, 4, 2)]
# In dK/dV, BLOCK_N is the key tile a program owns and BLOCK_M the query step.
DKDV_BLOCKS = [(32, 128, 8, 2), (64, 128, 8, 2), (16, 64, 8, 2), (32, 64, 8, 2), (64, 64, 8, 2), (32, 32, 8, 2),
               (16, 32, 4, 2)]
DQ_BLOCKS = [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 8, 2), (64, 16, 8, 2), (32, 32, 4, 2),
             (32, 16, 4, 2)]
ALL_CONFIGS = {"fwd": _configs(FWD_BLOCKS, interpret=(32, 16)), "dkdv": _configs(DKDV_BLOCKS, interpret=(16, 32)),
               "dq": _configs(DQ_BLOCKS, interpret=(32, 16))}

AUTOTUNE_ENV = "DIFFSWEEP_TRITON_AUTOTUNE"
AUTOTUNE_MODES = ("all", "first")


def read_autotune_mode(value: str | None) -> str:
    """The value of ``DIFFSWEEP_TRITON_AUTOTUNE`` (unset: ``all``), checked."""
    if value is None:
        return "all"
    if value not in AUTOTUNE_MODES:
        raise ValueError(f"{AUTOTUNE_ENV}: expected one of [{', '.join(AUTOTUNE_MODES)}], got {value!r}")
    return value


def first_that_fits_every_shape(configs: list[triton.Config]) -> list[triton.Config]:
    """The first config whose tiles fit the widest V. With a single config the autotuner neither
    times nor prunes (it runs ``configs[0]`` as is), so that one config must fit every shape."""
    return [next(c for c in configs if tile_fits(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], MAX_V_DIM))]


AUTOTUNE_MODE = read_autotune_mode(os.environ.get(AUTOTUNE_ENV))
# The configs each kernel's autotuner tries (one per kernel in the interpreter, or under ``first``).
CONFIGS = {name: configs if AUTOTUNE_MODE == "all" else first_that_fits_every_shape(configs)
           for name, configs in ALL_CONFIGS.items()}


def autotune_mode() -> str:
    """``all`` or ``first``: what ``DIFFSWEEP_TRITON_AUTOTUNE`` said when this module was imported."""
    return AUTOTUNE_MODE


def format_config(config: triton.Config) -> str:
    """``BLOCK_M=64 BLOCK_N=64 warps=8 stages=2``."""
    return (f"BLOCK_M={config.kwargs['BLOCK_M']} BLOCK_N={config.kwargs['BLOCK_N']} warps={config.num_warps} "
            f"stages={config.num_stages}")
