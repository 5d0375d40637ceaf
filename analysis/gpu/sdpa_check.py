"""Which of PyTorch's SDPA kernels gives wrong gradients at the shapes of ``tests/model/test_backends.py``.

The first GPU window (2026-12-04, H200, torch 2.11.0+cu130) saw the SDPA path of standard attention
(fp16, GQA 4:1, T = 40, QK dim 16, V a 16-wide slice of a 32-wide tensor) give dq off by 5.1 in
one test process and right in another. This runs that computation with each SDPA kernel forced
(flash, efficient, cuDNN, math, and PyTorch's own choice), each several times, and reports the
largest error of the output and of each gradient against an fp64 math reference, beside the fp64
reference's own error at that precision (the math kernel in the same dtype). The second window
ran it alone: 0 wrong of 100 cases x 8 repeats, while the test file failed in 3 of 4 runs under
``-n 8`` (always the default SDPA path). ``--interleave-triton`` runs the fused DIFF kernel's
forward and backward before every SDPA call, as the test processes do between tests.

    python3 analysis/gpu/sdpa_check.py [--repeats 10] [--interleave-triton] [--tiny] [--out sdpa.json]

Made for the GPU; without CUDA it runs on the CPU (where only SDPA's flash and math kernels exist;
``--tiny`` leaves out the 2048-token shape), which is how the suite tests it. Exit 1 if any kernel
is wrong."""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(2, 4, 4, 33, 16, 16), (2, 4, 2, 33, 16, 16), (2, 4, 4, 33, 16, 32), (1, 4, 1, 40, 16, 32),
          (2, 16, 4, 2048, 128, 256)]
KERNELS = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
           "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}


def inputs(shape, seed=0):
    B, Hq, Hkv, T, D, Dv = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=g) * 2
    k = torch.randn(B, Hkv, T, D, generator=g) * 2
    v = torch.randn(B, Hkv, T, Dv, generator=g)
    dout = torch.randn(B, Hq, T, D, generator=g)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return q.to(device), k.to(device), v.to(device), dout.to(device)


def triton_first(q, k, v_full, dtype):
    """The fused kernel's forward and backward on these inputs (its result is not used)."""
    from diffsweep_kernels.triton_diff import diff_attention

    q1, k1, v = (t.detach().to(dtype).requires_grad_() for t in (q, k, v_full))
    lam = torch.tensor(0.6, device=q.device, requires_grad=True)
    diff_attention(q1, k1, q1, k1, v, lam, scale=q.shape[-1] ** -0.5).sum().backward()


def run(q, k, v_full, dout, dtype, kernel, contiguous_v, interleave=False):
    """Output and (dq, dk, dv) of causal attention over V's first QK-dim columns, as fp64."""
    if interleave and dtype != torch.float64:
        triton_first(q, k, v_full, dtype)
    D = q.shape[-1]
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v_full)]
    v = leaves[2][..., :D]
    if contiguous_v:
        v = v.contiguous()
    gqa = q.shape[1] != k.shape[1]
    ctx = sdpa_kernel([kernel]) if kernel is not None else torch.enable_grad()
    with ctx:
        out = F.scaled_dot_product_attention(leaves[0], leaves[1], v, is_causal=True, scale=D**-0.5, enable_gqa=gqa)
        out.backward(dout.to(dtype))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return [out.detach().double(), *(leaf.grad[..., :D].double() for leaf in leaves)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--interleave-triton", action="store_true")
    parser.add_argument("--tiny", action="store_true", help="the test shapes only (T <= 40)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    rows = []
    for shape in SHAPES[:4] if args.tiny else SHAPES:
        q, k, v, dout = inputs(shape)
        truth = run(q, k, v, dout, torch.float64, SDPBackend.MATH, False)
        for dtype in (torch.float16, torch.bfloat16):
            ref = run(q, k, v, dout, dtype, SDPBackend.MATH, False)
            ref_err = [(r - t).abs().max().item() for r, t in zip(ref, truth)]
            for name, kernel in KERNELS.items():
                for contiguous_v in (False, True):
                    worst, error = [0.0] * 4, None
                    for _ in range(args.repeats):
                        try:
                            got = run(q, k, v, dout, dtype, kernel, contiguous_v, args.interleave_triton)
                        except RuntimeError as exc:  # this kernel does not take these inputs
                            error = str(exc).splitlines()[0][:160]
                            break
                        worst = [max(w, (g - t).abs().max().item()) for w, g, t in zip(worst, got, truth)]
                    bad = error is None and any(w > 2 * r + 4 * torch.finfo(dtype).eps * 8 for w, r in zip(worst, ref_err))
                    row = {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "kernel": name,
                           "contiguous_v": contiguous_v, "max_err": dict(zip(("out", "dq", "dk", "dv"), worst)),
                           "math_same_dtype_err": dict(zip(("out", "dq", "dk", "dv"), ref_err)),
                           "unsupported": error, "WRONG": bad}
                    rows.append(row)
                    status = "unsupported" if error else ("WRONG" if bad else "ok")
                    print(f"{shape} {row['dtype']:9} {name:9} v {'contig' if contiguous_v else 'slice '} {status:11} "
                          + " ".join(f"{n}={w:.2e}" for n, w in zip(("out", "dq", "dk", "dv"), worst))
                          + (f"  ({error})" if error else ""), flush=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)"
    facts = {"torch": torch.__version__, "gpu": gpu, "repeats": args.repeats,
             "interleave_triton": args.interleave_triton, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(facts, f, indent=1)
    wrong = [r for r in rows if r["WRONG"]]
    print(f"{len(wrong)} wrong of {len(rows)} (kernel x dtype x shape x V layout)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
