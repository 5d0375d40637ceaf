"""Does following ``diffsweep suggest --budget`` narrow the ratio's CI faster per GPU-hour than adding
runs uniformly? Synthetic ladders with a known truth (issue #20, part 1).

Truth: Transformer L = 2.30 + 406.4·N^-0.34, DIFF V1 at 62% of its size (tests/scaling/synthetic.py),
noise sd 0.005 of log loss per run. Start: 5 sizes (0.83-13.1B) × ``--start-seeds`` seeds per
architecture (the Transformer ``--baseline-seeds``), each size trained on 20 tokens per parameter
(so a run costs 6·N·20N FLOPs, priced at an H100's 989 TFLOP/s at 40% MFU: 58 GPU-h at 830M,
14,460 at 13.1B). Every round spends up to ``--budget`` GPU-hours on new runs, whose losses are
drawn from the truth (the j-th new run of a cell has the same loss in both arms):

- A (suggest): ``choose_within`` over another seed of each measured point of either architecture
  (and, with ``--sizes``, new sizes), greedy within the budget;
- B (uniform): round-robin over (size, architecture) (``--uniform-diff-only``: DIFF's sizes only),
  smallest size first, continuing where the previous round stopped, each run added while it fits
  the round's budget (``--match-spend``: what suggest spent that round).

After each round: the precision of each arm's design (``spread``: the sd of log ρ̂ at ``--ref``
over 200 datasets from the truth) and, unless ``--precision-only``, both arms refitted as
``diffsweep fit`` would (the full parametric bootstrap, noise from the data) and the 95% CI of ρ
read: its width (an open-ended CI counts as infinite, so medians are reported) and whether it
covers the true 62%. Usage (RESULTS.md has the measured shapes):

    python analysis/benchmarks/bench_suggest.py [--reps 48] [--rounds 3] [--budget 15000] [--match-spend]
        [--start-seeds 1 --baseline-seeds 4] [--ref 2.8e9] [--precision-only] [--json] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from diffsweep.scaling.analysis import FitRequest, FitWarning, analyse
from diffsweep.scaling.fitting.fit import LawFit
from diffsweep.scaling.suggest import candidates
from diffsweep.scaling.suggest import preposterior as sg
from diffsweep.scaling.table import _complete

SIZES = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9
TRUE_RATIO, NOISE_SD, TOKENS_PER_PARAM = 0.62, 0.005, 20.0
ARCHS = {"transformer": 1.0, "diff_v1": TRUE_RATIO}
RATE = 989e12 * 0.40 * 3600  # FLOPs per GPU-hour (slurm/profiles/h100-example.yaml)
# --known-noise: every fit is told the true noise sd; --ref: where the ratio is read (default the top size)
KNOWN: dict[str, float | None] = {"noise_sd": None, "ref": 13.1e9}


def true_loss(arch: str, n: float) -> float:
    return 2.30 + 406.4 * (n / ARCHS[arch]) ** -0.34


def run_row(arch: str, n: float, rng: np.random.Generator, k: int) -> dict:
    return {"arch": arch, "num_params": n, "tokens": TOKENS_PER_PARAM * n, "seed": k, "run_name": f"{arch}-{n:.3g}-{k}",
            "loss": true_loss(arch, n) * np.exp(NOISE_SD * rng.standard_normal())}


def cost(n: float) -> float:
    return 6.0 * n * TOKENS_PER_PARAM * n / RATE


def start(rng: np.random.Generator, seeds: int = 2, baseline_seeds: int | None = None) -> list[dict]:
    """The starting ladder: ``seeds`` per (size, architecture), the Transformer's ``baseline_seeds``."""
    per_arch = {"transformer": seeds if baseline_seeds is None else baseline_seeds, "diff_v1": seeds}
    return [run_row(a, n, rng, k) for a in ARCHS for k in range(per_arch[a]) for n in SIZES]


class Outcomes:
    """Common random numbers: the j-th new run of a cell (architecture, size) in study ``rep`` has
    the same loss whichever arm buys it, so the arms differ by what they buy, not by luck."""

    def __init__(self, rep: int) -> None:
        self.rep = rep

    def rows(self, rows: list[dict], picked: list[tuple[str, float]]) -> list[dict]:
        out = list(rows)
        for a, n in picked:
            j = sum(1 for r in out if r["arch"] == a and np.isclose(r["num_params"], n))
            cell = [list(ARCHS).index(a), int(round(n / 1e6))]
            out.append(run_row(a, n, np.random.default_rng([self.rep, *cell, j]), len(out)))
        return out


def measure(rows: list[dict], boot: int, seed: int) -> tuple[float, bool]:
    """The full-bootstrap CI width of ρ at REF (inf when open-ended) and whether it covers the truth."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = analyse(_complete(pd.DataFrame(rows)), FitRequest(n_boot=boot, seed=seed, at=(KNOWN["ref"],),
                                                                   noise_sd=KNOWN["noise_sd"]))
    row = next(r for r in result.ratios if np.isclose(r["at"], KNOWN["ref"]))
    lo, hi = row["lo"] or 0.0, row["hi"] if row["hi"] is not None else np.inf
    return hi - lo, bool(lo <= TRUE_RATIO <= hi)


def spread(rows: list[dict], rep: int, replicates: int = 200) -> float:
    """How precise the design of ``rows`` (which runs, not their losses) is, by Monte Carlo from the
    truth: ``replicates`` datasets with the true losses plus noise, each architecture's law refitted
    (LawFit.refit, as a bootstrap draw), log ρ at REF read; the robust sd (IQR / 1.349) of it, +inf
    when over a quarter of them have no ρ. The j-th run of a cell gets the same noise in any design
    (common random numbers), so two designs differ by their runs, not their luck."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design, _ = sg.design_from_points(_complete(pd.DataFrame(rows)), FitRequest(n_boot=50, seed=rep),
                                          ref=KNOWN["ref"], num_draws=8)
        theta = {}
        for name, fit in design.fits.items():
            d = fit.data
            n = np.exp(d.u)
            truth = np.log([true_loss(name, x) for x in n])
            seen: dict[int, int] = {}
            noise = []
            for x in n:
                cell = int(round(x / 1e6))
                j = seen[cell] = seen.get(cell, -1) + 1
                noise.append(np.random.default_rng([rep, 7, list(ARCHS).index(name), cell, j])
                             .standard_normal(replicates))
            targets = truth[None, :] + NOISE_SD * np.array(noise).T
            theta[name] = LawFit(fit.law, replace(d, y=truth), fit.objective, fit.solution).refit(targets)
        log_rho = design.log_ratio(theta[design.baseline], theta[design.candidate])
    q25, q75 = np.nanpercentile(np.where(np.isfinite(log_rho), log_rho, np.nan), [25, 75])
    return float((q75 - q25) / 1.349) if np.mean(~np.isfinite(log_rho)) < 0.25 else np.inf


def suggest_round(rows: list[dict], budget: float, boot: int, draws: int, seed: int,
                  sizes: tuple[float, ...]) -> list[tuple[str, float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        design, result = sg.design_from_points(_complete(pd.DataFrame(rows)),
                                               FitRequest(n_boot=boot, seed=seed, noise_sd=KNOWN["noise_sd"]),
                                               ref=KNOWN["ref"], num_draws=draws)
        assert result.points is not None
        pool = candidates.extra_candidates(result.points, design, "num_params", RATE, sizes)
        choice = sg.choose_within(design, pool, budget, seed)
    return [(s.candidate.arch, s.candidate.num_params) for s in choice.steps]


def uniform_round(cursor: int, budget: float, sizes: tuple[float, ...],
                  archs: tuple[str, ...] = tuple(ARCHS)) -> tuple[list[tuple[str, float]], int]:
    """Round-robin over every (size, architecture) suggest may pick, smallest first, continuing where
    the previous round stopped; a run that does not fit what is left of the round's budget is passed
    over, and the round ends after a whole cycle that bought nothing."""
    order = [(a, n) for n in sorted({*SIZES, *sizes}) for a in archs]
    picked: list[tuple[str, float]] = []
    spent, idle = 0.0, 0
    while idle < len(order):
        a, n = order[cursor % len(order)]
        cursor += 1
        if spent + cost(n) <= budget:
            picked.append((a, n))
            spent += cost(n)
            idle = 0
        else:
            idle += 1
    return picked, cursor


@dataclass
class Arm:
    spent: list[float]
    width: list[float]
    covered: list[bool]
    spread: list[float]


def simulate(rep: int, rounds: int = 3, budget: float = 15000.0, boot: int = 400, draws: int = 32,
             sizes: tuple[float, ...] = (), seeds: int = 2, bootstrap: bool = True,
             baseline_seeds: int | None = None, match_spend: bool = False,
             uniform_archs: tuple[str, ...] = tuple(ARCHS)) -> dict[str, Arm]:
    """One synthetic study: both arms from the same starting ladder; per round the GPU-h spent so
    far, the design's precision and (``bootstrap``) the fit's CI width and coverage."""
    rng = np.random.default_rng(10_000 + rep)
    first = start(rng, seeds, baseline_seeds)
    w0, c0 = measure(first, boot, rep) if bootstrap else (np.nan, False)
    s0 = spread(first, rep)
    arms = {"suggest": Arm([0.0], [w0], [c0], [s0]), "uniform": Arm([0.0], [w0], [c0], [s0])}
    rows = {"suggest": list(first), "uniform": list(first)}
    outcomes = Outcomes(rep)
    cursor = 0
    for r in range(rounds):
        for name, arm in arms.items():
            if name == "suggest":
                picked = suggest_round(rows[name], budget, boot, draws, rep * 100 + r, sizes)
            else:  # suggest went first: with match_spend, uniform gets what suggest spent this round
                round_budget = arms["suggest"].spent[-1] - arms["suggest"].spent[-2] if match_spend else budget
                picked, cursor = uniform_round(cursor, round_budget, sizes, uniform_archs)
            rows[name] = outcomes.rows(rows[name], picked)
            width, covered = measure(rows[name], boot, rep) if bootstrap else (np.nan, False)
            arm.spent.append(arm.spent[-1] + sum(cost(n) for _, n in picked))
            arm.width.append(width)
            arm.covered.append(covered)
            arm.spread.append(spread(rows[name], rep))
    return arms


def _one(args: tuple) -> dict[str, Arm]:
    KNOWN["noise_sd"], KNOWN["ref"] = args[-2], args[-1]
    return simulate(*args[:-2])


def paired(start_: np.ndarray, a: np.ndarray, b: np.ndarray, spent_a: np.ndarray, spent_b: np.ndarray) -> dict:
    """Per study, how much each arm narrowed log(width) per 1,000 GPU-h, and the paired difference
    (studies where all three are finite and positive)."""
    with np.errstate(all="ignore"):
        ok = np.isfinite(start_) & np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0) & (spent_a > 0) & (spent_b > 0)
        ga = 1000 * (np.log(start_) - np.log(a))[ok] / spent_a[ok]
        gb = 1000 * (np.log(start_) - np.log(b))[ok] / spent_b[ok]
    diff = ga - gb
    return {"studies": int(ok.sum()), "suggest": float(ga.mean()), "uniform": float(gb.mean()),
            "ratio": float(ga.mean() / gb.mean()), "difference": float(diff.mean()),
            "se": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan"),
            "positive": float(np.mean(diff > 0))}


def dominance(a: np.ndarray, b: np.ndarray, spent_a: np.ndarray, spent_b: np.ndarray) -> dict:
    """Per study, suggest's final sd or width ``a`` against uniform's ``b``: how often suggest is at least
    as narrow for at most 2% more GPU-h, and the mean gap log(b / a) (> 0: suggest narrower) with its
    se over the studies where both are finite. With --match-spend the spends are equal, so the gap
    compares the designs at equal cost, free of diminishing returns."""
    with np.errstate(all="ignore"):
        gap = np.log(b) - np.log(a)
    ok = np.isfinite(gap)
    return {"studies": int(ok.sum()),
            "suggest_as_narrow_for_at_most_2pct_more_gpu_hours": float(np.mean((a <= b) & (spent_a <= spent_b * 1.02))),
            "log_gap": float(gap[ok].mean()),
            "log_gap_se": float(gap[ok].std(ddof=1) / np.sqrt(ok.sum())) if ok.sum() > 1 else float("nan"),
            "spent_ratio": float(spent_a.sum() / spent_b.sum())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--budget", type=float, default=15000.0, help="GPU-hours per round")
    parser.add_argument("--boot", type=int, default=400)
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--sizes", type=float, nargs="*", default=[], help="extra sizes suggest may add (e.g. 20e9)")
    parser.add_argument("--start-seeds", type=int, default=2, help="seeds per (size, architecture) to start from")
    parser.add_argument("--baseline-seeds", type=int, default=None,
                        help="seeds per size of the Transformer to start from (default --start-seeds)")
    parser.add_argument("--ref", type=float, default=13.1e9, help="where the ratio is read (default 13.1e9)")
    parser.add_argument("--match-spend", action="store_true",
                        help="uniform spends each round what suggest spent (compare precision at equal GPU-h)")
    parser.add_argument("--uniform-diff-only", action="store_true",
                        help="uniform adds DIFF runs only (a stronger rival when the Transformer is already dense)")
    parser.add_argument("--known-noise", action="store_true", help="fit with the true noise sd (--noise-sd)")
    parser.add_argument("--precision-only", action="store_true",
                        help="measure the designs' precision only, not the fit's bootstrap CI (faster)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    warnings.simplefilter("ignore", FitWarning)
    t0 = time.perf_counter()
    jobs = [(i, args.rounds, args.budget, args.boot, args.draws, tuple(args.sizes), args.start_seeds,
             not args.precision_only, args.baseline_seeds, args.match_spend,
             ("diff_v1",) if args.uniform_diff_only else tuple(ARCHS), NOISE_SD if args.known_noise else None, args.ref)
            for i in range(args.reps)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(_one, jobs))
    last = args.rounds

    def column(arm: str, field: str, r: int = last) -> np.ndarray:
        return np.array([getattr(res[arm], field)[r] for res in results], dtype=float)

    spent_a, spent_b = column("suggest", "spent"), column("uniform", "spent")
    summary = {
        "studies": args.reps, "rounds": args.rounds, "budget_gpu_hours": args.budget,
        "seconds": round(time.perf_counter() - t0, 1),
        "spent_gpu_hours": {"suggest": float(spent_a.mean()), "uniform": float(spent_b.mean())},
        "precision": paired(column("suggest", "spread", 0), column("suggest", "spread"), column("uniform", "spread"),
                            spent_a, spent_b),
    }
    summary["dominance"] = dominance(column("suggest", "spread"), column("uniform", "spread"), spent_a, spent_b)
    if not args.precision_only:
        summary["bootstrap_width"] = paired(column("suggest", "width", 0), column("suggest", "width"),
                                            column("uniform", "width"), spent_a, spent_b)
        summary["bootstrap_dominance"] = dominance(column("suggest", "width"), column("uniform", "width"),
                                                   spent_a, spent_b)
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.reps} synthetic studies x {args.rounds} rounds of {args.budget:,.0f} GPU-h, {args.boot} bootstrap "
          f"draws, {args.draws} simulated outcomes per candidate ({summary['seconds']:.0f} s, {args.workers} workers)")
    print(f"{'round':>5} {'arm':>8} {'GPU-h spent':>12} {'precision (sd)':>15} {'median width':>13} {'open CIs':>9} "
          f"{'coverage':>9}")
    for r in range(args.rounds + 1):
        for name in ("suggest", "uniform"):
            w = column(name, "width", r)
            print(f"{r:>5} {name:>8} {column(name, 'spent', r).mean():>12,.0f} "
                  f"{np.median(column(name, 'spread', r)):>15.4f} {np.median(w):>13.3f} "
                  f"{np.mean(np.isinf(w)):>9.0%} {np.mean(column(name, 'covered', r)):>9.1%}")
    for key, what in (("dominance", "precision (sd)"), ("bootstrap_dominance", "bootstrap CI width")):
        if key in summary:
            d = summary[key]
            print(f"{what}: suggest as narrow for at most 2% more GPU-h in "
                  f"{d['suggest_as_narrow_for_at_most_2pct_more_gpu_hours']:.0%} of studies; log(uniform / suggest) "
                  f"{d['log_gap']:.4f} ± {d['log_gap_se']:.4f} (se) over {d['studies']}; suggest spent "
                  f"{d['spent_ratio']:.2f}x uniform's GPU-h")
    for key, what in (("precision", "the design's precision (sd of log ratio over 200 datasets from the truth)"),
                      ("bootstrap_width", "the fit's 95% bootstrap CI width")):
        if key in summary:
            p = summary[key]
            print(f"{what}: narrowing of its log per 1,000 GPU-h over {p['studies']} studies: suggest "
                  f"{p['suggest']:.4f}, uniform {p['uniform']:.4f} (ratio {p['ratio']:.2f}); paired difference "
                  f"{p['difference']:.4f} ± {p['se']:.4f} (se), suggest ahead in {p['positive']:.0%}")


if __name__ == "__main__":
    main()
