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

from tests.scaling.test_chinchilla import case_coverage as coverage


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
