"""How long `diffsweep fit` takes on 1,000 runs with 1,000 bootstrap draws (target: <= 10 s).

A synthetic 1,000-run table (Transformer, DIFF V1, DIFF V2 x 10 sizes 830M-13.1B x 33-34 seeds,
noise sd 0.005 of log loss) is fitted three ways in one go:
  1. the analysis in process (fits, 1,000 paired draws, ratios, ratio curve, per-point multipliers);
  2. the same with --holdout largest (a second full fit without the largest size);
  3. `diffsweep fit --csv` end to end in a fresh process (start-up, CSV, analysis, report, 3 PNG
     plots, frozen table), without and with logging the fit run to a fresh SQLite MLflow store.
Usage:

    python analysis/benchmarks/bench_fit.py [--runs 1000] [--boot 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.table import _complete


def table(runs: int, rng: np.random.Generator) -> pd.DataFrame:
    sizes = np.geomspace(0.83e9, 13.1e9, 10)
    ratios = {"transformer": 1.0, "diff_v1": 0.62, "diff_v2": 0.7}
    rows = []
    for i in range(runs):
        arch = list(ratios)[i % 3]
        n = sizes[(i // 3) % len(sizes)]
        loss = (2.3 + 406.4 * (n / ratios[arch]) ** -0.34) * np.exp(0.005 * rng.standard_normal())
        rows.append({"arch": arch, "num_params": n, "tokens": 1e10, "loss": loss, "seed": i // 30,
                     "run_name": f"r{i}"})
    return _complete(pd.DataFrame(rows))


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    points = table(args.runs, np.random.default_rng(0))
    req = FitRequest(n_boot=args.boot, at=(11e9,))
    t_fit, r = timed(lambda: analyse(points, req).to_dict(), args.repeat)
    t_hold, _ = timed(lambda: analyse(points, FitRequest(n_boot=args.boot, at=(11e9,), holdout=True)), args.repeat)
    print(f"{args.runs} runs, {args.boot} draws, 3 architectures (median of {args.repeat})")
    print(f"  analysis in process:           {t_fit:6.2f} s")
    print(f"  analysis + --holdout largest:   {t_hold:6.2f} s")
    for row in r["ratios"]:
        print(f"    {row['candidate']} at {row['at_label']}: {row['ratio']:.3f} [{row['lo']:.3f}, {row['hi']:.3f}]")
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "runs.csv"
        points.to_csv(csv, index=False)
        for label, extra in (("CLI --no-log", ["--no-log"]), ("CLI, fit run logged to MLflow", [])):
            env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow-{len(extra)}.db"}

            def run(extra=extra, env=env):
                out = subprocess.run([sys.executable, "-m", "diffsweep", "fit", "--csv", str(csv), "--boot",
                                      str(args.boot), "--at", "11B", "--out", f"{tmp}/fit", "--json", *extra],
                                     capture_output=True, text=True, env=env, cwd=tmp)
                assert out.returncode == 0, out.stderr
            t_cli, _ = timed(run, args.repeat)
            print(f"  {label + ':':31s} {t_cli:6.2f} s  (fresh process, report + plots + frozen table)")


if __name__ == "__main__":
    main()
