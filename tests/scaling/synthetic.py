"""Synthetic ladders with known truth (the design of docs/references.md §4)."""

from __future__ import annotations

import numpy as np
import pandas as pd

SIZES = np.array([0.83, 1.4, 2.8, 6.8, 13.1]) * 1e9  # the paper's Table 9 ladder (non-embedding counts aside)
E, A, ALPHA = 2.30, 406.4, 0.34  # Chinchilla-like curve with the DIFF paper's loss level
TRUE_RATIO = 0.62  # DIFF at 62% of the Transformer's size: the paper's 6.8B-vs-11B reading


def baseline_loss(n: np.ndarray) -> np.ndarray:
    return E + A * np.asarray(n, float) ** -ALPHA


def ladder(noise_sd: float = 0.0, seeds: int = 1, rng: np.random.Generator | None = None,
           ratios: dict[str, float] | None = None, sizes: np.ndarray = SIZES) -> pd.DataFrame:
    """Transformer + candidates at N/ratio of its curve; multiplicative noise (sd of log loss)."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for arch, ratio in {"transformer": 1.0, **(ratios or {"diff_v1": TRUE_RATIO})}.items():
        for n in sizes:
            for seed in range(seeds):
                loss = baseline_loss(n / ratio) * np.exp(noise_sd * rng.standard_normal())
                rows.append({"arch": arch, "num_params": n, "tokens": 1e10, "loss": loss, "seed": seed,
                             "run_name": f"{arch}-{n:.3g}-s{seed}"})
    from diffsweep.scaling.table import _complete

    return _complete(pd.DataFrame(rows))


SCAN_TOKENS = np.arange(1, 10) * 40e9  # a Fig. 3b-like scan: one run evaluated at 40B, 80B, ..., 360B tokens
TRUE_TOKEN_RATIO = 0.637  # the paper's 160B-vs-251B reading


def token_scan(runs: int = 2, run_sd: float = 0.005, eval_sd: float = 0.001, rng: np.random.Generator | None = None,
               run_ids: bool = True) -> pd.DataFrame:
    """One 3B model per run evaluated at SCAN_TOKENS; each run has an offset (sd ``run_sd`` of log
    loss) shared by its evaluations plus noise per evaluation; L(D) = 2.0 + 410.7·D^-0.28 and the
    candidate at D/0.637 (so ρ_D = 0.637 everywhere)."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for arch, ratio in (("transformer", 1.0), ("diff_v1", TRUE_TOKEN_RATIO)):
        for seed in range(runs):
            offset = run_sd * rng.standard_normal()
            for k, d in enumerate(SCAN_TOKENS):
                loss = (2.0 + 410.7 * (d / ratio) ** -0.28) * np.exp(offset + eval_sd * rng.standard_normal())
                rows.append({"arch": arch, "num_params": 3e9, "tokens": d, "loss": loss, "seed": seed,
                             "run_id": f"{arch}-s{seed}" if run_ids else "", "step": (k + 1) * 10_000,
                             "warmup_steps": 1000, "point": "final" if k == len(SCAN_TOKENS) - 1 else "checkpoint"})
    from diffsweep.scaling.table import _complete

    return _complete(pd.DataFrame(rows))
