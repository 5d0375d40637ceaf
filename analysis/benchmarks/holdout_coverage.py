"""Coverage of the hold-out check's interval: the prediction interval against the curve's band alone.

The observed value at the held-out (largest) size is a noisy run, not the curve. Synthetic ladders
with a known truth (10 sizes 0.2-13.1B, 1 seed, noise sd 0.005 of log loss given with --noise-sd,
Transformer + DIFF V1 at 62%) are fitted with --holdout largest; the share of held-out observations
inside each 95% interval is printed. Usage:

    python analysis/benchmarks/holdout_coverage.py [--replicates 200] [--boot 400]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd

from diffsweep.scaling.analysis import FitRequest, FitWarning, analyse
from diffsweep.scaling.table import _complete


def ladder(rng: np.random.Generator, sizes: np.ndarray, sd: float = 0.005) -> pd.DataFrame:
    """Transformer on L = 2.3 + 406.4 N^-0.34 and DIFF V1 at 62% of its size; one run per size."""
    rows = [{"arch": arch, "num_params": n, "tokens": 1e10, "run_name": f"{arch}-{n:.3g}",
             "loss": (2.3 + 406.4 * (n / ratio) ** -0.34) * np.exp(sd * rng.standard_normal())}
            for arch, ratio in (("transformer", 1.0), ("diff_v1", 0.62)) for n in sizes]
    return _complete(pd.DataFrame(rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--boot", type=int, default=400)
    args = parser.parse_args()
    warnings.simplefilter("ignore", FitWarning)
    sizes = np.geomspace(0.2e9, 13.1e9, 10)
    pi, band, widths, total = 0, 0, [], 0
    start = time.perf_counter()
    for i in range(args.replicates):
        points = ladder(np.random.default_rng(1000 + i), sizes)
        result = analyse(points, FitRequest(n_boot=args.boot, holdout=True, noise_sd=0.005, seed=i)).to_dict()
        for p in result["holdout"]["predictions"].values():
            pi += p["lo"] <= p["observed"] <= p["hi"]
            band += p["curve_lo"] <= p["observed"] <= p["curve_hi"]
            widths.append(((p["hi"] - p["lo"]) / p["predicted"], (p["curve_hi"] - p["curve_lo"]) / p["predicted"]))
            total += 1
    w = np.median(np.array(widths), axis=0)
    print(f"{args.replicates} ladders x 2 architectures = {total} held-out points, {args.boot} draws each "
          f"({time.perf_counter() - start:.0f} s)")
    print(f"  prediction interval: coverage {pi / total:.1%}, median width {100 * w[0]:.2f}% of the loss")
    print(f"  curve band alone:    coverage {band / total:.1%}, median width {100 * w[1]:.2f}% of the loss")


if __name__ == "__main__":
    main()
