"""How often a bootstrap refit misses the optimum of its draw (issue #16, item 5b).

Ladders of 5 sizes x 1 seed (noise sd 0.005 of log loss; transformer and DIFF V1), each fitted;
draws = fitted curve + N(0, 0.007^2) noise; each draw refitted (a) warm-started at the estimate
only (the old refit) and (b) by ``LawFit.refit`` (warm start + the draw's best grid start), and
compared with a full multi-start fit of the draw. Prints the share of draws whose refit objective
is above the multi-start's (by more than 1e-6 relative) and the worst relative excess.

    python analysis/benchmarks/refit_starts.py [--ladders 3] [--draws 100]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from diffsweep.scaling.fitting.fit import fit_law
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.optimize import (
    Data,
    Objective,
    multistart,
    objective_value,
    solve_batch,
)


def ladder(rng: np.random.Generator, sd: float = 0.005) -> pd.DataFrame:
    sizes = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9
    rows = [{"arch": arch, "num_params": n, "loss": (2.30 + 406.4 * (n / rho) ** -0.34) * np.exp(sd * rng.standard_normal())}
            for arch, rho in (("transformer", 1.0), ("diff_v1", 0.62)) for n in sizes]
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ladders", type=int, default=3)
    ap.add_argument("--draws", type=int, default=100)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    excess = {"warm start only": [], "LawFit.refit": []}
    for _ in range(args.ladders):
        points = ladder(rng)
        for arch in ("transformer", "diff_v1"):
            rows = points[points["arch"] == arch]
            data = Data(u=np.log(rows["num_params"].to_numpy(float)), y=np.log(rows["loss"].to_numpy(float)))
            fit = fit_law(Law("offset"), data)
            targets = fit.fitted[None, :] + 0.007 * rng.standard_normal((args.draws, len(rows)))
            best = np.array([multistart(fit.law, Data(u=data.u, y=y), Objective.L2).value for y in targets])
            warm, _ = solve_batch(fit.law, data, np.repeat(fit.theta[None, :], args.draws, axis=0), Objective.L2,
                                  y=targets, max_iter=100)
            for name, theta in (("warm start only", warm), ("LawFit.refit", fit.refit(targets))):
                value = objective_value(fit.law, data, theta, Objective.L2, y=targets)
                excess[name].extend((value - best) / best)
    for name, e in excess.items():
        e = np.array(e)
        print(f"{name:16s}: {np.mean(e > 1e-6):6.1%} of {len(e)} draws above the multi-start optimum; "
              f"worst at {1 + e.max():.3g}x the optimum")


if __name__ == "__main__":
    main()
