"""Cooldown branches on the CPU demo (issue #34): is a branch the run it names, and what does it save?

Per seed, on the demo corpus (data/demo, `diffsweep data prepare --demo`), a tiny Transformer with
the demo ladder's recipe (1,024 tokens per step, 60 warmup steps:
--warmup):

  parent    WSD, STEPS steps decaying over the last COOLDOWN of them, checkpointed every 40 steps
  branch    for each budget B < STEPS: WSD of B steps decaying over its last COOLDOWN * B, started
            from the parent's checkpoint at (1 - COOLDOWN) * B (`train(..., branch_from=...)`)
  separate  the same B-step WSD run trained from step 1
  linear    one STEPS-step run with the linear schedule (the paper's Fig. 3b reading), its
            validation loss read at each B (an intermediate checkpoint, its learning rate still high)

Printed per budget: each reading's final validation loss over the seeds (mean, sd), the largest
|branch - separate| (the claim: none), linear-at-B minus branch with a paired t CI over the seeds
(the claim: the intermediate reading is worse), and the wall time and steps each way of getting
the whole curve L(B) for the budgets and STEPS: parent + branches vs one separate run per budget.

    python analysis/benchmarks/bench_branches.py [--seeds 3] [--size tiny-2xs] [--steps 600] [--budgets 200,400]
        [--cooldown 0.2] [--warmup 60]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--size", default="tiny-2xs")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--budgets", default="200,400")
    parser.add_argument("--cooldown", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=60)
    parser.add_argument("--data", type=Path, default=REPO / "data" / "demo")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="bench-branches-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{scratch / 'mlflow.db'}"

    from diffsweep.config import load_config
    from diffsweep.train.checkpoint import list_checkpoints, load_checkpoint
    from diffsweep.train.trainer import train

    def config(seed: int, *extra: str):
        return load_config(None, [f"model.size={args.size}", "model.attention.kind=transformer",
                                  f"data.path={args.data}", "data.tokenizer=bpe", "train.batch_tokens=1024",
                                  f"train.warmup_steps={args.warmup}", f"train.seed={seed}", "train.keep_checkpoints=1000",
                                  *extra])

    def wsd(seed: int, steps: int, *extra: str):
        return config(seed, "train.schedule=wsd", f"train.max_steps={steps}", f"train.decay_fraction={args.cooldown}",
                      f"train.eval_every={steps}", f"train.checkpoint_every={steps}", *extra)

    def run(cfg, name: str, **kw) -> tuple[dict, float]:
        seen: dict = {}
        start = time.perf_counter()
        train(cfg, scratch / name, experiment="bench-branches", echo=lambda _line: None,
              callbacks=(lambda step, m: seen.__setitem__(step, m),), **kw)
        return seen, time.perf_counter() - start

    rows: dict[str, dict[int, list[float]]] = {k: {b: [] for b in budgets} for k in ("branch", "separate", "linear")}
    wall = {"parent": 0.0, "branch": 0.0, "separate": 0.0, "linear": 0.0}
    for seed in range(args.seeds):
        _, seconds = run(wsd(seed, args.steps, "train.checkpoint_every=40"), f"parent-s{seed}")
        wall["parent"] += seconds
        checkpoints = {load_checkpoint(c)["step"]: c for c in list_checkpoints(scratch / f"parent-s{seed}" / "checkpoints")}
        linear, seconds = run(config(seed, "train.schedule=linear", f"train.max_steps={args.steps}",
                                     f"train.eval_every={min(budgets)}", f"train.checkpoint_every={args.steps}"),
                              f"linear-s{seed}")
        wall["linear"] += seconds
        for b in budgets:
            start = round((1 - args.cooldown) * b)
            if start not in checkpoints:
                raise SystemExit(f"no parent checkpoint at step {start} (every 40 steps): pick budgets whose "
                                 f"{1 - args.cooldown:.0%} is a multiple of 40")
            branch, seconds = run(wsd(seed, b), f"branch-{b}-s{seed}", branch_from=checkpoints[start])
            wall["branch"] += seconds
            separate, seconds = run(wsd(seed, b), f"separate-{b}-s{seed}")
            wall["separate"] += seconds
            rows["branch"][b].append(branch[b]["val/loss"])
            rows["separate"][b].append(separate[b]["val/loss"])
            rows["linear"][b].append(linear[b]["val/loss"])
        print(f"seed {seed} done ({sum(wall.values()):.0f} s so far)", flush=True)

    print(f"\n{args.size}, {args.seeds} seeds, WSD cooldown {args.cooldown:.0%}, parent {args.steps} steps; final "
          "val/loss (mean ± sd over seeds)")
    print(f"{'budget':>7}  {'branch':>17}  {'separate run':>17}  {'max |b - s|':>11}  {'linear at B':>17}  "
          f"{'linear - branch (95% CI)':>26}")
    for b in budgets:
        br, se, li = (np.array(rows[k][b]) for k in ("branch", "separate", "linear"))
        d = li - br
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
        print(f"{b:>7}  {br.mean():.4f} ± {br.std(ddof=1):.4f}  {se.mean():.4f} ± {se.std(ddof=1):.4f}  "
              f"{np.abs(br - se).max():>11.2e}  {li.mean():.4f} ± {li.std(ddof=1):.4f}  "
              f"{d.mean():+.4f} ({d.mean() - half:+.4f} to {d.mean() + half:+.4f})")
    branched_steps = args.steps + sum(b - round((1 - args.cooldown) * b) for b in budgets)
    separate_steps = args.steps + sum(budgets)
    print(f"\nthe curve at {', '.join(map(str, budgets))} and {args.steps} steps, per seed: parent + branches "
          f"{branched_steps} steps ({(wall['parent'] + wall['branch']) / args.seeds:.1f} s), one run per budget "
          f"{separate_steps} steps ({(wall['parent'] + wall['separate']) / args.seeds:.1f} s): "
          f"{branched_steps / separate_steps:.2f}x the steps")
    print(f"scratch: {scratch}")


if __name__ == "__main__":
    main()
