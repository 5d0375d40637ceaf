"""Monte Carlo coverage of cluster resampling (whole runs drawn): token scans with 12 runs per
architecture (20B-360B), 4 evaluations per run, a run-level offset of sd 0.005 of log loss shared
by a run's evaluations, truth ρ_D = 0.637 (tests/scaling/test_chinchilla_cluster.py).

Usage:

    python analysis/benchmarks/bench_cluster_coverage.py [--reps 200] [--boot 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.scaling.test_chinchilla_cluster import coverage


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--boot", type=int, default=300)
    a = parser.parse_args()
    t = time.perf_counter()
    share, width, methods = coverage(a.reps, a.boot, start=10_000)
    print(f"{a.reps} scans x 2 references, {a.boot} draws ({time.perf_counter() - t:.0f} s), methods {set(methods)}: "
          f"coverage {share:.1%}, median CI width {width:.3f}")


if __name__ == "__main__":
    main()
