"""Does following ``diffsweep suggest --budget`` narrow the ratio's CI faster per GPU-hour than adding
runs uniformly? Synthetic ladders with a known truth (issue #20, part 1).

Truth: Transformer L = 2.30 + 406.4·N^-0.34, DIFF V1 at 62% of its size (tests/scaling/synthetic.py),
noise sd 0.005 of log loss per run. Start: 5 sizes (0.83-13.1B) × 2 seeds per architecture, each
size trained on 20 tokens per parameter (so a run costs 6·N·20N FLOPs, priced at an H100's 989
TFLOP/s at 40% MFU: 58 GPU-h at 830M, 14,460 at 13.1B). Every round spends up to ``--budget``
GPU-hours on new runs, whose losses are drawn from the truth:

- A (suggest): ``choose_within`` over another seed of each measured point of either architecture
  (and, with ``--sizes``, new sizes), greedy within the budget;
- B (uniform): round-robin over (size, architecture), smallest size first, continuing where the
  previous round stopped, each run added while it fits the round's budget.

After each round both arms are refitted as ``diffsweep fit`` would (the full parametric bootstrap,
noise from the data) and the 95% CI of ρ at 13.1B is read: its width (an open-ended CI counts as
infinite, so medians are reported) and whether it covers the true 62%. Usage:

    python analysis/benchmarks/bench_suggest.py [--reps 40] [--rounds 3] [--budget 15000] [--workers 16]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from diffsweep.scaling import suggest as sg
from diffsweep.scaling.analysis import FitRequest, FitWarning, analyse
from diffsweep.scaling.table import _complete

SIZES = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9
TRUE_RATIO, NOISE_SD, REF, TOKENS_PER_PARAM = 0.62, 0.005, 13.1e9, 20.0
ARCHS = {"transformer": 1.0, "diff_v1": TRUE_RATIO}
RATE = 989e12 * 0.40 * 3600  # FLOPs per GPU-hour (slurm/profiles/h100-example.yaml)


def true_loss(arch: str, n: float) -> float:
    return 2.30 + 406.4 * (n / ARCHS[arch]) ** -0.34


def run_row(arch: str, n: float, rng: np.random.Generator, k: int) -> dict:
    return {"arch": arch, "num_params": n, "tokens": TOKENS_PER_PARAM * n, "seed": k, "run_name": f"{arch}-{n:.3g}-{k}",
            "loss": true_loss(arch, n) * np.exp(NOISE_SD * rng.standard_normal())}


def cost(n: float) -> float:
    return 6.0 * n * TOKENS_PER_PARAM * n / RATE


def start(rng: np.random.Generator, seeds: int = 2) -> list[dict]:
    return [run_row(a, n, rng, k) for k in range(seeds) for a in ARCHS for n in SIZES]


def measure(rows: list[dict], boot: int, seed: int) -> tuple[float, bool]:
    """The full-bootstrap CI width of ρ at REF (inf when open-ended) and whether it covers the truth."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = analyse(_complete(pd.DataFrame(rows)), FitRequest(n_boot=boot, seed=seed, at=(REF,)))
    row = next(r for r in result.ratios if r["at"] == REF)
    lo, hi = row["lo"] or 0.0, row["hi"] if row["hi"] is not None else np.inf
    return hi - lo, bool(lo <= TRUE_RATIO <= hi)


def suggest_round(rows: list[dict], budget: float, boot: int, draws: int, seed: int,
                  sizes: tuple[float, ...]) -> list[tuple[str, float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design, result = sg.design_from_points(_complete(pd.DataFrame(rows)), FitRequest(n_boot=boot, seed=seed),
                                               ref=REF, num_draws=draws)
        assert result.points is not None
        pool = sg.extra_candidates(result.points, design, "num_params", RATE, sizes)
        choice = sg.choose_within(design, pool, budget, seed)
    return [(s.candidate.arch, s.candidate.num_params) for s in choice.steps]


def uniform_round(cursor: int, budget: float) -> tuple[list[tuple[str, float]], int]:
    order = [(a, n) for n in SIZES for a in ARCHS]
    picked, spent = [], 0.0
    while spent + cost(order[cursor % len(order)][1]) <= budget:
        a, n = order[cursor % len(order)]
        picked.append((a, n))
        spent += cost(n)
        cursor += 1
    return picked, cursor


@dataclass
class Arm:
    spent: list[float]
    width: list[float]
    covered: list[bool]


def simulate(rep: int, rounds: int = 3, budget: float = 15000.0, boot: int = 400, draws: int = 32,
             sizes: tuple[float, ...] = ()) -> dict[str, Arm]:
    """One synthetic study: both arms from the same starting ladder; per round GPU-h spent so far,
    the CI width and coverage."""
    rng = np.random.default_rng(10_000 + rep)
    first = start(rng)
    w0, c0 = measure(first, boot, rep)
    arms = {"suggest": Arm([0.0], [w0], [c0]), "uniform": Arm([0.0], [w0], [c0])}
    rows = {"suggest": list(first), "uniform": list(first)}
    outcome_rng = {k: np.random.default_rng([rep, i]) for i, k in enumerate(arms)}
    cursor = 0
    for r in range(rounds):
        for name, arm in arms.items():
            if name == "suggest":
                picked = suggest_round(rows[name], budget, boot, draws, rep * 100 + r, sizes)
            else:
                picked, cursor = uniform_round(cursor, budget)
            k = len(rows[name])
            rows[name] += [run_row(a, n, outcome_rng[name], k + i) for i, (a, n) in enumerate(picked)]
            width, covered = measure(rows[name], boot, rep)
            arm.spent.append(arm.spent[-1] + sum(cost(n) for _, n in picked))
            arm.width.append(width)
            arm.covered.append(covered)
    return arms


def _one(args: tuple) -> dict[str, Arm]:
    return simulate(*args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=15000.0, help="GPU-hours per round")
    parser.add_argument("--boot", type=int, default=400)
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--sizes", type=float, nargs="*", default=[], help="extra sizes suggest may add (e.g. 20e9)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    warnings.simplefilter("ignore", FitWarning)
    t0 = time.perf_counter()
    jobs = [(i, args.rounds, args.budget, args.boot, args.draws, tuple(args.sizes)) for i in range(args.reps)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_one, jobs))
    print(f"{args.reps} synthetic studies x {args.rounds} rounds of {args.budget:,.0f} GPU-h, {args.boot} bootstrap "
          f"draws, {args.draws} simulated outcomes per candidate ({time.perf_counter() - t0:.0f} s, "
          f"{args.workers} workers)")
    print(f"{'round':>5} {'arm':>8} {'GPU-h spent':>12} {'median width':>13} {'mean log width':>15} "
          f"{'open CIs':>9} {'coverage':>9}")
    for r in range(args.rounds + 1):
        for name in ("suggest", "uniform"):
            spent = np.mean([res[name].spent[r] for res in results])
            w = np.array([res[name].width[r] for res in results])
            cov = np.mean([res[name].covered[r] for res in results])
            finite = w[np.isfinite(w)]
            print(f"{r:>5} {name:>8} {spent:>12,.0f} {np.median(w):>13.3f} {np.mean(np.log(finite)):>15.3f} "
                  f"{np.mean(~np.isfinite(w)):>9.0%} {cov:>9.1%}")
    last = args.rounds
    a = np.array([res["suggest"].width[last] for res in results])
    b = np.array([res["uniform"].width[last] for res in results])
    w0 = np.array([res["suggest"].width[0] for res in results])
    sa = np.mean([res["suggest"].spent[last] for res in results])
    sb = np.mean([res["uniform"].spent[last] for res in results])
    print(f"after {last} rounds: median width suggest {np.median(a):.3f} ({sa:,.0f} GPU-h) vs uniform "
          f"{np.median(b):.3f} ({sb:,.0f} GPU-h); suggest narrower in {np.mean(a < b):.0%} of studies")
    ra, rb = (np.median(w0) - np.median(a)) / sa, (np.median(w0) - np.median(b)) / sb
    ratio = f"{ra / rb:.2f}" if rb > 0 else "n/a (uniform did not narrow it)"
    print(f"narrowing per 1,000 GPU-h (median widths): suggest {1000 * ra:.4f}, uniform {1000 * rb:.4f}, ratio {ratio}")
    log_a, log_b = np.log(a[np.isfinite(a)]), np.log(b[np.isfinite(b)])
    print(f"mean log width after {last} rounds: suggest {log_a.mean():.3f}, uniform {log_b.mean():.3f} (paired studies; "
          f"open CIs left out: {np.mean(~np.isfinite(a)):.0%} / {np.mean(~np.isfinite(b)):.0%})")


if __name__ == "__main__":
    main()
