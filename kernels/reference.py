"""Pure-PyTorch attention: the ground truth for every other kernel.

Layout (the same as torch SDPA): q ``(B, Hq, T, Dqk)``, k ``(B, Hkv, T, Dqk)``,
v ``(B, Hkv, T, Dv)``, output ``(B, Hq, T, Dv)``. Attention is causal. Grouped-query attention:
``Hkv`` divides ``Hq`` and query head ``j`` uses K/V head ``j // (Hq // Hkv)`` (groups are
contiguous, as in flash-attn and SDPA's ``enable_gqa``). ``Dv`` may differ from ``Dqk``.
"""

from __future__ import annotations

import torch


def _expand_kv(x: torch.Tensor, num_q_heads: int) -> torch.Tensor:
    num_kv_heads = x.shape[1]
    assert num_q_heads % num_kv_heads == 0, f"{num_kv_heads} KV heads do not divide {num_q_heads} query heads"
    return x.repeat_interleave(num_q_heads // num_kv_heads, dim=1)


def attention_probs(q: torch.Tensor, k: torch.Tensor, *, scale: float, upcast: bool = False) -> torch.Tensor:
    """Causal softmax(q k^T * scale) of shape ``(B, Hq, T, T)``; at least fp32 internally when ``upcast``."""
    k = _expand_kv(k, q.shape[1])
    if upcast:  # at least fp32; fp64 stays fp64
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(dtype), k.to(dtype)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    t_q, t_k = q.shape[-2], k.shape[-2]
    future = torch.ones(t_q, t_k, dtype=torch.bool, device=q.device).triu(1 + t_k - t_q)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, upcast: bool = False) -> torch.Tensor:
    """Causal softmax attention. With ``upcast`` the math runs in (at least) fp32 and the result is cast back."""
    probs = attention_probs(q, k, scale=scale, upcast=upcast)
    out = torch.matmul(probs, _expand_kv(v, q.shape[1]).to(probs.dtype))
    return out.to(q.dtype)


def diff_attention(
    q1: torch.Tensor,
    k1: torch.Tensor,
    q2: torch.Tensor,
    k2: torch.Tensor,
    v: torch.Tensor,
    lam: torch.Tensor,
    *,
    scale: float,
    upcast: bool = False,
) -> torch.Tensor:
    """Differential attention (paper eq. 1): ``(softmax(q1 k1^T s) - lam * softmax(q2 k2^T s)) v``.

    ``lam`` is a scalar tensor (DIFF V1's per-layer λ) or anything broadcastable to
    ``(B, Hq, T, 1)``. ``v`` is typically twice as wide as q/k (2d).
    """
    # Both maps multiply V separately (as every practical kernel executes it), then subtract.
    v = _expand_kv(v, q1.shape[1])
    p1 = attention_probs(q1, k1, scale=scale, upcast=upcast)
    p2 = attention_probs(q2, k2, scale=scale, upcast=upcast)
    v = v.to(p1.dtype)
    out = torch.matmul(p1, v) - lam.to(p1.dtype) * torch.matmul(p2, v)
    return out.to(q1.dtype)


# The outputs a DIFF V1 kernel is checked on: its output and the gradient of every input.
CHECKED = ("out", "dq1", "dk1", "dq2", "dk2", "dv", "dlam")
# Beyond twice the reference's own error, a kernel may differ by a few units of rounding of the
# largest true value: of fp32, where it accumulates (another summation order; with one key,
# dS = P(dP - Δ) is an exact zero it reaches by cancellation), and of the input dtype, where it
# rounds its result once (a lucky reference can be almost exact, as on the scalar dλ). In bf16 that
# is 1.6 % of the largest value, not 16 bf16 ulps (12.5 %), which would hide a wrong tile.
FP32_ULPS, DTYPE_ULPS = 16, 2


def outputs_and_grads(fn, tensors: list[torch.Tensor], dtype: torch.dtype, device: str | torch.device,
                      grad_seed: int = 7) -> list[torch.Tensor]:
    """``fn(q1, k1, q2, k2, v, lam)``'s output and the gradient of each input for a fixed random
    output gradient, as fp64 on the CPU. Inputs are cast to ``dtype`` on ``device``; λ stays fp32
    (the model computes it from fp32 parameters) unless ``dtype`` is fp64."""
    leaves = [t.detach().to(device, dtype if t.dim() else torch.promote_types(dtype, torch.float32))
              .requires_grad_() for t in tensors]
    out = fn(*leaves)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed)).to(device, dtype)
    out.backward(grad)
    grads = [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves]
    return [out.detach().double().cpu()] + [g.double().cpu() for g in grads]


def compare(truth: list[torch.Tensor], reference_low: list[torch.Tensor], got: list[torch.Tensor],
            dtype: torch.dtype) -> dict[str, dict]:
    """The tolerance rule for a kernel (house rule 10), per checked tensor: its largest error against
    the fp64 ``truth`` must be at most twice the reference's own at ``dtype`` plus a few units of
    rounding of the largest true value (``FP32_ULPS``, ``DTYPE_ULPS``), and every value finite."""
    ulps = FP32_ULPS * torch.finfo(torch.float32).eps + DTYPE_ULPS * torch.finfo(dtype).eps
    checks = {}
    for name, t, r, g in zip(CHECKED, truth, reference_low, got):
        err, ref_err = (g - t).abs().max().item(), (r - t).abs().max().item()
        bound = 2 * ref_err + ulps * max(1.0, t.abs().max().item())
        finite = bool(torch.isfinite(g).all())
        checks[name] = {"err": err, "ref_err": ref_err, "bound": bound, "finite": finite,
                        "ok": finite and err <= bound}
    return checks
