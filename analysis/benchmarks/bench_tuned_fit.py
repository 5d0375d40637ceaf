"""Time of a tuned fit against the untuned fit of the same runs, side by side in one process.

The table: 1,000 runs (2 architectures x 25 sizes x 4 learning rates x 5 seeds, the coverage_tuned
'inside' study on a longer ladder); `analyse` with --tune lr against `analyse` of the same table
untuned (every run a point of its size), both with the same number of draws.

    python analysis/benchmarks/bench_tuned_fit.py [--boot 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import coverage_tuned
import numpy as np

from diffsweep.scaling.analysis import FitRequest, analyse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    coverage_tuned.SIZES = np.geomspace(0.1e9, 13.1e9, 25)
    points = coverage_tuned.study(np.random.default_rng(0), 5, coverage_tuned.DESIGNS["inside"], 0.01, 0.005)
    print(f"{len(points)} runs, {args.boot} draws, median of {args.repeats}")
    times: dict[str, list[float]] = {"untuned": [], "tuned": []}
    for _ in range(args.repeats):
        for name, request in (("untuned", FitRequest(n_boot=args.boot)),
                              ("tuned", FitRequest(n_boot=args.boot, tune=("lr",)))):
            start = time.perf_counter()
            analyse(points, request)
            times[name].append(time.perf_counter() - start)
    untuned, tuned = statistics.median(times["untuned"]), statistics.median(times["tuned"])
    print(f"untuned {untuned:.2f} s   tuned {tuned:.2f} s   tuned/untuned {tuned / untuned:.2f}x")


if __name__ == "__main__":
    main()
