"""Monte Carlo coverage of best-of-grid fits (`diffsweep fit --tune lr`) on tuned studies with a known truth.

Each study: the Transformer and DIFF on the Table 9 ladder (0.83-13.1B, L(N) = 2.30 + 406.4 N^-0.34,
DIFF at N/0.62), each run at every learning rate of the grid [1, 2, 4, 8]e-4 with a loss bowl
exp(K * log2(lr / lr*)^2) around the arm's own optimum lr*, noise sd SD of log loss per run.
The arms' optima differ (Transformer 2.83e-4, DIFF 5.66e-4: each half an octave from its two
nearest grid values, so two candidates tie for the best and selection is as noisy as it gets);
'edge' puts DIFF's optimum at 11.3e-4, beyond the grid (its best grid value, 8e-4, is still half
an octave away). Both arms' best grid values thus sit at the same factor exp(K/4) above their
curve, so the true best-vs-best ratio is 0.62 at every size. 'flat': the Transformer's bowl nearly
flat (K = 0.0005: its four candidates within the noise, the largest winner's curse) and DIFF's sharp
(K = 0.05), both optima on the grid: the naive reading's bias shows here.

Readings, each over the same simulated studies:
  tuned  the selection redone in every bootstrap draw, its bias removed (diffsweep.scaling.tuning)
  naive  each cell's lowest mean loss taken as a point, fitted once (the untuned bootstrap)
For each: coverage of the 95% CI of rho at the largest size and at the geometric mean, the median CI
width, and the median of the point estimate (its bias against 0.62; the mean of a ratio this
uncertain is dominated by its long upper tail).

    python analysis/benchmarks/coverage_tuned.py [--designs inside-1,inside-2,edge-1,edge-2,flat-1,flat-2] [--experiments 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.table import _complete

SIZES = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9
GRID = np.array([1.0, 2.0, 4.0, 8.0]) * 1e-4
RHO = 0.62
# design -> arch -> (its optimum lr*, its bowl's curvature K: log-loss rise per octave^2); None: --k
DESIGNS: dict[str, dict[str, tuple[float, float | None]]] = {
    "inside": {"transformer": (2e-4 * 2 ** 0.5, None), "diff_v1": (4e-4 * 2 ** 0.5, None)},
    "edge": {"transformer": (2e-4 * 2 ** 0.5, None), "diff_v1": (8e-4 * 2 ** 0.5, None)},
    # the Transformer's bowl nearly flat (its four candidates within the noise: the largest winner's
    # curse), DIFF's sharp (one clear winner); both optima on the grid, so the truth is still 0.62
    "flat": {"transformer": (2e-4, 0.0005), "diff_v1": (4e-4, 0.05)},
}


def study(rng: np.random.Generator, seeds: int, design: dict[str, tuple[float, float | None]], k: float,
          sd: float) -> pd.DataFrame:
    rows = []
    for arch, rho in (("transformer", 1.0), ("diff_v1", RHO)):
        optimum, curvature = design[arch]
        for n in SIZES:
            for lr in GRID:
                bowl = np.exp((k if curvature is None else curvature) * np.log2(lr / optimum) ** 2)
                for seed in range(seeds):
                    loss = (2.30 + 406.4 * (n / rho) ** -0.34) * bowl * np.exp(sd * rng.standard_normal())
                    rows.append({"arch": arch, "num_params": n, "tokens": 1e10, "loss": loss, "seed": seed,
                                 "lr": lr, "run_name": f"{arch}-{n:.3g}-lr{lr:g}-s{seed}"})
    return _complete(pd.DataFrame(rows))


def naive_points(points: pd.DataFrame) -> pd.DataFrame:
    """Each cell's lowest-mean candidate's runs, as an untuned table."""
    mean = points.assign(y=np.log(points["loss"])).groupby(["arch", "num_params", "lr"])["y"].mean()
    best = mean.groupby(level=[0, 1]).idxmin()
    keep = set(best.tolist())
    return points[[(a, n, lr) in keep for a, n, lr in zip(points["arch"], points["num_params"], points["lr"])]]


def run(design: str, experiments: int, boot: int, k: float, sd: float) -> None:
    where, seeds = design.split("-")
    rng = np.random.default_rng(2026)
    stats = {"tuned": [], "naive": []}
    start = time.time()
    for _ in range(experiments):
        pts = study(rng, int(seeds), DESIGNS[where], k, sd)
        seed = int(rng.integers(1 << 30))
        for name, table, request in (("tuned", pts, FitRequest(n_boot=boot, seed=seed, tune=("lr",))),
                                     ("naive", naive_points(pts), FitRequest(n_boot=boot, seed=seed))):
            r = analyse(table, request)
            stats[name].append([(row["ratio"], row["lo"], np.inf if row["hi"] is None else row["hi"])
                                for row in r.ratios[:2]])
    took = time.time() - start
    for name, rows in stats.items():
        a = np.array(rows, float)  # (experiments, 2 refs, 3)
        cover = np.mean((a[:, :, 1] <= RHO) & (RHO <= a[:, :, 2]), axis=0)
        width = np.median(a[:, :, 2] - a[:, :, 1], axis=0)
        median = np.nanmedian(a[:, :, 0], axis=0)  # an undefined ratio (no finite value reached) is left out
        print(f"{design:9s} {name:5s}  coverage largest {cover[0]:.3f}  geomean {cover[1]:.3f}   "
              f"median width {width[0]:.3f} / {width[1]:.3f}   median estimate {median[0]:.4f} / {median[1]:.4f} "
              f"(truth {RHO})")
    print(f"  ({experiments} studies x {boot} draws, K={k}, sd={sd}: {took:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--designs", default="inside-1,inside-2,edge-1,edge-2,flat-1,flat-2")
    ap.add_argument("--experiments", type=int, default=200)
    ap.add_argument("--boot", type=int, default=250)
    ap.add_argument("--k", type=float, default=0.01, help="bowl curvature: log-loss rise per octave^2 from lr*")
    ap.add_argument("--sd", type=float, default=0.005, help="noise sd of log loss per run")
    args = ap.parse_args()
    for design in args.designs.split(","):
        run(design, args.experiments, args.boot, args.k, args.sd)


if __name__ == "__main__":
    main()
