"""Fused DIFF V1 attention in Triton: ``out = (softmax(q1 k1ᵀ s) − λ softmax(q2 k2ᵀ s)) v``, causal.

Layout as ``reference.diff_attention``: q1/q2 ``(B, Hq, T, D)``, k1/k2 ``(B, Hkv, T, D)``,
v ``(B, Hkv, T, Dv)`` (Dv is 2D in DIFF V1, any power of two works), λ a 0-dim tensor, output
``(B, Hq, T, Dv)``. GQA with contiguous groups. fp16/bf16/fp32 inputs, fp32 accumulation.

Forward (one program per query tile and head): both softmax maps run their own online softmax
against the same K1/K2/V tiles, V is loaded once per tile, and the kernel writes
``O1 − λ·O2``. It also keeps O2 and both log-sum-exps for the backward.

Backward (FlashAttention-2 style, two kernels, no atomics):

- ``Δ1 = rowsum(dO∘O1) = rowsum(dO∘O) + λ·r`` and ``r = rowsum(dO∘O2)``; ``dλ = −Σ r``.
- dK/dV kernel, one program per key tile and K/V head, looping over the head's query group:
  ``dV += (P1 − λP2)ᵀ dO`` (one matmul for both maps), ``dP = dO Vᵀ`` (shared by both maps),
  ``dS1 = P1∘(dP − Δ1)``, ``dS2 = −λ·P2∘(dP − r)``, ``dK1 += dS1ᵀ Q1``, ``dK2 += dS2ᵀ Q2``.
- dQ kernel, one program per query tile and head: ``dQ1 += dS1 K1``, ``dQ2 += dS2 K2``.

``diff_attention`` is a ``torch.library.triton_op`` (``diffsweep::diff_attention``) with its
autograd registered, so ``torch.compile`` traces models that call it on a GPU.

Triton's CPU interpreter runs these kernels when ``TRITON_INTERPRET=1`` is set before this module
is imported (the tests do). It computes bf16 wrongly, so test there in fp32/fp16 only.

The autotune configs, and ``DIFFSWEEP_TRITON_AUTOTUNE`` which picks among them, are in ``triton_configs``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from diffsweep_kernels.triton_configs import CONFIGS, INTERPRET, MAX_QK_DIM, MAX_V_DIM, format_config, prune_wide_v

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FWD_CONFIGS, DKDV_CONFIGS, DQ_CONFIGS = CONFIGS["fwd"], CONFIGS["dkdv"], CONFIGS["dq"]


@triton.jit
def _kv_tile(k1_ptr, k2_ptr, v_ptr, stride_kt, stride_vt, offs_n, offs_d, offs_dv, d_cols, dv_cols, T):
    """K1, K2 and V rows ``offs_n`` of one K/V head (zeros past the sequence and the head dims)."""
    keys = offs_n[:, None] < T
    k1 = tl.load(k1_ptr + offs_n[:, None] * stride_kt + offs_d[None, :], mask=keys & d_cols, other=0.0)
    k2 = tl.load(k2_ptr + offs_n[:, None] * stride_kt + offs_d[None, :], mask=keys & d_cols, other=0.0)
    v = tl.load(v_ptr + offs_n[:, None] * stride_vt + offs_dv[None, :], mask=keys & dv_cols, other=0.0)
    return k1, k2, v


@triton.jit
def _q_tile(Q1, Q2, q_base, stride_qt, offs_m, offs_d, rows, d_cols):
    """Q1 and Q2 rows ``offs_m`` of one query head."""
    q_off = q_base + offs_m[:, None] * stride_qt + offs_d[None, :]
    return tl.load(Q1 + q_off, mask=rows & d_cols, other=0.0), tl.load(Q2 + q_off, mask=rows & d_cols, other=0.0)


@triton.jit
def _row_stats(LSE1, LSE2, DELTA1, R, row_base, offs_m, T):
    """The forward's log-sum-exps and the backward's Δ1 and r for query rows ``offs_m`` (rows past
    the sequence get lse = +inf, so their probabilities are 0)."""
    in_seq = offs_m < T
    lse1 = tl.load(LSE1 + row_base + offs_m, mask=in_seq, other=float("inf"))
    lse2 = tl.load(LSE2 + row_base + offs_m, mask=in_seq, other=float("inf"))
    delta1 = tl.load(DELTA1 + row_base + offs_m, mask=in_seq, other=0.0)
    r = tl.load(R + row_base + offs_m, mask=in_seq, other=0.0)
    return lse1, lse2, delta1, r


@triton.jit
def _fwd_tiles(acc1, l1, m1, acc2, l2, m2, q1, q2, k1_ptr, k2_ptr, v_ptr, stride_kt, stride_vt,
               offs_m, offs_d, offs_dv, d_cols, dv_cols, lo, hi, T, qk_scale,
               BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k1, k2, v = _kv_tile(k1_ptr, k2_ptr, v_ptr, stride_kt, stride_vt, offs_n, offs_d, offs_dv, d_cols, dv_cols, T)
        s1 = tl.dot(q1, tl.trans(k1), input_precision=PRECISION) * qk_scale
        s2 = tl.dot(q2, tl.trans(k2), input_precision=PRECISION) * qk_scale
        if CAUSAL_MASK:
            future = offs_m[:, None] < offs_n[None, :]
            s1 = tl.where(future, float("-inf"), s1)
            s2 = tl.where(future, float("-inf"), s2)
        # Map 1: online softmax (log2 domain).
        m1_new = tl.maximum(m1, tl.max(s1, 1))
        p1 = tl.math.exp2(s1 - m1_new[:, None])
        alpha1 = tl.math.exp2(m1 - m1_new)
        l1 = l1 * alpha1 + tl.sum(p1, 1)
        acc1 = acc1 * alpha1[:, None] + tl.dot(p1.to(v.dtype), v, input_precision=PRECISION)
        m1 = m1_new
        # Map 2, against the same V tile.
        m2_new = tl.maximum(m2, tl.max(s2, 1))
        p2 = tl.math.exp2(s2 - m2_new[:, None])
        alpha2 = tl.math.exp2(m2 - m2_new)
        l2 = l2 * alpha2 + tl.sum(p2, 1)
        acc2 = acc2 * alpha2[:, None] + tl.dot(p2.to(v.dtype), v, input_precision=PRECISION)
        m2 = m2_new
    return acc1, l1, m1, acc2, l2, m2


@triton.autotune(configs=FWD_CONFIGS, key=["T", "D", "DV", "GROUP"], prune_configs_by={"early_config_prune": prune_wide_v})
@triton.jit
def _fwd_kernel(Q1, K1, Q2, K2, V, LAM, O, O2, LSE1, LSE2,
                stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                stride_vb, stride_vh, stride_vt,
                H, T, sm_scale,
                GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kv = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)  # head dims padded to powers of two, masked
    offs_dv = tl.arange(0, BLOCK_DV)
    d_cols = offs_d[None, :] < D
    dv_cols = offs_dv[None, :] < DV
    rows = offs_m[:, None] < T
    q1, q2 = _q_tile(Q1, Q2, b * stride_qb + h * stride_qh, stride_qt, offs_m, offs_d, rows, d_cols)
    k1_ptr = K1 + b * stride_kb + kv * stride_kh
    k2_ptr = K2 + b * stride_kb + kv * stride_kh
    v_ptr = V + b * stride_vb + kv * stride_vh
    lam = tl.load(LAM).to(tl.float32)
    # fp32 whatever the caller passed: torch.compile hands a Python float over as fp64, which would
    # make the loop-carried accumulators fp64.
    sm_scale = tl.cast(sm_scale, tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp2 instead of exp
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    diag = start_m * BLOCK_M
    # Key tiles wholly in the past: no mask. Then the diagonal tiles, masked.
    acc1, l1, m1, acc2, l2, m2 = _fwd_tiles(acc1, l1, m1, acc2, l2, m2, q1, q2, k1_ptr, k2_ptr, v_ptr,
                                            stride_kt, stride_vt, offs_m, offs_d, offs_dv, d_cols, dv_cols, 0, diag, T,
                                            qk_scale, BLOCK_N, False, PRECISION)
    acc1, l1, m1, acc2, l2, m2 = _fwd_tiles(acc1, l1, m1, acc2, l2, m2, q1, q2, k1_ptr, k2_ptr, v_ptr,
                                            stride_kt, stride_vt, offs_m, offs_d, offs_dv, d_cols, dv_cols, diag,
                                            tl.minimum(diag + BLOCK_M, T), T, qk_scale, BLOCK_N, True,
                                            PRECISION)
    o1 = acc1 / l1[:, None]
    o2 = acc2 / l2[:, None]
    o_off = bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :]
    tl.store(O + o_off, (o1 - lam * o2).to(O.dtype.element_ty), mask=rows & dv_cols)
    tl.store(O2 + o_off, o2.to(O2.dtype.element_ty), mask=rows & dv_cols)
    in_seq = offs_m < T
    tl.store(LSE1 + bh * T + offs_m, m1 + tl.math.log2(l1), mask=in_seq)
    tl.store(LSE2 + bh * T + offs_m, m2 + tl.math.log2(l2), mask=in_seq)


@triton.autotune(configs=DKDV_CONFIGS, key=["T", "D", "DV", "GROUP"], prune_configs_by={"early_config_prune": prune_wide_v})
@triton.jit
def _dkdv_kernel(Q1, K1, Q2, K2, V, LAM, DO, LSE1, LSE2, DELTA1, R, DK1, DK2, DV_,
                 stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
                 stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
                 H, T, sm_scale,
                 GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    bkv = tl.program_id(1)
    HKV = H // GROUP
    b = bkv // HKV
    kv = bkv % HKV
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)  # head dims padded to powers of two, masked
    offs_dv = tl.arange(0, BLOCK_DV)
    d_cols = offs_d[None, :] < D
    dv_cols = offs_dv[None, :] < DV
    keys = offs_n[:, None] < T
    k_base = b * stride_kb + kv * stride_kh
    k1, k2, v = _kv_tile(K1 + k_base, K2 + k_base, V + b * stride_vb + kv * stride_vh, stride_kt, stride_vt,
                         offs_n, offs_d, offs_dv, d_cols, dv_cols, T)
    lam = tl.load(LAM).to(tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)  # fp32, as in _fwd_kernel
    qk_scale = sm_scale * 1.4426950408889634
    dk1 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dk2 = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    for g in range(GROUP):
        h = kv * GROUP + g
        bh = b * H + h
        q_base = b * stride_qb + h * stride_qh
        do_base = b * stride_dob + h * stride_doh
        # Query tiles from this key tile's diagonal to the end; the first BLOCK_N rows need the mask.
        for start_m in range(start_n, T, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            rows = offs_m[:, None] < T
            q1, q2 = _q_tile(Q1, Q2, q_base, stride_qt, offs_m, offs_d, rows, d_cols)
            do = tl.load(DO + do_base + offs_m[:, None] * stride_dot + offs_dv[None, :], mask=rows & dv_cols,
                         other=0.0)
            lse1, lse2, delta1, r = _row_stats(LSE1, LSE2, DELTA1, R, bh * T, offs_m, T)
            # Transposed tiles (keys × queries), as FlashAttention-2's dK/dV loop.
            p1t = tl.math.exp2(tl.dot(k1, tl.trans(q1), input_precision=PRECISION) * qk_scale - lse1[None, :])
            p2t = tl.math.exp2(tl.dot(k2, tl.trans(q2), input_precision=PRECISION) * qk_scale - lse2[None, :])
            if start_m < start_n + BLOCK_N:
                past = offs_m[None, :] >= offs_n[:, None]
                p1t = tl.where(past, p1t, 0.0)
                p2t = tl.where(past, p2t, 0.0)
            dv += tl.dot((p1t - lam * p2t).to(do.dtype), do, input_precision=PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            ds1t = p1t * (dpt - delta1[None, :])
            ds2t = -lam * p2t * (dpt - r[None, :])
            dk1 += tl.dot(ds1t.to(q1.dtype), q1, input_precision=PRECISION)
            dk2 += tl.dot(ds2t.to(q2.dtype), q2, input_precision=PRECISION)
    # dK, dV are written contiguous (B, Hkv, T, D|DV).
    dk_off = bkv * T * D + offs_n[:, None] * D + offs_d[None, :]
    tl.store(DK1 + dk_off, (dk1 * sm_scale).to(DK1.dtype.element_ty), mask=keys & d_cols)
    tl.store(DK2 + dk_off, (dk2 * sm_scale).to(DK2.dtype.element_ty), mask=keys & d_cols)
    tl.store(DV_ + bkv * T * DV + offs_n[:, None] * DV + offs_dv[None, :], dv.to(DV_.dtype.element_ty),
             mask=keys & dv_cols)


@triton.jit
def _dq_tiles(dq1, dq2, q1, q2, do, lse1, lse2, delta1, r, lam, k1_ptr, k2_ptr, v_ptr, stride_kt, stride_vt,
              offs_m, offs_d, offs_dv, d_cols, dv_cols, lo, hi, T, qk_scale,
              BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k1, k2, v = _kv_tile(k1_ptr, k2_ptr, v_ptr, stride_kt, stride_vt, offs_n, offs_d, offs_dv, d_cols, dv_cols, T)
        p1 = tl.math.exp2(tl.dot(q1, tl.trans(k1), input_precision=PRECISION) * qk_scale - lse1[:, None])
        p2 = tl.math.exp2(tl.dot(q2, tl.trans(k2), input_precision=PRECISION) * qk_scale - lse2[:, None])
        if CAUSAL_MASK:
            past = offs_m[:, None] >= offs_n[None, :]
            p1 = tl.where(past, p1, 0.0)
            p2 = tl.where(past, p2, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds1 = p1 * (dp - delta1[:, None])
        ds2 = -lam * p2 * (dp - r[:, None])
        dq1 += tl.dot(ds1.to(k1.dtype), k1, input_precision=PRECISION)
        dq2 += tl.dot(ds2.to(k2.dtype), k2, input_precision=PRECISION)
    return dq1, dq2


@triton.autotune(configs=DQ_CONFIGS, key=["T", "D", "DV", "GROUP"], prune_configs_by={"early_config_prune": prune_wide_v})
@triton.jit
def _dq_kernel(Q1, K1, Q2, K2, V, LAM, DO, LSE1, LSE2, DELTA1, R, DQ1, DQ2,
               stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
               stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
               H, T, sm_scale,
               GROUP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    kv = h // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)  # head dims padded to powers of two, masked
    offs_dv = tl.arange(0, BLOCK_DV)
    d_cols = offs_d[None, :] < D
    dv_cols = offs_dv[None, :] < DV
    rows = offs_m[:, None] < T
    q1, q2 = _q_tile(Q1, Q2, b * stride_qb + h * stride_qh, stride_qt, offs_m, offs_d, rows, d_cols)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dot + offs_dv[None, :],
                 mask=rows & dv_cols, other=0.0)
    lse1, lse2, delta1, r = _row_stats(LSE1, LSE2, DELTA1, R, bh * T, offs_m, T)
    lam = tl.load(LAM).to(tl.float32)
    sm_scale = tl.cast(sm_scale, tl.float32)  # fp32, as in _fwd_kernel
    qk_scale = sm_scale * 1.4426950408889634
    k1_ptr = K1 + b * stride_kb + kv * stride_kh
    k2_ptr = K2 + b * stride_kb + kv * stride_kh
    v_ptr = V + b * stride_vb + kv * stride_vh
    dq1 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dq2 = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    diag = start_m * BLOCK_M
    dq1, dq2 = _dq_tiles(dq1, dq2, q1, q2, do, lse1, lse2, delta1, r, lam, k1_ptr, k2_ptr, v_ptr,
                         stride_kt, stride_vt, offs_m, offs_d, offs_dv, d_cols, dv_cols, 0, diag, T, qk_scale,
                         BLOCK_N, False, PRECISION)
    dq1, dq2 = _dq_tiles(dq1, dq2, q1, q2, do, lse1, lse2, delta1, r, lam, k1_ptr, k2_ptr, v_ptr,
                         stride_kt, stride_vt, offs_m, offs_d, offs_dv, d_cols, dv_cols, diag, tl.minimum(diag + BLOCK_M, T), T,
                         qk_scale, BLOCK_N, True, PRECISION)
    dq_off = bh * T * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(DQ1 + dq_off, (dq1 * sm_scale).to(DQ1.dtype.element_ty), mask=rows & d_cols)
    tl.store(DQ2 + dq_off, (dq2 * sm_scale).to(DQ2.dtype.element_ty), mask=rows & d_cols)


@triton.jit
def _bwd_preprocess(O, O2, DO, LAM, DELTA1, R, stride_dob, stride_doh, stride_dot, H, T,
                    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr):
    """Per query row: ``r = rowsum(dO∘O2)`` and ``Δ1 = rowsum(dO∘O) + λ·r`` (= rowsum(dO∘O1))."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows = (offs_m[:, None] < T) & (offs_dv[None, :] < DV)
    o_off = bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :]
    o = tl.load(O + o_off, mask=rows, other=0.0).to(tl.float32)
    o2 = tl.load(O2 + o_off, mask=rows, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dot + offs_dv[None, :],
                 mask=rows, other=0.0).to(tl.float32)
    lam = tl.load(LAM).to(tl.float32)
    r = tl.sum(do * o2, 1)
    in_seq = offs_m < T
    tl.store(R + bh * T + offs_m, r, mask=in_seq)
    tl.store(DELTA1 + bh * T + offs_m, tl.sum(do * o, 1) + lam * r, mask=in_seq)


def _preprocess_rows(block_dv: int) -> int:
    return min(128, max(16, 8192 // block_dv))  # rows per program of the backward's row sums


def _dims(group: int, d: int, dv: int, dtype: torch.dtype) -> dict:
    """The compile-time arguments every kernel takes: the GQA group, head dims, their padded tiles,
    and the dot precision (fp32 inputs get exact fp32 dots, not TF32)."""
    return dict(GROUP=group, D=d, DV=dv, BLOCK_D=max(16, triton.next_power_of_2(d)),
                BLOCK_DV=max(16, triton.next_power_of_2(dv)), PRECISION="ieee" if dtype == torch.float32 else "tf32")


@triton_op("diffsweep::diff_attention_fwd", mutates_args={})
def _forward(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
             lam: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(out, o2, lse1, lse2)``; only ``out`` is for callers (the rest feeds the backward)."""
    B, H, T, D = q1.shape
    Hkv, DV = k1.shape[1], v.shape[-1]
    out = torch.empty((B, H, T, DV), device=q1.device, dtype=q1.dtype)
    o2 = torch.empty_like(out)
    lse1 = torch.empty((B, H, T), device=q1.device, dtype=torch.float32)
    lse2 = torch.empty_like(lse1)

    def grid(meta):
        return (triton.cdiv(T, meta["BLOCK_M"]), B * H)

    wrap_triton(_fwd_kernel)[grid](
        q1, k1, q2, k2, v, lam, out, o2, lse1, lse2,
        q1.stride(0), q1.stride(1), q1.stride(2), k1.stride(0), k1.stride(1), k1.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        H, T, scale, **_dims(H // Hkv, D, DV, q1.dtype))
    return out, o2, lse1, lse2


@triton_op("diffsweep::diff_attention_bwd", mutates_args={})
def _backward_op(dout: torch.Tensor, q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor,
                 v: torch.Tensor, lam: torch.Tensor, out: torch.Tensor, o2: torch.Tensor, lse1: torch.Tensor,
                 lse2: torch.Tensor, scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(dq1, dk1, dq2, dk2, dv, dlam)``."""
    B, H, T, D = q1.shape
    Hkv, DV = k1.shape[1], v.shape[-1]
    r = torch.empty((B, H, T), device=q1.device, dtype=torch.float32)
    delta1 = torch.empty_like(r)
    meta = _dims(H // Hkv, D, DV, q1.dtype)
    rows = _preprocess_rows(meta["BLOCK_DV"])
    wrap_triton(_bwd_preprocess)[(triton.cdiv(T, rows), B * H)](
        out, o2, dout, lam, delta1, r, dout.stride(0), dout.stride(1), dout.stride(2), H, T, DV=DV,
        BLOCK_DV=meta["BLOCK_DV"], BLOCK_M=rows)
    dlam = (-r.sum()).reshape(lam.shape).to(lam.dtype)
    dq1 = torch.empty((B, H, T, D), device=q1.device, dtype=q1.dtype)  # gradients are written contiguous
    dq2 = torch.empty_like(dq1)
    dk1 = torch.empty((B, Hkv, T, D), device=k1.device, dtype=k1.dtype)
    dk2 = torch.empty_like(dk1)
    dv = torch.empty((B, Hkv, T, DV), device=v.device, dtype=v.dtype)
    strides = (q1.stride(0), q1.stride(1), q1.stride(2), k1.stride(0), k1.stride(1), k1.stride(2),
               v.stride(0), v.stride(1), v.stride(2), dout.stride(0), dout.stride(1), dout.stride(2))

    def kv_grid(m):
        return (triton.cdiv(T, m["BLOCK_N"]), B * Hkv)

    def q_grid(m):
        return (triton.cdiv(T, m["BLOCK_M"]), B * H)

    wrap_triton(_dkdv_kernel)[kv_grid](q1, k1, q2, k2, v, lam, dout, lse1, lse2, delta1, r, dk1, dk2, dv,
                                       *strides, H, T, scale, **meta)
    wrap_triton(_dq_kernel)[q_grid](q1, k1, q2, k2, v, lam, dout, lse1, lse2, delta1, r, dq1, dq2,
                                    *strides, H, T, scale, **meta)
    return dq1, dk1, dq2, dk2, dv, dlam


def _setup_context(ctx, inputs, output):
    q1, k1, q2, k2, v, lam, scale = inputs
    out, o2, lse1, lse2 = output
    ctx.save_for_backward(q1, k1, q2, k2, v, lam, out, o2, lse1, lse2)
    ctx.scale = scale


def _backward(ctx, dout, _do2, _dlse1, _dlse2):
    q1, k1, q2, k2, v, lam, out, o2, lse1, lse2 = ctx.saved_tensors
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    grads = _backward_op(dout, q1, k1, q2, k2, v, lam, out, o2, lse1, lse2, ctx.scale)
    return (*grads, None)


_forward.register_autograd(_backward, setup_context=_setup_context)

# The autotuned kernels, by the names of ``CONFIGS``.
AUTOTUNED = {"fwd": _fwd_kernel, "dkdv": _dkdv_kernel, "dq": _dq_kernel}


def chosen_configs() -> dict[str, str | None]:
    """For each autotuned kernel (``fwd``, ``dkdv``, ``dq``), the config its autotuner chose at its
    last call (for the last shape it ran), or None before its first call."""
    chosen = {name: getattr(kernel, "best_config", None) for name, kernel in AUTOTUNED.items()}
    return {name: None if config is None else format_config(config) for name, config in chosen.items()}


@contextlib.contextmanager
def pinned_config(kernel: str, config: triton.Config) -> Iterator[None]:
    """Inside the block, ``kernel`` (``fwd``, ``dkdv`` or ``dq``) runs ``config`` and nothing else:
    the autotuner runs a lone config as is, without timing or pruning (so it must fit the shape;
    see ``tile_fits``). For tests that check each config; not thread-safe."""
    tuner = AUTOTUNED[kernel]
    saved = tuner.configs
    tuner.configs = [config]
    try:
        yield
    finally:
        tuner.configs = saved


def unsupported_reason(q_heads: int, kv_heads: int, qk_dim: int, v_dim: int, dtype: torch.dtype,
                       device: torch.device) -> str | None:
    """Why the kernel cannot run these shapes, or None. Checked at model-build time."""
    if device.type != "cuda" and not (INTERPRET and device.type == "cpu"):
        return (f"runs on CUDA devices (or on CPU in Triton's interpreter with TRITON_INTERPRET=1), "
                f"got device {device.type!r}")
    if dtype not in DTYPES:
        return f"needs fp16, bf16 or fp32 inputs, got {dtype}"
    if INTERPRET and dtype == torch.bfloat16:
        return "cannot run bf16 in Triton's CPU interpreter (it computes bf16 wrongly); use fp32 or fp16"
    if qk_dim > MAX_QK_DIM or v_dim > MAX_V_DIM:
        return f"needs head dims of at most {MAX_QK_DIM} (QK) and {MAX_V_DIM} (V), got {qk_dim}/{v_dim}"
    if q_heads % kv_heads:
        return f"needs the KV heads to divide the query heads, got {q_heads}/{kv_heads}"
    return None


def diff_attention(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, v: torch.Tensor,
                   lam: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Causal differential attention through the fused kernel (differentiable in every input)."""
    B, H, T, D = q1.shape
    if not (q2.shape == q1.shape and k1.shape == k2.shape and k1.shape[::2] == (B, T)
            and k1.shape[-1] == D and v.shape[:3] == k1.shape[:3] and lam.numel() == 1):
        raise ValueError(f"diff_attention: bad shapes q1 {tuple(q1.shape)} q2 {tuple(q2.shape)} k1 "
                         f"{tuple(k1.shape)} k2 {tuple(k2.shape)} v {tuple(v.shape)} lam {tuple(lam.shape)}")
    reason = unsupported_reason(H, k1.shape[1], D, v.shape[-1], q1.dtype, q1.device)
    if reason is not None:
        raise ValueError(f"diff_attention: {reason}")
    # The kernels take one set of strides for q1/q2 and one for k1/k2, with unit stride in the
    # head dim. DIFF V1's q1/q2 are slices of one projection, so this copies nothing there.
    if q1.stride() != q2.stride() or q1.stride(-1) != 1:
        q1, q2 = q1.contiguous(), q2.contiguous()
    if k1.stride() != k2.stride() or k1.stride(-1) != 1:
        k1, k2 = k1.contiguous(), k2.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    return _forward(q1, k1, q2, k2, v, lam.reshape(()).float(), float(scale))[0]
