"""Monte Carlo coverage of `diffsweep compare` on a tuned sweep: each cell at its best candidate.

Each study: two cells (the baseline arm and another, one size each), every candidate learning rate
run with SEEDS seeds, final loss = the candidate's true mean + N(0, SD). True means (loss against
the log2 position of a grid of four learning rates an octave apart) in six shapes; the truth is the
best-vs-best difference min(other) - min(baseline) over the grid.

  inside         both optima inside the grid and different (1.3 vs 2.0 octaves), gaps ~ the noise
  edge           the baseline's optimum beyond the grid's smallest value, the other's inside
  flat           the other arm insensitive to lr: its four candidates tied
  flatflat       both arms flat: every candidate of both tied
  apart          steep bowls: the winners are clear, no selection error
  flat8-vs-one   eight tied candidates against a baseline of one untuned run: the largest winner's
                 curse on one side only

Readings of the same simulated studies:
  compare  diffsweep.compare.tuned.compare_cells: each cell's selection error drawn half as the
           winner's own noise, half as a tie with the candidates within its noise
  naive    the winners' means in a Student t interval with the pooled sd, as if they had not been chosen
Printed: coverage of the 95% CI, its mean width, and the mean error of the naive difference (its bias).

    python analysis/benchmarks/coverage_tuned_compare.py [--reps 2000] [--seeds 2,3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy import stats

from diffsweep.compare.tuned import compare_cells

GRID = np.arange(4.0)  # four learning rates an octave apart (log2 positions)
SD = 0.01  # seed sd of a final loss


def bowl(best: float, curve: float, floor: float = 3.0) -> np.ndarray:
    """True mean loss at each grid lr: quadratic in log lr around the arm's own best."""
    return floor + curve * (GRID - best) ** 2


# shape -> (baseline's true means, the other arm's); the truth is min(other) - min(baseline)
SHAPES = {
    "inside": (bowl(1.3, 0.004), bowl(2.0, 0.004) - 0.003),
    "edge": (bowl(-1.0, 0.004), bowl(2.0, 0.004) - 0.01),
    "flat": (bowl(1.3, 0.004), np.full(4, 3.005)),
    "flatflat": (np.full(4, 3.0), np.full(4, 3.005)),
    "apart": (bowl(1.0, 0.05), bowl(2.0, 0.05)),
    "flat8-vs-one": (np.array([3.0]), np.full(8, 3.005)),
}


def study(shape: str, seeds: int, rng: np.random.Generator) -> dict[str, dict[str, list[float]]]:
    """One simulated study: cell -> candidate -> one final loss per seed."""
    return {cell: {f"lr{i}": list(mu + SD * rng.standard_normal(seeds)) for i, mu in enumerate(truth)}
            for cell, truth in zip(("a", "b"), SHAPES[shape])}


def naive_interval(values: dict[str, dict[str, list[float]]], level: float = 0.95) -> tuple[float, float, float]:
    """The winners' means read as if nothing had been chosen: their difference and a t interval with
    the pooled sd of every candidate."""
    arrays = [np.array(v) for c in values.values() for v in c.values()]
    df = sum(len(v) - 1 for v in arrays)
    sd = np.sqrt(sum(((v - v.mean()) ** 2).sum() for v in arrays) / df)
    (na, a), (nb, b) = (min((np.mean(v), len(v)) for v in values[c].values())[::-1] for c in ("a", "b"))
    half = stats.t.ppf(0.5 + level / 2, df) * sd * np.sqrt(1 / na + 1 / nb)
    return b - a, b - a - half, b - a + half


def coverage(shape: str, seeds: int, reps: int, seed: int = 0) -> dict[str, float]:
    """Coverage and mean width of both readings' 95% CIs, and the naive difference's mean error."""
    base, other = SHAPES[shape]
    truth = other.min() - base.min()
    rng = np.random.default_rng(seed)
    hits = naive_hits = 0
    widths, naive_widths, naive_errors = [], [], []
    for _ in range(reps):
        values = study(shape, seeds, rng)
        r = compare_cells(values, "a", seed=int(rng.integers(1 << 31))).cells[1]
        assert r.lo is not None and r.hi is not None
        hits += r.lo <= truth <= r.hi
        widths.append(r.hi - r.lo)
        d, lo, hi = naive_interval(values)
        naive_hits += lo <= truth <= hi
        naive_widths.append(hi - lo)
        naive_errors.append(d - truth)
    return {"compare": hits / reps, "compare_width": float(np.mean(widths)), "naive": naive_hits / reps,
            "naive_width": float(np.mean(naive_widths)), "naive_bias": float(np.mean(naive_errors))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--seeds", default="2,3")
    args = parser.parse_args()
    print(f"{'shape':<14} seeds  compare  width   naive  width   naive bias  (95% CIs, {args.reps} studies, sd {SD})")
    for seeds in (int(s) for s in args.seeds.split(",")):
        for shape in SHAPES:
            start = time.perf_counter()
            c = coverage(shape, seeds, args.reps, seed=seeds)
            print(f"{shape:<14} {seeds:>5}  {c['compare']:.3f}  {c['compare_width']:.4f}  {c['naive']:.3f}  "
                  f"{c['naive_width']:.4f}  {c['naive_bias']:+.4f}  ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
