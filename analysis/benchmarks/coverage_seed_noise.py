"""Coverage of diffsweep.compare.runs's CI of a row difference, and how often each Table 6
difference is called "within seed noise": the paper's Table 6 losses as the truth, seed sd 0.005
nats, 7 rows x 2, 3 and 5 seeds, 3,000 replicates each, baseline DIFF 8x128.

    python analysis/benchmarks/coverage_seed_noise.py
"""

from __future__ import annotations

import time

import numpy as np

from diffsweep.compare.runs import WITHIN, compare_rows

# Paper Table 6, validation loss at 1.4B.
TABLE6 = {"transformer-hd_128": 3.087, "transformer-hd_256": 3.088, "transformer-hd_256-gn_on": 3.086,
          "diff_v1-hd_128": 3.062, "diff_v1-hd_128-gn_off": 3.122, "diff_v1-hd_128-lam_0.8": 3.065,
          "diff_v1-hd_128-lam_0.5": 3.066}
BASE, SEED_SD, REPS = "diff_v1-hd_128", 0.005, 3000


def main() -> None:
    for seeds in (2, 3, 5):
        rng = np.random.default_rng(100 + seeds)
        hits = {r: 0 for r in TABLE6 if r != BASE}
        within = dict.fromkeys(hits, 0)
        t0 = time.perf_counter()
        for _ in range(REPS):
            c = compare_rows({r: list(m + SEED_SD * rng.standard_normal(seeds)) for r, m in TABLE6.items()}, BASE)
            for r in c.rows:
                if r.row != BASE:
                    hits[r.row] += r.lo <= TABLE6[r.row] - TABLE6[BASE] <= r.hi
                    within[r.row] += r.verdict == WITHIN
        cov = [h / REPS for h in hits.values()]
        print(f"seeds {seeds}: coverage min {min(cov):.3f} max {max(cov):.3f} mean {np.mean(cov):.3f}; 'within' "
              f"rate: lam_0.8 (0.003) {within['diff_v1-hd_128-lam_0.8'] / REPS:.2f}, lam_0.5 (0.004) "
              f"{within['diff_v1-hd_128-lam_0.5'] / REPS:.2f}, gn_off (0.060) {within['diff_v1-hd_128-gn_off'] / REPS:.2f}; "
              f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
