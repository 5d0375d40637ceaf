"""Where a 1.4B training step's time goes on a GPU: the step as `bench model` runs it (bf16
autocast, fp32 cross-entropy, clipping, AdamW), split by CUDA events into forward / loss /
backward / clip / optimizer after 3 warm-up steps; with ``--table``, torch.profiler's 30 top
kernels of one more step. Config overrides (``model.ffn_hidden=5632``) follow the backend.

    python3 analysis/gpu/profile_step.py KIND BACKEND [KEY=VALUE ...] [--table]

On the GPU machine, with the checkout and a ``diffsweep_kernels`` link to ``kernels/`` on
``PYTHONPATH`` (as the device kit sets them; docs/kernels.md)."""
import sys
import time

import torch
from torch.nn import functional as F

from diffsweep.config import load_config
from diffsweep.model.transformer import build_model
from diffsweep.train.optim import build_optimizer

kind, backend, *overrides = sys.argv[1:]
table = "--table" in overrides
overrides = [o for o in overrides if o != "--table"]
cfg = load_config(None, ["model.size=1.4B", f"model.attention.kind={kind}", f"model.attention.backend={backend}",
                         *overrides])
dev = torch.device("cuda")
model = build_model(cfg.model, device=dev, compute_dtype=torch.bfloat16)
opt = build_optimizer(model, cfg.train)
print("param dtype", next(model.parameters()).dtype, "vocab", cfg.model.vocab_size, "optimizer", opt.defaults)
tokens = torch.randint(0, cfg.model.vocab_size, (4, 2049), device=dev)
ev = {}


def mark(name):
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    ev[name] = e


def step():
    opt.zero_grad(set_to_none=True)
    mark("start")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    mark("forward")
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
    mark("loss")
    loss.backward()
    mark("backward")
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    mark("clip")
    opt.step()
    mark("optimizer")


for _ in range(3):
    step()
torch.cuda.synchronize()
t = time.perf_counter()
step()
torch.cuda.synchronize()
print(f"{kind}/{backend} {overrides} step {1e3 * (time.perf_counter() - t):.1f} ms")
names = list(ev)
for a, b in zip(names, names[1:]):
    print(f"  {b:10s} {ev[a].elapsed_time(ev[b]):8.1f} ms")
if not table:
    sys.exit(0)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]) as prof:
    step()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
