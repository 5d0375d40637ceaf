"""Monte Carlo coverage of `diffsweep fit`'s ratio CIs on synthetic data with a known truth.

Designs (noise in log loss, i.e. multiplicative on the loss):
  ladder-1seed  Table 9 sizes 0.83-13.1B x 1 seed, noise sd 0.005, truth rho_N = 0.62 everywhere
                (noise estimated from residuals; and, for comparison, with the known sd given)
  ladder-3seeds the same with 3 seeds per size (noise from seeds)
  tokens-Rruns  a Fig. 3b-like token scan: one 3B model per run evaluated at 40B, 80B, ..., 360B
                tokens (9 evaluations), R runs (seeds) per architecture; each run has an offset of
                sd 0.005 shared by its evaluations plus sd 0.001 per evaluation; L(D) =
                2.0 + 410.7 D^-0.28 and the candidate at D/0.637, so truth rho_D = 0.637 everywhere.
                Read at 251B (--at), as the paper does.
  branches-Rruns the same scan read from cooldown branches (#34): every D the final evaluation of a
                run of its own, the eight shorter ones branches of the 360B run (``parent``), each
                sharing its offset (sd 0.005) with its own cooldown's noise (sd 0.002).
                "-naive": the same points without ``parent`` (every branch read as a run of its own).
For each design: coverage of the 95% CI of each reference and the median CI width.
Usage (the library on PYTHONPATH decides which code is measured):

    python analysis/benchmarks/coverage_fit.py [--designs ladder-1seed,...] [--experiments 200] [--boot 250]
"""

from __future__ import annotations

import argparse
import inspect
import time

import numpy as np
import pandas as pd

from diffsweep.scaling.analysis import FitRequest, analyse
from diffsweep.scaling.table import _complete

SIZES = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9
TOKENS = np.arange(1, 10) * 40e9
RHO_N, RHO_D = 0.62, 0.637


def ladder(rng: np.random.Generator, seeds: int, sd: float = 0.005) -> pd.DataFrame:
    rows = []
    for arch, rho in (("transformer", 1.0), ("diff_v1", RHO_N)):
        for n in SIZES:
            for seed in range(seeds):
                loss = (2.30 + 406.4 * (n / rho) ** -0.34) * np.exp(sd * rng.standard_normal())
                rows.append({"arch": arch, "num_params": n, "tokens": 1e10, "loss": loss, "seed": seed})
    return _complete(pd.DataFrame(rows))


def token_scan(rng: np.random.Generator, runs: int, run_sd: float = 0.005, eval_sd: float = 0.001,
               branches: bool = False) -> pd.DataFrame:
    rows = []
    for arch, rho in (("transformer", 1.0), ("diff_v1", RHO_D)):
        for seed in range(runs):
            offset = run_sd * rng.standard_normal()
            for k, d in enumerate(TOKENS):
                loss = (2.0 + 410.7 * (d / rho) ** -0.28) * np.exp(offset + eval_sd * rng.standard_normal())
                last = k == len(TOKENS) - 1
                row = {"arch": arch, "num_params": 3e9, "tokens": d, "loss": loss, "seed": seed,
                       "run_id": f"{arch}-s{seed}", "step": (k + 1) * 10_000, "warmup_steps": 1000,
                       "point": "final" if last else "checkpoint"}
                if branches:
                    row |= {"run_id": f"{arch}-s{seed}-{k}", "run_key": f"{arch}-s{seed}" + ("" if last else f"-{k}"),
                            "parent": "" if last else f"{arch}-s{seed}", "point": "final"}
                rows.append(row)
    return _complete(pd.DataFrame(rows))


def design(name: str):
    """(points maker, extra request options, truth, reference labels)."""
    if name == "ladder-1seed":
        return (lambda rng: ladder(rng, 1)), {"at": (11e9,)}, RHO_N
    if name == "ladder-1seed-known-sd":
        return (lambda rng: ladder(rng, 1)), {"at": (11e9,), "noise_sd": 0.005}, RHO_N
    if name == "ladder-3seeds":
        return (lambda rng: ladder(rng, 3)), {"at": (11e9,)}, RHO_N
    if name.startswith("tokens-"):
        runs = int(name.split("-")[1].removesuffix("runs").removesuffix("run"))
        extra = {"at": (251e9,)}
        if name.endswith("-known-run-sd"):
            extra["run_sd"] = 0.005
        return (lambda rng: token_scan(rng, runs)), extra, RHO_D
    if name.startswith("branches-"):
        runs = int(name.split("-")[1].removesuffix("runs").removesuffix("run"))
        naive = name.endswith("-naive")
        return (lambda rng: token_scan(rng, runs, eval_sd=0.002, branches=True).assign(
            **({"parent": ""} if naive else {}))), {"at": (251e9,)}, RHO_D
    raise SystemExit(f"unknown design {name}")


def measure(name: str, experiments: int, boot: int, seed: int = 2026) -> dict:
    make, extra, truth = design(name)
    known = set(inspect.signature(FitRequest).parameters)
    if not set(extra) <= known:
        return {"design": name, "skipped": f"this code has no {sorted(set(extra) - known)}"}
    rng = np.random.default_rng(seed)
    covered, widths, labels, scope = None, [], [], set()
    start = time.perf_counter()
    for _ in range(experiments):
        r = analyse(make(rng), FitRequest(n_boot=boot, seed=int(rng.integers(1 << 30)), **extra)).to_dict()
        rows = r["ratios"]
        labels = [row["at_label"] for row in rows]
        hit = np.array([row["lo"] is not None and row["lo"] <= truth <= (np.inf if row["hi"] is None else row["hi"])
                        for row in rows], int)
        covered = hit if covered is None else covered + hit
        widths.append([(np.inf if row["hi"] is None else row["hi"]) - (row["lo"] or 0) for row in rows])
        scope.add(r["noise"].get("ci_scope", "-"))
    return {"design": name, "experiments": experiments, "boot": boot, "labels": labels,
            "coverage": (covered / experiments).round(3).tolist(),
            "median_width": np.median(np.array(widths), axis=0).round(3).tolist(),
            "ci_scope": sorted(scope), "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--designs", default="ladder-1seed,ladder-1seed-known-sd,ladder-3seeds,tokens-1run,"
                    "tokens-1run-known-run-sd,tokens-2runs,tokens-3runs,branches-2runs,branches-3runs,"
                    "branches-2runs-naive")
    ap.add_argument("--experiments", type=int, default=200)
    ap.add_argument("--boot", type=int, default=250)
    args = ap.parse_args()
    for name in args.designs.split(","):
        print(measure(name, args.experiments, args.boot), flush=True)


if __name__ == "__main__":
    main()
