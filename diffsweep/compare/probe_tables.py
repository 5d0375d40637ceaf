"""A sweep's probe evaluations side by side: the paper's tables across arms, judged against seed noise.

``diffsweep eval SWEEP --probe ...`` logs one MLflow run per (training run, probe, checkpoint), with
the probe's tables as ``<table>.json`` artifacts; here those tables are put together across the
sweep's arms (its rows without the seed: ``sweep_rows``). Which arms share a table: ``arm_groups``;
which evaluation of a run: ``choose``; a table's layout: the probe's own ``comparisons``
(``TableComparison``, passed in by the caller: this layer does not import the probes). Per cell,
each arm's mean ± CI over its seeds (``compare_rows``) and its difference from the baseline arm: a
paired t test over their shared seeds (``paired_difference``), else ``compare_rows``' unpaired one,
each with a two-sided p-value (``Difference.pairs``: the seed pairs, 0 for unpaired).
See docs/sweeps.md, 'The probes across arms: `diffsweep compare SWEEP --probes`'.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from diffsweep.compare.runs import BEYOND, WITHIN, compare_rows
from diffsweep.config import Config

MEAN = "mean"  # the key value of a cell averaged over ``mean_over``


class TableSpec(Protocol):
    """What this module reads of a probe's ``TableComparison`` (``diffsweep.eval.probe``)."""

    @property
    def table(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def keys(self) -> tuple[str, ...]: ...
    @property
    def values(self) -> tuple[str, ...]: ...
    @property
    def where(self) -> tuple[tuple[str, Any], ...]: ...
    @property
    def mean_over(self) -> str | None: ...
    @property
    def x(self) -> str | None: ...
    @property
    def log_x(self) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class EvalRecord:
    """One evaluation run: which training run (``run_key``, ``run_name``), probe and step, and its
    tables (name -> rows), read when the record is chosen."""

    run_id: str
    probe: str
    step: int
    run_key: str
    run_name: str
    settings: str  # JSON
    end_time: int
    seed: int | None = None  # the training run's train.seed (pairs runs across arms); None: unknown
    tables: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ArmStat:
    arm: str
    n: int
    mean: float
    half: float | None  # half-width of the mean's CI; None with one seed per arm
    values: tuple[float, ...]
    runs: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Difference:
    arm: str
    delta: float  # mean(arm) - mean(baseline)
    lo: float | None
    hi: float | None
    p: float | None  # two-sided p-value of the same t statistic
    verdict: str
    pairs: int = 0  # seed pairs of a paired difference; 0: unpaired (pooled seed sd)


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One value column of one cell across arms."""

    key: tuple[Any, ...]
    value: str
    arms: tuple[ArmStat, ...]
    differences: tuple[Difference, ...]  # arm vs the baseline (empty when the baseline has no value here)
    pooled_sd: float | None
    df: int


@dataclass(frozen=True, kw_only=True)
class ProbeTable:
    probe: str
    spec: TableSpec
    cells: tuple[Cell, ...]
    steps: dict[str, int]  # evaluation step per training run
    settings: tuple[str, ...]  # the distinct settings (JSON) of the evaluations used
    size: str | None = None  # the model size whose arms these are (None: every arm in one table)
    baseline: str | None = None  # the arm the differences are against


@dataclass(frozen=True, kw_only=True)
class ArmGroup:
    """Arms compared in one table: ``arms`` (sweep order) against ``baseline``."""

    size: str | None  # the model size they share; None: one table of every arm
    arms: tuple[str, ...]
    baseline: str


def size_label(config: Config) -> str:
    """How a run's model size is named in the tables: its preset, else its shape."""
    m = config.model
    return m.size or f"d_model={m.d_model}, n_layers={m.n_layers}"


def arm_groups(arms: Sequence[str], kinds: Mapping[str, str], sizes: Mapping[str, str], evaluated: Sequence[str],
               baseline: str | None = None) -> tuple[list[ArmGroup], list[str]]:
    """Which arms are compared with which (pure). ``arms`` in sweep order, each arm's attention
    kind and model size, the arms that have an evaluation (at least one). With ``baseline`` given
    or the arms all of one size: one group of every arm against ``baseline`` (default: the first
    evaluated arm). Otherwise one group per size with an evaluated arm (in sweep order), against
    that size's first arm of the baseline kind, the kind of the sweep's first arm (evaluated or
    not, so that one failed evaluation does not change the other sizes' baselines); a size without
    an arm of that kind is compared with its own first evaluated arm, and a note says so."""
    first = next(a for a in arms if a in evaluated)
    if baseline is not None or len({sizes[a] for a in arms}) <= 1:
        return [ArmGroup(size=None, arms=tuple(arms), baseline=baseline or first)], []
    kind = kinds[arms[0]]
    groups, notes = [], []
    for size in dict.fromkeys(sizes[a] for a in arms):
        members = [a for a in arms if sizes[a] == size]
        if not any(a in evaluated for a in members):
            continue
        of_kind = [a for a in members if kinds[a] == kind]
        if of_kind:
            base = of_kind[0]
        else:
            base = next(a for a in members if a in evaluated)
            notes.append(f"size {size} has no {kind} arm; its arms are compared with {base}")
        groups.append(ArmGroup(size=size, arms=tuple(members), baseline=base))
    return groups, notes


def build_table(probe: str, spec: TableSpec, records: Sequence[tuple[str, EvalRecord]], arms: Sequence[str],
                baseline: str, level: float = 0.95) -> ProbeTable:
    """The comparison of ``spec``'s table over ``records`` (``(arm, record)`` pairs, one record per
    training run), arms in the order ``arms``. Pure (see the module docstring)."""
    from scipy import stats

    per: dict[tuple[Any, ...], dict[str, dict[str, list[tuple[float, str, int | None]]]]] = {}
    for arm, record in records:
        rows = [r for r in record.tables.get(spec.table, ()) if all(r.get(k) == v for k, v in spec.where)]
        cells = [(tuple(r.get(k) for k in spec.keys), r) for r in rows]
        if spec.mean_over is not None and spec.mean_over in spec.keys:
            at = spec.keys.index(spec.mean_over)
            groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
            for key, r in cells:
                groups.setdefault((*key[:at], MEAN, *key[at + 1:]), []).append(r)
            for key, members in groups.items():
                mean_row = {}
                for v in spec.values:
                    got = [_number(m.get(v)) for m in members]
                    if got and all(g is not None for g in got):
                        mean_row[v] = sum(g for g in got if g is not None) / len(got)
                cells.append((key, mean_row))
        for key, r in cells:
            for v in spec.values:
                number = _number(r.get(v))
                if number is not None:
                    per.setdefault(key, {}).setdefault(v, {}).setdefault(arm, []).append(
                        (number, record.run_name, record.seed))
    out = []
    for key, by_value in per.items():
        for v in spec.values:
            by_arm = by_value.get(v)
            if not by_arm:
                continue
            present = [a for a in arms if a in by_arm]
            base = baseline if baseline in by_arm else present[0]
            comparison = compare_rows({a: [x for x, _, _ in by_arm[a]] for a in present}, base, level, unit=v)
            pooled, df = comparison.pooled_sd, comparison.df
            t = float(stats.t.ppf(0.5 + level / 2, df)) if pooled is not None else math.nan
            stats_ = tuple(ArmStat(arm=d.row, n=d.n, mean=d.mean,
                                   half=t * pooled / math.sqrt(d.n) if pooled is not None else None,
                                   values=tuple(x for x, _, _ in by_arm[d.row]),
                                   runs=tuple(name for _, name, _ in by_arm[d.row])) for d in comparison.rows)
            differences = []
            if baseline in by_arm:
                n_base = len(by_arm[baseline])
                for d in comparison.rows:
                    if d.row == baseline:
                        continue
                    paired = paired_difference(by_arm[d.row], by_arm[baseline], level)
                    if paired is not None:
                        differences.append(replace(paired, arm=d.row))
                        continue
                    p = None
                    if pooled is not None:
                        se = pooled * math.sqrt(1 / d.n + 1 / n_base)
                        p = float(2 * stats.t.sf(abs(d.delta) / se, df)) if se > 0 else (1.0 if d.delta == 0 else 0.0)
                    differences.append(Difference(arm=d.row, delta=d.delta, lo=d.lo, hi=d.hi, p=p, verdict=d.verdict))
            out.append(Cell(key=key, value=v, arms=stats_, differences=tuple(differences), pooled_sd=pooled, df=df))
    steps = {record.run_name: record.step for _, record in records}
    settings = tuple(sorted({record.settings for _, record in records}))
    return ProbeTable(probe=probe, spec=spec, cells=tuple(out), steps=steps, settings=settings)


def paired_difference(arm: Sequence[tuple[float, str, int | None]], base: Sequence[tuple[float, str, int | None]],
                      level: float) -> Difference | None:
    """The paired t difference ``arm − base`` over their shared seeds ((value, run, seed) each);
    None with fewer than two shared seeds (a seed given twice in an arm is not paired)."""
    from scipy import stats

    def by_seed(values: Sequence[tuple[float, str, int | None]]) -> dict[int, float]:
        seeds = [seed for _, _, seed in values]
        return {seed: x for x, _, seed in values if seed is not None and seeds.count(seed) == 1}

    mine, theirs = by_seed(arm), by_seed(base)
    shared = sorted(mine.keys() & theirs.keys())
    n = len(shared)
    if n < 2:
        return None
    d = [mine[s] - theirs[s] for s in shared]
    delta = sum(d) / n
    sd = math.sqrt(sum((x - delta) ** 2 for x in d) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    if sd > 0:
        p = float(2 * stats.t.sf(abs(delta) / (sd / math.sqrt(n)), n - 1))
    else:  # every pair differs by the same amount
        p = 1.0 if delta == 0 else 0.0
    lo, hi = delta - half, delta + half
    return Difference(arm="", delta=delta, lo=lo, hi=hi, p=p, verdict=WITHIN if lo <= 0 <= hi else BEYOND, pairs=n)


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def choose(records: Sequence[EvalRecord], step: int | None = None) -> list[EvalRecord]:
    """Per (training run, probe): the evaluation at ``step`` (None: the newest evaluated step),
    the one that ended last when it was evaluated more than once."""
    best: dict[tuple[str, str], EvalRecord] = {}
    for r in records:
        if step is not None and r.step != step:
            continue
        old = best.get((r.run_key, r.probe))
        if old is None or (r.step, r.end_time) > (old.step, old.end_time):
            best[(r.run_key, r.probe)] = r
    return list(best.values())


# -- the whole comparison (read from the store by ``probes``, written by ``probe_output``) ---------------


@dataclass
class ProbeComparison:
    """Every probe's tables for one sweep, with where they were written and logged. ``groups``:
    which arms each table compares (none given: every arm against ``baseline``); ``kinds`` and
    ``sizes``: each arm's attention kind and model size (plot colours and markers)."""

    sweep: str
    experiment: str
    baseline: str | None  # the one baseline; None when each size has its own (see ``groups``)
    level: float
    step: int | None
    arms: tuple[str, ...]
    tables: list[ProbeTable]
    notes: list[str]
    groups: tuple[ArmGroup, ...] = ()
    kinds: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, str] = field(default_factory=dict)
    folder: Path | None = None
    files: list[Path] = field(default_factory=list)
    mlflow_run_id: str | None = None

    @property
    def arm_groups(self) -> tuple[ArmGroup, ...]:
        """``groups``, or one group of every arm against ``baseline``."""
        return self.groups or (ArmGroup(size=None, arms=self.arms, baseline=self.baseline or self.arms[0]),)

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "experiment": self.experiment, "baseline": self.baseline, "level": self.level,
                "step": self.step, "arms": list(self.arms), "notes": self.notes,
                "groups": [{"size": g.size, "arms": list(g.arms), "baseline": g.baseline} for g in self.arm_groups],
                "tables": [_table_dict(t) for t in self.tables],
                "folder": str(self.folder) if self.folder else None, "files": [str(f) for f in self.files],
                "mlflow_run_id": self.mlflow_run_id}


def _table_dict(t: ProbeTable) -> dict[str, Any]:
    return {"probe": t.probe, "table": t.spec.table, "title": t.spec.title, "size": t.size, "baseline": t.baseline,
            "keys": list(t.spec.keys),
            "steps": t.steps, "settings": [json.loads(s) for s in t.settings],
            "cells": [{"key": dict(zip(t.spec.keys, c.key, strict=True)), "value": c.value, "pooled_sd": c.pooled_sd,
                       "df": c.df,
                       "arms": [{"arm": a.arm, "n": a.n, "mean": a.mean, "ci_half": a.half, "values": list(a.values),
                                 "runs": list(a.runs)} for a in c.arms],
                       "differences": [{"arm": d.arm, "delta": d.delta, "lo": d.lo, "hi": d.hi, "p": d.p,
                                        "verdict": d.verdict, "paired_seeds": d.pairs} for d in c.differences]}
                      for c in t.cells]}
