"""Synthetic ladders with known truth (the design of docs/references.md §4)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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
               run_ids: bool = True, branches: bool = False) -> pd.DataFrame:
    """One 3B model per run evaluated at SCAN_TOKENS; each run has an offset (sd ``run_sd`` of log
    loss) shared by its evaluations plus noise per evaluation; L(D) = 2.0 + 410.7·D^-0.28 and the
    candidate at D/0.637 (so ρ_D = 0.637 everywhere). ``branches``: the points before the last are
    cooldown branches of the run (final evaluations of runs of their own, ``parent`` the run's key),
    each sharing the run's offset, with ``eval_sd`` its own cooldown's noise."""
    rng = rng or np.random.default_rng(0)
    rows = []
    for arch, ratio in (("transformer", 1.0), ("diff_v1", TRUE_TOKEN_RATIO)):
        for seed in range(runs):
            offset = run_sd * rng.standard_normal()
            for k, d in enumerate(SCAN_TOKENS):
                loss = (2.0 + 410.7 * (d / ratio) ** -0.28) * np.exp(offset + eval_sd * rng.standard_normal())
                last = k == len(SCAN_TOKENS) - 1
                row = {"arch": arch, "num_params": 3e9, "tokens": d, "loss": loss, "seed": seed,
                       "run_id": f"{arch}-s{seed}" if run_ids else "", "step": (k + 1) * 10_000,
                       "warmup_steps": 1000, "point": "final" if last else "checkpoint"}
                if branches:  # every point a run's final evaluation; the branches name their parent
                    row |= {"run_id": f"{arch}-s{seed}-{k}", "run_key": f"{arch}-s{seed}" + ("" if last else f"-{k}"),
                            "parent": "" if last else f"{arch}-s{seed}", "point": "final"}
                rows.append(row)
    from diffsweep.scaling.table import _complete

    return _complete(pd.DataFrame(rows))


def log_runs(uri: str, sweep: Path, loss: Callable[[str, float, float], float],
             offset: Callable[[Any], float] = lambda run: 0.0, experiment: str | None = None) -> None:
    """Log a finished MLflow run for every run of ``sweep``, as ``diffsweep train`` would: the same
    tags, the flattened config as params, val/loss and train/tokens at each evaluation (val/loss
    shifted by ``offset(planned run)``: a seed's luck), in the sweep's experiment or ``experiment``.
    ``loss(arch, num_params, tokens)`` is the curve."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from diffsweep.config.identity import flatten
    from diffsweep.config.loading import to_dict
    from diffsweep.model import counting
    from diffsweep.sweep import expand, load_sweep
    from diffsweep.tracking.store import ensure_experiment
    from diffsweep.tracking.tags import BRANCH_PARENT_KEY, BRANCH_STEP

    spec = load_sweep(sweep, ())
    client = MlflowClient(uri)
    exp_id = ensure_experiment(uri, experiment or spec.experiment)
    for run in expand(spec).runs:
        c = run.config
        tags = {"diffsweep.arch": c.model.attention.kind, "diffsweep.size": c.model.size or "custom",
                "diffsweep.params": str(run.num_params),
                "diffsweep.non_embedding_params": str(run.num_non_embedding_params),
                "diffsweep.flops_per_token": str(counting.train_flops_per_token(c.model, c.train.seq_len)),
                "diffsweep.run_key": run.key, "diffsweep.sweep": spec.name}
        if run.branch is not None:  # a cooldown branch's tags, as the trainer sets them
            tags |= {BRANCH_PARENT_KEY: run.branch.parent_key, BRANCH_STEP: str(run.branch.step)}
        mlflow_run = client.create_run(exp_id, run_name=run.name, tags=tags)
        params = [Param(k, str(v)) for k, v in flatten(to_dict(c)).items()]
        steps = c.train.max_steps or -(-run.tokens // c.train.batch_tokens)
        first = run.branch.step if run.branch is not None else 0  # a branch evaluates its cooldown only
        evals = [s for s in range(c.train.eval_every, steps + 1, c.train.eval_every) if s > first] or [steps]
        evals = sorted(set(evals) | {steps})
        metrics = []
        for step in evals:
            tokens = step * c.train.batch_tokens
            metrics += [Metric("val/loss", loss(c.model.attention.kind, run.num_params, tokens) + offset(run), 0,
                               step),
                        Metric("train/tokens", float(tokens), 0, step)]
        for i in range(0, len(params), 100):
            client.log_batch(mlflow_run.info.run_id, params=params[i:i + 100])
        for i in range(0, len(metrics), 500):
            client.log_batch(mlflow_run.info.run_id, metrics=metrics[i:i + 500])
        client.set_terminated(mlflow_run.info.run_id, "FINISHED")
