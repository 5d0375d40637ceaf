"""Coverage of diffsweep.sweep.compare's CI of a row difference, and how often each Table 6
difference is called "within seed noise": the paper's Table 6 losses as the truth, seed sd 0.005
nats, 7 rows x 2, 3 and 5 seeds, 3,000 replicates each, baseline DIFF 8x128.

    python analysis/benchmarks/coverage_seed_noise.py
"""
import numpy as np, time
from diffsweep.sweep.compare import compare_rows, WITHIN
TABLE6 = {"transformer-hd_128": 3.087, "transformer-hd_256": 3.088, "transformer-hd_256-gn_on": 3.086,
          "diff_v1-hd_128": 3.062, "diff_v1-hd_128-gn_off": 3.122, "diff_v1-hd_128-lam_0.8": 3.065,
          "diff_v1-hd_128-lam_0.5": 3.066}
base = "diff_v1-hd_128"
for seeds in (2, 3, 5):
    rng = np.random.default_rng(100 + seeds); reps = 3000
    hits = {r: 0 for r in TABLE6 if r != base}; within = {r: 0 for r in hits}
    t0 = time.perf_counter()
    for _ in range(reps):
        c = compare_rows({r: list(m + 0.005 * rng.standard_normal(seeds)) for r, m in TABLE6.items()}, base)
        for r in c.rows:
            if r.row != base:
                hits[r.row] += r.lo <= TABLE6[r.row] - TABLE6[base] <= r.hi
                within[r.row] += r.verdict == WITHIN
    cov = [h / reps for h in hits.values()]
    print(f"seeds {seeds}: coverage min {min(cov):.3f} max {max(cov):.3f} mean {np.mean(cov):.3f}; "
          f"'within' rate: lam_0.8 (0.003) {within['diff_v1-hd_128-lam_0.8']/reps:.2f}, lam_0.5 (0.004) {within['diff_v1-hd_128-lam_0.5']/reps:.2f}, "
          f"gn_off (0.060) {within['diff_v1-hd_128-gn_off']/reps:.2f}; {time.perf_counter()-t0:.1f} s")
