"""GPU tests: skip without CUDA, or fail instead under ``DIFFSWEEP_REQUIRE_GPU=1`` (the GPU
validation run sets it, so a GPU that torch cannot see is a failure, not a quiet skip).

A test that needs CUDA carries the ``gpu`` marker and ``needs_cuda`` (or calls ``require_cuda()``)::

    @pytest.mark.gpu
    @needs_cuda
    def test_x(): ...

Skips for something the GPU machine cannot have (the flash-attn package) stay skips, with the reason.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_GPU_ENV = "DIFFSWEEP_REQUIRE_GPU"


def missing_cuda() -> str | None:
    """Why CUDA tests cannot run here, or ``None`` when torch sees a CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    return f"needs a CUDA GPU, and torch {torch.__version__} sees none"


def skip_or_fail(reason: str, require_env: str = REQUIRE_GPU_ENV) -> None:
    """Skip the calling test (or module) with ``reason``; fail instead when ``require_env`` is 1
    (DIFFSWEEP_REQUIRE_GPU on the GPU machine, DIFFSWEEP_REQUIRE_KIT in CI for the device kit)."""
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{reason}, and {require_env}=1")
    pytest.skip(reason, allow_module_level=True)


def require_cuda() -> None:
    """Skip the calling test without a CUDA GPU; fail instead under DIFFSWEEP_REQUIRE_GPU=1."""
    reason = missing_cuda()
    if reason is not None:
        skip_or_fail(reason)


# The ``cuda`` fixture (tests/conftest.py) calls ``require_cuda``.
needs_cuda = pytest.mark.usefixtures("cuda")
