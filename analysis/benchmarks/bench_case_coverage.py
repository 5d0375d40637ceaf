"""Monte Carlo coverage of the case-resampling CIs (`diffsweep fit` with >= 30 distinct points per
architecture): a 6 x 6 grid of N (0.4-16B) and D (8B-500B) on Hoffmann et al.'s law, a candidate at
N/0.62 (so ρ_N = 0.62 at every reference), multiplicative noise of sd 0.005 on every point, and the
Chinchilla form fitted by least squares. Checks ρ_N at the two default references and the
compute-optimal exponent a = β/(α+β) = 0.452.

Usage:

    python analysis/benchmarks/bench_case_coverage.py [--reps 100] [--boot 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diffsweep.scaling.analysis import FitRequest, analyse  # noqa: E402
from diffsweep.scaling.forms import Form  # noqa: E402
from diffsweep.scaling.optimize import Objective  # noqa: E402
from tests.scaling.test_chinchilla import HOFFMANN, chinchilla_table  # noqa: E402

TRUE_A = HOFFMANN["beta"] / (HOFFMANN["alpha"] + HOFFMANN["beta"])


def coverage(reps: int, boot: int, noise_sd: float = 0.005, start: int = 0) -> dict[str, list]:
    out: dict[str, list] = {"rho_largest": [], "rho_geomean": [], "a": []}
    for i in range(start, start + reps):
        r = analyse(chinchilla_table({"N": 0.62}, noise_sd=noise_sd, seed=i),
                    FitRequest(form=Form.CHINCHILLA, objective=Objective.L2, n_boot=boot, seed=i))
        assert r["resampling"]["method"] == "case"
        rows = [row for row in r["ratios"] if row["axis"] == "N"]
        for key, row in zip(("rho_largest", "rho_geomean"), rows):
            out[key].append((row["lo"] <= 0.62 <= (row["hi"] or np.inf), (row["hi"] or np.inf) - row["lo"]))
        a = r["compute_optimal"]["transformer"]["a"]
        out["a"].append((a["lo"] <= TRUE_A <= a["hi"], a["hi"] - a["lo"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--boot", type=int, default=300)
    a = parser.parse_args()
    t = time.perf_counter()
    out = coverage(a.reps, a.boot)
    print(f"{a.reps} grids, {a.boot} case-resampling draws each ({time.perf_counter() - t:.0f} s)")
    for key, v in out.items():
        hits = np.array([c for c, _ in v])
        print(f"  {key:12} coverage {hits.mean():6.1%}  median width {np.median([w for _, w in v]):.3f}")


if __name__ == "__main__":
    main()
