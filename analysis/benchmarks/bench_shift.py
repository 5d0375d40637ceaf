"""Monte Carlo check of the joint size-multiplier model (`result["shift_model"]`): coverage and
width of its ρ CI, and how often its test rejects one ρ, on parallel and non-parallel ladders
(docs/references.md §4 design: sizes 0.83-13.1B, truth ρ = 0.62).

Usage:

    python analysis/benchmarks/bench_shift.py [--reps 200] [--boot 250]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diffsweep.scaling.analysis import FitRequest, analyse
from tests.scaling.synthetic import TRUE_RATIO, ladder
from tests.scaling.test_shift import non_parallel


def run(label: str, make, reps: int, boot: int, noise_sd: float | None, truth: float | None) -> None:
    t = time.perf_counter()
    rho, covered, width, rejected = [], 0, [], 0
    for i in range(reps):
        m = analyse(make(np.random.default_rng(10_000 + i)),
                    FitRequest(n_boot=boot, noise_sd=noise_sd, seed=i)).to_dict()["shift_model"]["diff_v1"]
        rho.append(m["rho"])
        width.append(m["hi"] - m["lo"])
        covered += truth is not None and m["lo"] <= truth <= m["hi"]
        rejected += not m["supported"]
    cover = f"{covered / reps:6.1%}" if truth is not None else "     —"
    print(f"{label:58} {np.median(rho):6.3f} {np.std(rho):6.3f} {cover} {np.median(width):6.3f} "
          f"{rejected / reps:7.1%}   ({time.perf_counter() - t:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--boot", type=int, default=250)
    a = parser.parse_args()
    print(f"{a.reps} ladders each, {a.boot} draws; columns: median ρ, sd ρ, CI coverage, median CI width, rejected")
    run("parallel, 5 sizes x 1 seed, sd 0.005 (given)", lambda r: ladder(0.005, 1, r), a.reps, a.boot, 0.005, TRUE_RATIO)
    run("parallel, 5 sizes x 2 seeds, sd 0.005 (from seeds)", lambda r: ladder(0.005, 2, r), a.reps, a.boot, None,
        TRUE_RATIO)
    run("parallel, 5 sizes x 1 seed, sd 0.005 (from residuals)", lambda r: ladder(0.005, 1, r), a.reps, a.boot, None,
        TRUE_RATIO)
    for seeds, sd in ((1, 0.005), (3, 0.005), (2, 0.001)):
        run(f"non-parallel (α 0.38 vs 0.34), {seeds} seed(s), sd {sd} (from {'seeds' if seeds > 1 else 'residuals'})",
            lambda r, s=seeds, d=sd: non_parallel(r, s, d), a.reps, a.boot, None, None)


if __name__ == "__main__":
    main()
