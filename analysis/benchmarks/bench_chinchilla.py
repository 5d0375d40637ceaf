"""Chinchilla approach 3 on Epoch AI's 240 points: the fitted law and its bootstrap SEs, case
resampling (what `diffsweep fit` now uses for >= 30 points) against the Gaussian parametric
bootstrap around a MAD scale (what it used before), both against Epoch's published SEs.

Usage:

    python analysis/benchmarks/bench_chinchilla.py [--boot 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import numpy as np

from diffsweep.scaling.compute_optimal import allocation
from diffsweep.scaling.fitting import mle, resample
from diffsweep.scaling.fitting.bootstrap import Group, draw_targets, estimate_noise, scale_draws
from diffsweep.scaling.fitting.fit import fit_law
from diffsweep.scaling.fitting.forms import Law
from diffsweep.scaling.fitting.optimize import Data, Objective

CSV = Path(__file__).resolve().parents[2] / "tests" / "scaling" / "data" / "chinchilla_epoch_svg_extracted.csv"
EPOCH = {"A": 482.006, "B": 2085.434, "E": 1.81686, "alpha": 0.34781, "beta": 0.36585}
EPOCH_SE = {"A": 124.52, "B": 1293.28, "E": 0.0257, "alpha": 0.0154, "beta": 0.0206, "a": 0.020}


def points() -> Data:
    rows = list(csv.DictReader(CSV.open()))
    n = np.array([float(r["Model Size"]) for r in rows])
    c = np.array([float(r["Training FLOP"]) for r in rows])
    loss = np.array([float(r["loss"]) for r in rows])
    keep = np.argsort(loss, kind="stable")[:-5]
    return Data(u=np.log(n[keep]), v=np.log(c[keep] / (6 * n[keep])), y=np.log(loss[keep]))


def ses(law: Law, draws: np.ndarray) -> dict[str, float]:
    p = law.natural(draws)
    out = {k: float(np.std(v)) for k, v in p.items()}
    out["a"] = float(np.std(allocation(p, np.array([1e21]))["a"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--boot", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data, law = points(), Law("chinchilla")
    t = time.perf_counter()
    fit = mle.fit_huber_mle(law, data)
    print(f"Epoch's estimator (--objective huber_mle) in {time.perf_counter() - t:.1f} s:")
    got = {k: float(v[0]) for k, v in law.natural(fit.theta[None, :]).items()}
    print("  " + ", ".join(f"{k} {got[k]:.6g} (Epoch {EPOCH[k]:g}, rel {got[k] / EPOCH[k] - 1:+.1e})" for k in EPOCH)
          + f", log sigma {fit.log_sigma:.2f}")
    t = time.perf_counter()
    w = resample.weights(np.random.default_rng(args.seed), np.arange(len(data.y)), args.boot)
    case = ses(law, resample.refit(fit, w))
    t_case = time.perf_counter() - t
    # before: Gaussian noise with a MAD-based sd of the approach-3 fit's residuals, scaled by nu/chi2
    plain = fit_law(law, data, Objective.HUBER)
    noise = estimate_noise([Group(data.y, plain.fitted, np.arange(len(data.y)), law.num_params, robust=True)])
    rng = np.random.default_rng(args.seed)
    sd, between = scale_draws(rng, noise, args.boot)
    z = draw_targets(rng, np.zeros(len(data.y)), np.arange(len(data.y)), sd, between)
    param = ses(law, plain.refit(plain.fitted[None, :] + z))
    print(f"\n{args.boot} draws (case resampling refits in {t_case:.1f} s)")
    print(f"{'':6} {'Epoch SE':>10} {'case':>10} {'case/Epoch':>11} {'parametric':>11} {'param/Epoch':>12}")
    for k, se in EPOCH_SE.items():
        print(f"{k:6} {se:10.4g} {case[k]:10.4g} {case[k] / se:11.2f} {param[k]:11.4g} {param[k] / se:12.2f}")


if __name__ == "__main__":
    main()
