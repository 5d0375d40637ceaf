"""Does ``diffsweep suggest`` predict what a run adds to a token scan of cooldown branches? (#34)

A branch scan's points share their run's offset, so what a new run buys depends on where the noise
is: another seed of a run (a new run with its own offset and all of the run's points) narrows the
run-level part, a new cooldown branch of a measured run (one point at that run's offset, its
cooldown's cost) the per-point part. Truth: L(D) = 2.0 + 410.7·D^-0.28 for the Transformer, DIFF V1
at D/0.637 (tests/scaling/synthetic.py), one 3B run per seed with branches at 80, 160 and 240B of a
320B run, 2 seeds per architecture; a run offset of sd ``run_sd`` and per-point noise ``eval_sd``
of log loss. For each of ``--reps`` datasets: suggest's predicted narrowing of the CI of ρ_D at
251B for one candidate (``expected_ci_width`` after it / the width now, linearised) and the
realized one: the same data fitted as ``diffsweep fit`` would (full hierarchical bootstrap) with
and without the candidate's outcome drawn from the truth (a new branch at 120B of DIFF's first run,
sharing its true offset; or a third DIFF run). Reported: the geometric mean of each ratio over the
datasets, and the realized one's standard error (of the mean log ratio). Paired per dataset, so the
heavy-tailed widths of a 2-seed noise estimate cancel. Usage:

    python analysis/benchmarks/bench_suggest_branches.py [--reps 150]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diffsweep.scaling.analysis import FitRequest, analyse  # noqa: E402
from diffsweep.scaling.suggest import candidates  # noqa: E402
from diffsweep.scaling.suggest import preposterior as sg  # noqa: E402
from diffsweep.scaling.table import _complete  # noqa: E402
from tests.scaling.synthetic import TRUE_TOKEN_RATIO  # noqa: E402

REF = 251e9
TOKENS = [80e9, 160e9, 240e9, 320e9]  # branches at 80, 160, 240B of a 320B run
NEW_BRANCH = 120e9
RATE = 989e12 * 0.40 * 3600  # FLOPs per GPU-hour, as suggest's default
SHAPES = [  # (run_sd, eval_sd, candidate)
    (0.005, 0.0005, "seed"), (0.005, 0.0005, "branch"),
    (0.0005, 0.006, "seed"), (0.0005, 0.006, "branch"),
    (0.003, 0.003, "seed"), (0.003, 0.003, "branch"),
]


def family(rng: np.random.Generator, arch: str, seed: int, tokens: list[float], offset: float,
           eval_sd: float) -> list[dict]:
    """A run to its longest token count and its branches at the others, as points.csv rows."""
    ratio = 1.0 if arch == "transformer" else TRUE_TOKEN_RATIO
    last, key = max(tokens), f"{arch}-s{seed}"
    rows = []
    for d in sorted(tokens):
        loss = (2.0 + 410.7 * (d / ratio) ** -0.28) * np.exp(offset + eval_sd * rng.standard_normal())
        rows.append({"arch": arch, "num_params": 3e9, "tokens": d, "loss": loss, "seed": seed,
                     "run_id": f"{key}-{d:g}", "run_key": key if d == last else f"{key}-{d:g}",
                     "parent": "" if d == last else key, "point": "final"})
    return rows


def width(rows: list[dict], seed: int, boot: int) -> float:
    result = analyse(_complete(pd.DataFrame(rows)), FitRequest(n_boot=boot, seed=seed, at=(REF,)))
    row = next(r for r in result.ratios if abs(r["at"] - REF) < 1)
    return np.inf if row["hi"] is None or row["lo"] is None else row["hi"] - row["lo"]


def shape(run_sd: float, eval_sd: float, kind: str, reps: int, boot: int) -> dict:
    pred, real, cost = [], [], 0.0
    for k in range(reps):
        rng = np.random.default_rng(1000 + k)
        offsets = {(a, s): run_sd * rng.standard_normal() for a in ("transformer", "diff_v1") for s in range(2)}
        rows = [r for (a, s), o in offsets.items() for r in family(rng, a, s, TOKENS, o, eval_sd)]
        design, result = sg.design_from_points(_complete(pd.DataFrame(rows)),
                                               FitRequest(n_boot=boot, seed=k, at=(REF,)), ref=REF, num_draws=32)
        assert result.points is not None
        pool = candidates.extra_candidates(result.points, design, "num_params", RATE, sizes=[NEW_BRANCH])
        if kind == "seed":
            cand = next(c for c in pool if c.like == "diff_v1-s0")
            new = family(rng, "diff_v1", 2, TOKENS, run_sd * rng.standard_normal(), eval_sd)
        else:
            cand = next(c for c in pool if c.origin == "branch" and c.family == "diff_v1-s0")
            new = [r for r in family(rng, "diff_v1", 0, [*TOKENS, NEW_BRANCH], offsets[("diff_v1", 0)], eval_sd)
                   if r["tokens"] == NEW_BRANCH]
        cost = cand.gpu_hours
        pred.append(np.log(sg.expected_ci_width(design, [cand], seed=k) / sg.current_width(design)))
        real.append(np.log(width(rows + new, k, boot) / width(rows, k, boot)))
    p, r = np.array(pred), np.array(real)
    ok = np.isfinite(r) & np.isfinite(p)
    return {"run_sd": run_sd, "eval_sd": eval_sd, "candidate": kind, "gpu_hours": cost, "reps": int(ok.sum()),
            "predicted": float(np.exp(p[ok].mean())), "realized": float(np.exp(r[ok].mean())),
            "realized_se_log": float(r[ok].std(ddof=1) / np.sqrt(ok.sum()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=150)
    parser.add_argument("--boot", type=int, default=300)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"{'run sd':>7} {'eval sd':>8} {'candidate':>10} {'GPU-h':>8} {'predicted':>10} {'realized':>9} "
          f"{'(se log)':>9} {'reps':>5} {'s':>6}")
    for run_sd, eval_sd, kind in SHAPES:
        t = time.time()
        s = shape(run_sd, eval_sd, kind, args.reps, args.boot)
        print(f"{run_sd:>7} {eval_sd:>8} {kind:>10} {s['gpu_hours']:>8.0f} {s['predicted']:>10.3f} "
              f"{s['realized']:>9.3f} {s['realized_se_log']:>9.3f} {s['reps']:>5} {time.time() - t:>6.0f}", flush=True)


if __name__ == "__main__":
    main()
