"""Where a training step's time goes: the step as `bench model` runs it (bf16 autocast on a GPU,
fp32 on CPU; fp32 cross-entropy, clipping, AdamW), timed phase by phase (forward / loss / backward
/ clip / optimizer, the device synchronised at each boundary) after 3 warm-up steps; with
``--table``, torch.profiler's 30 top kernels of one more step and the casts it made (``aten::_to_copy``
calls: autocast's weight casts, ~800 a step eagerly at 1.4B); with ``--compile``, the blocks compiled
as ``train.compile`` compiles them (the warm-up compiles). Defaults: 1.4B, T = 2048,
micro-batch 4; config overrides (``model.ffn_hidden=5632``, ``model.size=tiny-3xs``) follow the
backend.

    python3 analysis/gpu/profile_step.py KIND BACKEND [KEY=VALUE ...] [--table] [--compile]

On the GPU machine, with the checkout and a ``diffsweep_kernels`` link to ``kernels/`` on
``PYTHONPATH`` (as the device kit sets them; docs/kernels.md)."""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext

import torch
from torch.nn import functional as F

from diffsweep.config import load_config
from diffsweep.model.compile import compile_blocks
from diffsweep.model.transformer import build_model
from diffsweep.train.optim import build_optimizer

PHASES = ("forward", "loss", "backward", "clip", "optimizer")


def main(argv: list[str]) -> None:
    kind, backend, *overrides = argv
    table, compiled = "--table" in overrides, "--compile" in overrides
    overrides = [o for o in overrides if o not in ("--table", "--compile")]
    cfg = load_config(None, ["model.size=1.4B", "train.seq_len=2048", "train.micro_batch_size=4",
                             f"model.attention.kind={kind}", f"model.attention.backend={backend}", *overrides])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = device.type == "cuda"
    model = build_model(cfg.model, device=device, compute_dtype=torch.bfloat16 if gpu else torch.float32)
    optimizer = build_optimizer(model, cfg.train)
    if compiled:
        compile_blocks(model)
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.train.micro_batch_size, cfg.train.seq_len + 1), device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else nullcontext()
    seconds = dict.fromkeys(PHASES, 0.0)

    def tick(phase: str | None, since: float) -> float:
        if gpu:
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        if phase is not None:
            seconds[phase] = now - since
        return now

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        t = tick(None, 0.0)
        with autocast:
            logits = model(tokens[:, :-1])
        t = tick("forward", t)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        t = tick("loss", t)
        loss.backward()
        t = tick("backward", t)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        t = tick("clip", t)
        optimizer.step()
        tick("optimizer", t)

    for _ in range(4):  # 3 warm-up steps, then the one reported
        step()
    print(f"{kind}/{backend} {cfg.model.size} on {torch.cuda.get_device_name(device) if gpu else 'CPU'}, "
          f"FFN {cfg.model.ffn_hidden}, {tokens.shape[0]} x {cfg.train.seq_len} tokens "
          f"{' '.join(overrides)}{', compiled' if compiled else ''}: step {1e3 * sum(seconds.values()):.1f} ms")
    for phase in PHASES:
        print(f"  {phase:10s} {1e3 * seconds[phase]:8.1f} ms")
    if not table:
        return
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    with torch.profiler.profile(activities=activities) as prof:
        step()
    sort = "cuda_time_total" if gpu else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=70))
    casts = sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")
    print(f"casts (aten::_to_copy calls) in the step: {casts}")


if __name__ == "__main__":
    main(sys.argv[1:])
