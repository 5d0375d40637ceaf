"""Every backend against the pure-PyTorch reference (house rule 10): outputs and all gradients,
with tolerances set relative to the reference's own error at that precision."""

from __future__ import annotations

import pytest
import torch

from diffsweep.config import Backend
from diffsweep.model.attention.backends import BACKENDS, AttentionCall
from diffsweep_kernels import reference
from tests.helpers.gpu import needs_cuda

SHAPES = [  # (B, Hq, Hkv, T, Dqk, Dv): MHA, GQA, DIFF V1's 2d-wide V, GQA + wide V
    (2, 4, 4, 33, 16, 16),
    (2, 4, 2, 33, 16, 16),
    (2, 4, 4, 33, 16, 32),
    (1, 4, 1, 40, 16, 32),
]


def _inputs(shape, device, seed=0):
    B, Hq, Hkv, T, D, Dv = shape
    g = torch.Generator().manual_seed(seed)
    # Scaled so softmax is far from uniform: a wrong mask or pairing changes the output a lot.
    q1, q2 = (torch.randn(B, Hq, T, D, generator=g) * 2 for _ in range(2))
    k1, k2 = (torch.randn(B, Hkv, T, D, generator=g) * 2 for _ in range(2))
    v = torch.randn(B, Hkv, T, Dv, generator=g)
    lam = torch.tensor(0.6)
    return [t.to(device) for t in (q1, k1, q2, k2, v, lam)]


def _run(fn, tensors, dtype):
    """Output and gradients of ``fn`` (inputs cast to ``dtype``), all as fp64 for comparison."""
    # λ stays fp32 as in the model (DIFF V1 computes it from fp32 parameters, outside autocast).
    leaves = [t.detach().to(dtype if t.dim() else torch.promote_types(dtype, torch.float32)).requires_grad_()
              for t in tensors]
    out = fn(*leaves)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device, dtype)
    out.backward(grad_out)
    grads = [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves]  # unused inputs
    return [out.detach().double()] + [grad.double() for grad in grads]


def _diff(backend, dtype):
    scale = lambda q: q.shape[-1] ** -0.5  # noqa: E731
    if backend is None:  # the ground truth: reference with fp32 math
        return lambda q1, k1, q2, k2, v, lam: reference.diff_attention(q1, k1, q2, k2, v, lam, scale=scale(q1),
                                                                        upcast=True)
    return lambda q1, k1, q2, k2, v, lam: backend.diff_attend(q1, k1, q2, k2, v, lam, scale=scale(q1))


def _attend(backend):
    return lambda q1, k1, q2, k2, v, lam: backend.attend(q1, k1, v[..., : q1.shape[-1]], scale=q1.shape[-1] ** -0.5)


def _check(device, backend_name, shape, dtype, op):
    tensors = _inputs(shape, device)
    backend = BACKENDS[backend_name]
    if op == "diff":
        truth = _run(_diff(None, torch.float64), tensors, torch.float64)
        ref_low = _run(_diff(BACKENDS[Backend.REFERENCE], dtype), tensors, dtype)
        got = _run(_diff(backend, dtype), tensors, dtype)
    else:
        truth = _run(_attend(BACKENDS[Backend.REFERENCE]), tensors, torch.float64)
        ref_low = _run(_attend(BACKENDS[Backend.REFERENCE]), tensors, dtype)
        got = _run(_attend(backend), tensors, dtype)
    names = ["out", "dq1", "dk1", "dq2", "dk2", "dv", "dlam"]
    for name, t, r, g in zip(names, truth, ref_low, got):
        if op == "attend" and name in ("dq2", "dk2", "dlam"):
            continue  # not inputs of plain attention
        ref_err = (r - t).abs().max().item()
        err = (g - t).abs().max().item()
        # At most 2x the reference's own error at this precision, plus a few units of rounding of
        # the result itself (a lucky reference can be almost exact on a single scalar).
        floor = 4 * torch.finfo(dtype).eps * max(1.0, t.abs().max().item())
        if err > 2 * ref_err + floor and device == "cuda" and (backend_name == Backend.SDPA or op == "attend"):
            # Seen on H100 and H200 (torch 2.11): PyTorch's default SDPA kernel now and then gives
            # a wrong dq at these tiny shapes inside this suite, never in 800 calls alone
            # (analysis/gpu/sdpa_check.py). Say which kernel, and whether it repeats.
            again = _sdpa_reruns(backend, op, tensors, dtype, names.index(name), t)
            pytest.fail(f"{backend_name} {op} {name}: err {err:.2e} vs reference {ref_err:.2e}; the same "
                        f"inputs again with SDPA's kernel forced: {again}")
        assert err <= 2 * ref_err + floor, f"{backend_name} {op} {name}: err {err:.2e} vs reference {ref_err:.2e}"


def _sdpa_reruns(backend, op, tensors, dtype, index, truth) -> str:
    """The error of gradient ``index`` when the failed call is repeated with each SDPA kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fn = _diff(backend, dtype) if op == "diff" else _attend(backend)
    errors = []
    for kernel in (None, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                   SDPBackend.MATH):
        try:
            with sdpa_kernel([kernel]) if kernel is not None else torch.enable_grad():
                err = (_run(fn, tensors, dtype)[index] - truth).abs().max().item()
            errors.append(f"{'default' if kernel is None else kernel.name.lower()} {err:.2e}")
        except RuntimeError:  # this kernel does not take these inputs
            errors.append(f"{kernel.name.lower()} unsupported")
    return ", ".join(errors)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["attend", "diff"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_sdpa_matches_reference_on_cpu(shape, op, dtype):
    _check("cpu", Backend.SDPA, shape, dtype, op)


def _triton_unavailable(device: str, dtype: torch.dtype) -> str | None:
    triton = BACKENDS[Backend.TRITON]
    return triton.unavailable_reason() or triton.unsupported_reason(
        AttentionCall(4, 4, 16, 32, True), torch.device(device), dtype)


@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU machine: the compiled kernel is tested below")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_triton_matches_reference_in_the_interpreter(shape, dtype):
    """The fused kernel's logic (tiles, masks, online softmax, backward, dλ) in Triton's CPU
    interpreter, which tests/conftest.py switches on without a GPU. No bf16: the interpreter
    computes it wrongly (covered on GPU)."""
    assert _triton_unavailable("cpu", dtype) is None, _triton_unavailable("cpu", dtype)
    _check("cpu", Backend.TRITON, shape, dtype, "diff")


def test_check_is_sensitive_to_a_wrong_mask():
    """The comparison above catches a non-causal kernel (so it is not a test that cannot fail)."""

    class NonCausal(type(BACKENDS[Backend.SDPA])):
        def attend(self, q, k, v, *, scale):
            return torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(q.shape[1] // k.shape[1], 1),
                v.repeat_interleave(q.shape[1] // k.shape[1], 1), scale=scale)

    BACKENDS["noncausal"] = NonCausal()
    try:
        with pytest.raises(AssertionError, match="err"):
            _check("cpu", "noncausal", SHAPES[2], torch.bfloat16, "diff")
    finally:
        del BACKENDS["noncausal"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["attend", "diff"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_sdpa_matches_reference_on_gpu(shape, op, dtype):
    _check("cuda", Backend.SDPA, shape, dtype, op)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and BACKENDS[Backend.FLASH].unavailable_reason() is not None,
                    reason=f"flash backend {BACKENDS[Backend.FLASH].unavailable_reason()}")  # no CUDA: needs_cuda
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["attend", "diff"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_flash_matches_reference_on_gpu(shape, op, dtype):
    _check("cuda", Backend.FLASH, shape, dtype, op)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and _triton_unavailable("cuda", torch.bfloat16) is not None,
                    reason=f"triton backend {_triton_unavailable('cuda', torch.bfloat16)}")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["attend", "diff"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_triton_matches_reference_on_gpu(shape, op, dtype):
    _check("cuda", Backend.TRITON, shape, dtype, op)
