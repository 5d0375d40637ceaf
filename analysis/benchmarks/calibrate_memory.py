"""Calibrate ``diffsweep.model.memory.estimate_memory`` against measured peak memory of tiny models on CPU.

Each case runs in a fresh subprocess: a warm-up step on a throw-away tiny-3xs model (loads kernels
and thread pools), then the case's model is built with ``build_model`` and its AdamW optimizer
with ``build_optimizer``; the baseline is the process's resident set then. Two training steps
follow, each as the trainer takes them (fp32, or with ``--precision bf16`` the forward under bf16
autocast on CPU as the trainer runs ``train.precision=bf16``; two micro-batches: forward, ``cross_entropy`` on
``logits.float()``, backward; grad clipping, AdamW step). Measured = peak RSS (``VmHWM``, reset at the baseline) minus
the baseline, which excludes the parameters; it is compared with the estimate minus its
parameters (CPU: no GPU overhead, no foreach temporary).

Each case is measured twice: with glibc's mmap threshold fixed at 128 KiB
(``MALLOC_MMAP_THRESHOLD_=131072``: every large tensor is its own mapping, returned on free, so
RSS follows live tensors) and with glibc's default (a dynamic threshold up to 32 MiB: freed
tensors stay in the heap, and the peak RSS also counts heap fragmentation, which the estimate
does not model).

    python analysis/benchmarks/calibrate_memory.py [--sizes tiny-xs,tiny-l] [--micro 8] [--precision bf16]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

KINDS = ("transformer", "diff_v1", "diff_v2")
SIZES = ("tiny-xs", "tiny-s", "tiny-m", "tiny-l")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    """Start the peak over from the current resident set (Linux: writing 5 to clear_refs resets
    VmHWM), so a transient peak during imports or model build cannot count as training memory."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_bytes() -> int:
    """The resident set's high-water mark since the last reset (VmHWM, kilobytes on Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _train(config, model, steps: int, micro_batches: int) -> None:
    from contextlib import nullcontext

    import torch
    from torch.nn import functional as F

    from diffsweep.train.optim import build_optimizer

    optimizer = build_optimizer(model, config.train)
    b, t, v = config.train.micro_batch_size, config.train.seq_len, config.model.vocab_size
    generator = torch.Generator().manual_seed(0)
    bf16 = config.train.precision.value == "bf16"
    model.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for _ in range(micro_batches):
            window = torch.randint(0, v, (b, t + 1), generator=generator)
            with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext():
                logits = model(window[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
            (loss / micro_batches).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


def run_case(size: str, kind: str, micro: int, checkpointing: bool, precision: str = "fp32") -> dict:
    """One case in this process (call it in a fresh one)."""
    import gc

    import torch

    from diffsweep.config.loading import load_config
    from diffsweep.model.memory import estimate_memory
    from diffsweep.model.transformer import build_model

    torch.set_num_threads(1)
    overrides = [f"model.attention.kind={kind}", f"train.precision={precision}", f"train.micro_batch_size={micro}",
                 f"train.activation_checkpointing={str(checkpointing).lower()}"]
    warm = load_config(None, ["model.size=tiny-3xs", *overrides[:2], "train.micro_batch_size=1", "train.seq_len=32"])
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    warm_model = build_model(warm.model, compute_dtype=dtype)
    if checkpointing and hasattr(warm_model, "activation_checkpointing"):
        warm_model.activation_checkpointing = True
    _train(warm, warm_model, 1, 1)
    del warm_model
    gc.collect()

    config = load_config(None, [f"model.size={size}", *overrides])
    model = build_model(config.model, compute_dtype=dtype)
    if checkpointing:
        if not hasattr(model, "activation_checkpointing"):
            return {"size": size, "kind": kind, "micro": micro, "checkpointing": True, "skipped":
                    "the model has no activation checkpointing"}
        model.activation_checkpointing = True
    gc.collect()
    baseline = _rss_bytes()
    _reset_peak_rss()
    _train(config, model, steps=2, micro_batches=2)
    measured = _peak_rss_bytes() - baseline
    e = estimate_memory(config, world_size=1, gpu_memory_bytes=0, device="cpu")
    return {"size": size, "kind": kind, "micro": micro, "seq_len": config.train.seq_len, "checkpointing": checkpointing,
            "precision": precision, "weight_copies": e.weight_copies, "params": e.params, "grads": e.grads, "optimizer": e.optimizer, "activations": e.activations,
            "logits": e.logits, "estimate_total": e.total, "estimate_excl_params": e.total - e.params,
            "measured": measured, "ratio": (e.total - e.params) / measured}


def _child(case: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"case {case} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--checkpointing", default="off,on", help="off, on or off,on")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="bf16: the forward under bf16 autocast (CPU), as train.precision=bf16 runs it")
    parser.add_argument("--json", default=None, help="also write the rows here")
    # size:kind:micro:0|1[:fp32|bf16], in a child
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        size, kind, micro, ckpt, *precision = args.case.split(":")
        print(json.dumps(run_case(size, kind, int(micro), ckpt == "1", *precision)))
        return
    rows = []
    print("| size | kind | ckpt | est. grads+opt | est. act. | est. logits | est. excl. params "
          "| measured (mmap 128K) | est./meas. | measured (glibc default) | est./meas. |")
    print("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    default_env = {k: v for k, v in env.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    for size in args.sizes.split(","):
        for kind in args.kinds.split(","):
            for ck in args.checkpointing.split(","):
                case = f"{size}:{kind}:{args.micro}:{1 if ck == 'on' else 0}:{args.precision}"
                r, r_default = (_child(case, e) for e in (env, default_env))
                if "measured" in r_default:
                    r["measured_glibc_default"] = r_default["measured"]
                    r["ratio_glibc_default"] = r["estimate_excl_params"] / r_default["measured"]
                rows.append(r)
                if "skipped" in r:
                    print(f"| {size} | {kind} | {ck} | skipped: {r['skipped']} |")
                    continue
                mb = 1e6
                print(f"| {size} | {kind} | {ck} | {(r['grads'] + r['optimizer']) / mb:.1f} MB | "
                      f"{r['activations'] / mb:.1f} MB | {r['logits'] / mb:.1f} MB | {r['estimate_excl_params'] / mb:.1f} MB"
                      f" | {r['measured'] / mb:.1f} MB | {r['ratio']:.2f} | {r['measured_glibc_default'] / mb:.1f} MB"
                      f" | {r['ratio_glibc_default']:.2f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
