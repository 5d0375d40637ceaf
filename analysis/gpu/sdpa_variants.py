"""Ways to run DIFF V1 and DIFF V2 attention through PyTorch's SDPA, timed side by side.

The second GPU window (H200, 2026-12-04) found the models' SDPA calls run cuDNN's kernel, the
fastest there (1.7x SDPA's FlashAttention-2), while DIFF V1 runs four SDPA calls of h heads over
QK-wide halves of V and DIFF V2 one GQA call (2h query heads over h_kv K/V heads), which cuDNN may
not take. This times, at the 1.4B head (bf16, D = 128) and the Transformer's own call beside them:

- DIFF V1 ``four-calls`` (what ``SdpaBackend`` inherits: attend(q1, k1, v) − λ attend(q2, k2, v),
  V split in QK-wide halves), ``stacked`` (Q1/Q2 and K1/K2 stacked as 2h heads, V repeated for
  both: two calls over V's halves), ``stacked-wide`` (the same as one call with V 2d wide, SDPA's
  choice of kernel, and forced cuDNN / efficient), and the fused Triton kernel;
- DIFF V2 ``gqa`` (``enable_gqa``, SDPA's choice) against ``repeat-kv`` (K/V repeated to 2h
  heads, so a kernel without GQA can run) and forced cuDNN on either.

Each variant's output and gradients are checked against ``four-calls`` in fp32 (max abs error).
Forward and forward+backward medians over ``--reps`` timed calls after warm-up, the variants
interleaved round-robin.

    python3 analysis/gpu/sdpa_variants.py [--seq 2048] [--batch 8] [--reps 20] [--out v.json]

Without CUDA it runs on the CPU at tiny shapes (``--tiny``), which is how the suite tests it."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

FORCED = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
          "flash": SDPBackend.FLASH_ATTENTION}


def sdpa(q, k, v, scale, kernel=None):
    gqa = q.shape[1] != k.shape[1]
    if kernel is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    with sdpa_kernel([FORCED[kernel]]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)


def v1_four_calls(q1, k1, q2, k2, v, lam, scale):
    d = q1.shape[-1]
    o1 = torch.cat([sdpa(q1, k1, c, scale) for c in v.split(d, dim=-1)], dim=-1)
    o2 = torch.cat([sdpa(q2, k2, c, scale) for c in v.split(d, dim=-1)], dim=-1)
    return (o1.float() - lam.float() * o2.float()).to(o1.dtype)


def _stack(q1, k1, q2, k2, v):
    return torch.cat([q1, q2], dim=1), torch.cat([k1, k2], dim=1), torch.cat([v, v], dim=1)


def _combine(o, lam):
    h = o.shape[1] // 2
    return (o[:, :h].float() - lam.float() * o[:, h:].float()).to(o.dtype)


def v1_stacked(q1, k1, q2, k2, v, lam, scale):
    q, k, vv = _stack(q1, k1, q2, k2, v)
    d = q1.shape[-1]
    return _combine(torch.cat([sdpa(q, k, c, scale) for c in vv.split(d, dim=-1)], dim=-1), lam)


def v1_stacked_wide(kernel):
    def run(q1, k1, q2, k2, v, lam, scale):
        q, k, vv = _stack(q1, k1, q2, k2, v)
        return _combine(sdpa(q, k, vv, scale, kernel), lam)
    return run


def v1_triton(q1, k1, q2, k2, v, lam, scale):
    from diffsweep_kernels.triton_diff import diff_attention
    return diff_attention(q1, k1, q2, k2, v, lam, scale=scale)


def v2_gqa(kernel):
    def run(q, k, v, scale):
        return sdpa(q, k, v, scale, kernel)
    return run


def v2_repeat_kv(kernel):
    def run(q, k, v, scale):
        g = q.shape[1] // k.shape[1]
        return sdpa(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1), scale, kernel)
    return run


def standard(kernel):
    def run(q, k, v, scale):
        return sdpa(q, k, v, scale, kernel)
    return run


def clock(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def case(name, fn, leaves, extra, dout):
    """A callable timing ``fn`` forward (``bwd=False``) or forward+backward, and its results."""
    def call(bwd):
        xs = [t.detach().requires_grad_(bwd) for t in leaves]
        out = fn(*xs, *extra)
        if bwd:
            out.backward(dout)
        return out, xs
    return name, call


def measure(cases, reps, warmup, device):
    times = {name: {"fwd": [], "fwdbwd": []} for name, _ in cases}
    errors = {}
    for name, call in cases:
        try:
            for _ in range(warmup):
                call(True)
        except RuntimeError as exc:
            errors[name] = str(exc).splitlines()[0][:200]
    live = [(n, c) for n, c in cases if n not in errors]
    for _ in range(reps):
        for name, call in live:
            for key, bwd in (("fwd", False), ("fwdbwd", True)):
                start = clock(device)
                if bwd:
                    call(True)
                else:
                    with torch.no_grad():
                        call(False)
                times[name][key].append(clock(device) - start)
    return {n: {k: statistics.median(v) * 1e3 for k, v in times[n].items()} for n, _ in live}, errors


def check(cases, reference):
    """Max abs fp32 error of each case's output and gradients against ``reference``'s."""
    out_ref, xs_ref = reference(True)
    want = [out_ref.float(), *(x.grad.float() for x in xs_ref)]
    result = {}
    for name, call in cases:
        try:
            out, xs = call(True)
        except RuntimeError:
            continue
        got = [out.float(), *(x.grad.float() if x.grad is not None else torch.zeros_like(w)
                              for x, w in zip(xs, want[1:]))]
        result[name] = max((g - w).abs().max().item() for g, w in zip(got, want))
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16, help="the Transformer's heads (DIFF V1: half)")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="T = 32, 4 heads of 16 (the CPU test)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    B, T, H, d = (2, 32, 4, 16) if args.tiny else (args.batch, args.seq, args.heads, args.head_dim)
    h = H // 2
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device, dtype)

    scale = d**-0.5
    lam = torch.tensor(0.8, device=device)
    v1_leaves = [rand(B, h, T, d), rand(B, h, T, d), rand(B, h, T, d), rand(B, h, T, d), rand(B, h, T, 2 * d)]
    v1_dout = rand(B, h, T, 2 * d)
    v1 = [case("four-calls", v1_four_calls, v1_leaves, (lam, scale), v1_dout),
          case("stacked", v1_stacked, v1_leaves, (lam, scale), v1_dout),
          case("stacked-wide", v1_stacked_wide(None), v1_leaves, (lam, scale), v1_dout)]
    if cuda:
        v1 += [case(f"stacked-wide-{k}", v1_stacked_wide(k), v1_leaves, (lam, scale), v1_dout)
               for k in ("cudnn", "efficient")]
        v1.append(case("triton", v1_triton, v1_leaves, (lam, scale), v1_dout))
    v2_leaves = [rand(B, 2 * H, T, d), rand(B, H, T, d), rand(B, H, T, d)]
    v2_dout = rand(B, 2 * H, T, d)
    v2_g = [rand(B, 2 * H, T, d), rand(B, 2 * H // 4, T, d), rand(B, 2 * H // 4, T, d)]  # GQA 4:1 too
    v2 = [case("v2-gqa", v2_gqa(None), v2_leaves, (scale,), v2_dout),
          case("v2-repeat-kv", v2_repeat_kv(None), v2_leaves, (scale,), v2_dout),
          case("v2-gqa4-gqa", v2_gqa(None), v2_g, (scale,), v2_dout),
          case("v2-gqa4-repeat-kv", v2_repeat_kv(None), v2_g, (scale,), v2_dout)]
    std_leaves = [rand(B, H, T, d) for _ in range(3)]
    std = [case("transformer", standard(None), std_leaves, (scale,), rand(B, H, T, d))]
    if cuda:
        v2 += [case("v2-gqa-cudnn", v2_gqa("cudnn"), v2_leaves, (scale,), v2_dout),
               case("v2-repeat-kv-cudnn", v2_repeat_kv("cudnn"), v2_leaves, (scale,), v2_dout)]
        std += [case(f"transformer-{k}", standard(k), std_leaves, (scale,), rand(B, H, T, d))
                for k in ("cudnn", "flash")]
    errors_v1 = check(v1, v1[0][1])
    errors_v2 = {**check(v2[:2], v2[0][1]), **check(v2[2:4], v2[2][1])}
    if cuda:
        errors_v2.update(check(v2[4:], v2[0][1]))
    times, refused = measure(std + v1 + v2, args.reps, args.warmup, device)
    base = times.get("transformer", {}).get("fwdbwd")
    print(f"B={B} T={T} H={H} d={d} {dtype} on {torch.cuda.get_device_name() if cuda else 'CPU'}, torch {torch.__version__}")
    print(f"{'variant':24} {'fwd ms':>8} {'fwd+bwd ms':>11} {'/transformer':>13} {'max err':>9}")
    for name, t in times.items():
        err = {**errors_v1, **errors_v2}.get(name)
        print(f"{name:24} {t['fwd']:8.3f} {t['fwdbwd']:11.3f} {t['fwdbwd'] / base:13.2f} "
              f"{'' if err is None else f'{err:9.2e}'}")
    for name, why in refused.items():
        print(f"{name:24} refused: {why}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": [B, T, H, d], "dtype": str(dtype), "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name() if cuda else None, "times_ms": times,
                       "max_err_vs_first": {**errors_v1, **errors_v2}, "refused": refused}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
