"""Training-step throughput of tiny models on CPU, eager and compiled side by side in one run.

Measures tokens per CPU-second (single thread: robust on a shared 2-core box) and wall-clock
tokens/s for each architecture/backend at (near-)equal parameters, eagerly and with the trainer's
``train.compile`` (``diffsweep.model.compile.compile_blocks``: each block compiled, one graph for
all) and its AdamW, interleaving every variant round-robin so machine load affects them alike, and
prints each row's ratio to the Transformer in the same mode and compiled / eager.

    python analysis/benchmarks/bench_model_cpu.py [--size tiny-m] [--batch 4] [--seq 256] [--modes eager,compiled]

The demo ladder's shapes by default (its largest size, 4 x 256 tokens per step). The first step,
not timed, compiles (inductor's C++; ~15-30 s per kind on a cold cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from diffsweep.config import load_config  # noqa: E402
from diffsweep.model import counting  # noqa: E402
from diffsweep.model.compile import compile_blocks  # noqa: E402
from diffsweep.model.transformer import build_model  # noqa: E402
from diffsweep.train.optim import build_optimizer  # noqa: E402

VARIANTS = {
    "transformer/sdpa": ["model.attention.kind=transformer", "model.attention.backend=sdpa"],
    "diff_v1/sdpa": ["model.attention.kind=diff_v1", "model.attention.backend=sdpa"],
    "diff_v1/reference": ["model.attention.kind=diff_v1", "model.attention.backend=reference"],
    "diff_v2/sdpa": ["model.attention.kind=diff_v2", "model.attention.backend=sdpa"],
    "transformer/reference": ["model.attention.kind=transformer", "model.attention.backend=reference"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny-m")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="eager,compiled", help="eager, compiled or both")
    parser.add_argument("--only", default="transformer/sdpa,diff_v1/sdpa,diff_v2/sdpa",
                        help="comma-separated variant names (all: " + ", ".join(VARIANTS) + ")")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    setups = {}
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    modes = [m for m in args.modes.split(",") if m]
    compile_s: dict[str, float] = {}
    for mode in modes:
        for name in names:
            config = load_config(None, [f"model.size={args.size}", *VARIANTS[name]])
            torch.manual_seed(0)
            model = build_model(config.model)
            opt = build_optimizer(model, config.train)
            if mode == "compiled":
                compile_blocks(model)
            tokens = torch.randint(0, config.model.vocab_size, (args.batch, args.seq + 1))
            setups[f"{name} {mode}"] = (config.model, model, opt, tokens)

    def step(model, opt, tokens) -> None:
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for key, (_, model, opt, tokens) in setups.items():  # warm-up (the compiled ones compile)
        started = time.perf_counter()
        step(model, opt, tokens)
        compile_s[key] = time.perf_counter() - started

    cpu: dict[str, list[float]] = {n: [] for n in setups}
    wall: dict[str, list[float]] = {n: [] for n in setups}
    for _ in range(args.rounds):
        for name, (_, model, opt, tokens) in setups.items():
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                step(model, opt, tokens)
            cpu[name].append((time.process_time() - c0) / args.steps)
            wall[name].append((time.perf_counter() - w0) / args.steps)

    tokens_per_step = args.batch * args.seq
    rows = []
    for key, (cfg, *_rest) in setups.items():
        name, mode = key.split()
        cpu_s, wall_s = statistics.median(cpu[key]), statistics.median(wall[key])
        base = f"transformer/sdpa {mode}"
        eager = f"{name} eager"
        rows.append({
            "variant": name,
            "mode": mode,
            "params": counting.num_params(cfg),
            "first_step_s": compile_s[key],
            "cpu_s_per_step": cpu_s,
            "tokens_per_cpu_s": tokens_per_step / cpu_s,
            "tokens_per_s_wall": tokens_per_step / wall_s,
            "ratio_vs_transformer_cpu": statistics.median(cpu[base]) / cpu_s if base in cpu else None,
            "compiled_vs_eager_cpu": statistics.median(cpu[eager]) / cpu_s if eager in cpu else None,
        })
    meta = {
        "size": args.size, "batch": args.batch, "seq": args.seq, "steps": args.steps, "rounds": args.rounds,
        "threads": args.threads, "modes": modes, "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
        "load_avg": os.getloadavg(),
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return
    print(f"# {meta}")
    print(f"{'variant':20} {'mode':9} {'params':>10} {'1st step s':>10} {'CPU s/step':>11} {'tok/CPU-s':>10} "
          f"{'tok/s wall':>11} {'vs Transf.':>10} {'vs eager':>9}")
    for r in rows:
        versus = "" if r["compiled_vs_eager_cpu"] is None else f"{r['compiled_vs_eager_cpu']:.3f}"
        print(f"{r['variant']:20} {r['mode']:9} {r['params']:>10,} {r['first_step_s']:>10.1f} "
              f"{r['cpu_s_per_step']:>11.4f} {r['tokens_per_cpu_s']:>10.0f} {r['tokens_per_s_wall']:>11.0f} "
              f"{r['ratio_vs_transformer_cpu'] or float('nan'):>10.3f} {versus:>9}")


if __name__ == "__main__":
    main()
