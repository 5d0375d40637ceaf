"""A sweep's probe evaluations side by side: the paper's tables across arms, judged against seed noise.

``diffsweep eval SWEEP --probe ...`` logs one MLflow run per (training run, probe, checkpoint),
with the probe's tables as ``<table>.json`` artifacts. Here those tables are put together across
the sweep's arms (its rows without the seed, as ``compare`` groups them: ``sweep_rows``):

- which evaluation: per training run and probe, the newest evaluated step (or ``step``), and of
  evaluations of that step the one that ended last (an evaluation run again with ``--force``);
- how a probe's table is laid out is the probe's own ``comparisons`` (``TableComparison`` in
  ``diffsweep.eval.probe``, passed in by the caller: this layer does not import the probes): the
  key columns make a cell, each value column is compared across arms cell by cell;
- per cell and value column, ``compare_rows`` gives each arm's mean over its seeds; an arm's
  mean gets ``± t(df) · s_pooled / √n`` (the seed sd pooled over the arms). With one seed per arm
  there is no CI.
- each arm's difference from the baseline arm is a **paired** t test where the two arms share at
  least two seeds (``train.seed``: the same data order and initialisation stream): the differences
  of the shared seeds' values, their mean (``delta``), ``± t(n−1) · sd / √n`` and the two-sided
  p-value of that t statistic; no equal-spread assumption, and a seed's luck common to both arms
  cancels. Otherwise (fewer than two shared seeds) it is ``compare_rows``' unpaired Student-t on
  the pooled seed sd, and the p-value of the same statistic (pooling assumes the arms' spread is
  equal: for outlier magnitudes, which differ by an order of magnitude between kinds, read those
  with care). ``Difference.pairs`` says which: the number of seed pairs, 0 for unpaired. The
  coverage of both CIs is checked by Monte Carlo in tests/eval/test_probe_tables.py (and the
  unpaired one's in tests/sweep/test_compare.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from diffsweep.config import ConfigError
from diffsweep.fsutil import parents_made_for
from diffsweep.store import COMPARISON_KIND, EVAL_KIND, all_runs, ensure_experiment, retry_busy, source_tags
from diffsweep.sweep.compare import BEYOND, WITHIN, compare_rows, sweep_rows
from diffsweep.sweep.expand import SweepRun
from diffsweep.sweep.spec import SweepSpec

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


# -- a sweep's evaluations, read from the MLflow store, and the outputs --------------------------------


@dataclass
class ProbeComparison:
    """Every probe's tables for one sweep, with where they were written and logged."""

    sweep: str
    experiment: str
    baseline: str
    level: float
    step: int | None
    arms: tuple[str, ...]
    tables: list[ProbeTable]
    notes: list[str]
    folder: Path | None = None
    files: list[Path] = field(default_factory=list)
    mlflow_run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "experiment": self.experiment, "baseline": self.baseline, "level": self.level,
                "step": self.step, "arms": list(self.arms), "notes": self.notes,
                "tables": [_table_dict(t) for t in self.tables],
                "folder": str(self.folder) if self.folder else None, "files": [str(f) for f in self.files],
                "mlflow_run_id": self.mlflow_run_id}


def _table_dict(t: ProbeTable) -> dict[str, Any]:
    return {"probe": t.probe, "table": t.spec.table, "title": t.spec.title, "keys": list(t.spec.keys),
            "steps": t.steps, "settings": [json.loads(s) for s in t.settings],
            "cells": [{"key": dict(zip(t.spec.keys, c.key, strict=True)), "value": c.value, "pooled_sd": c.pooled_sd,
                       "df": c.df,
                       "arms": [{"arm": a.arm, "n": a.n, "mean": a.mean, "ci_half": a.half, "values": list(a.values),
                                 "runs": list(a.runs)} for a in c.arms],
                       "differences": [{"arm": d.arm, "delta": d.delta, "lo": d.lo, "hi": d.hi, "p": d.p,
                                        "verdict": d.verdict, "paired_seeds": d.pairs} for d in c.differences]}
                      for c in t.cells]}


def compare_probes(uri: str, spec: SweepSpec, runs: Sequence[SweepRun],
                   comparisons: Callable[[str], Sequence[TableSpec]], *, baseline: str | None = None,
                   step: int | None = None, level: float = 0.95, out: Path | None = None,
                   log: bool = True) -> ProbeComparison:
    """Read the sweep's FINISHED evaluation runs (``diffsweep.eval.sweep`` = the sweep, of a run
    key of ``runs``) from ``spec``'s experiment, build each probe's tables (``comparisons(probe)``),
    write ``probes.md``, ``probes.json`` and a PNG per table into ``out`` (default
    ``compare/<sweep>-probes``) and log them as an MLflow run of kind ``comparison``. Raises
    ``ConfigError`` when the sweep has no evaluation (at ``step``) or ``baseline`` is no arm."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per table read, on stderr
    rows = sweep_rows(runs)
    arm_of = {run.key: row.label for row in rows for run in row.runs}
    arms = [row.label for row in rows]
    if baseline is not None and baseline not in arms:
        raise ConfigError("baseline", f"expected an arm of {spec.name}: one of [{', '.join(arms)}], got {baseline!r}")
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(spec.experiment)
    found = [] if exp is None else all_runs(client, exp.experiment_id, f"tags.`diffsweep.kind` = '{EVAL_KIND}' and "
                                            f"tags.`diffsweep.eval.sweep` = '{spec.name}' and "
                                            "attributes.status = 'FINISHED'")
    seed_of = {run.key: run.config.train.seed for run in runs}
    records = [replace(_record(r), seed=seed_of[r.data.tags["diffsweep.eval.run_key"]]) for r in found
               if r.data.tags.get("diffsweep.eval.run_key") in arm_of]
    first = f"run `diffsweep eval {spec.path} --probe PROBE` first"
    if not records:
        raise ConfigError(str(spec.path), f"no evaluation run of sweep '{spec.name}' in experiment "
                          f"'{spec.experiment}' of {uri}; {first}")
    chosen = choose(records, step)
    if not chosen:
        have = sorted({r.step for r in records})
        raise ConfigError("step", f"no evaluation of sweep '{spec.name}' at step {step}; evaluated steps: {have}")
    present_all = [a for a in arms if any(arm_of[r.run_key] == a for r in chosen)]
    base = baseline or present_all[0]  # default: the sweep's first arm that was evaluated
    notes: list[str] = []
    tables = []
    with tempfile.TemporaryDirectory(prefix="diffsweep-probes-") as tmp:
        for probe in dict.fromkeys(r.probe for r in sorted(chosen, key=lambda r: r.probe)):
            specs = comparisons(probe)
            mine = [r for r in chosen if r.probe == probe]
            if not specs:
                notes.append(f"{probe}: no comparison table defined for this probe; left out")
                continue
            loaded = [(arm_of[r.run_key], _with_tables(client, r, [s.table for s in specs], Path(tmp))) for r in mine]
            if not any(arm == base for arm, _ in loaded):
                notes.append(f"{probe}: the baseline {base} has no evaluation; differences left out")
            for s in specs:
                if not any(s.table in record.tables for _, record in loaded):
                    continue  # a table the probe makes only with some settings (quantization's tasks)
                table = build_table(probe, s, loaded, arms, base, level)
                if len(table.settings) > 1:
                    notes.append(f"{probe}: evaluated with {len(table.settings)} different settings; cells of one "
                                 "key may mix them (evaluate all runs with the same --probe-set)")
                if table.cells:
                    tables.append(table)
                else:
                    notes.append(f"{probe}: table {s.table} has no rows to compare")
    result = ProbeComparison(sweep=spec.name, experiment=spec.experiment, baseline=base, level=level,
                             step=step, arms=tuple(arms), tables=tables, notes=notes)
    _write_outputs(result, out or Path("compare") / f"{spec.name}-probes", uri if log else None)
    return result


def _record(run: Any) -> EvalRecord:
    tags = run.data.tags
    return EvalRecord(run_id=run.info.run_id, probe=tags.get("diffsweep.eval.probe", "?"),
                      step=int(tags.get("diffsweep.eval.step", "0")), run_key=tags["diffsweep.eval.run_key"],
                      run_name=tags.get("diffsweep.eval.sweep_run") or tags.get("diffsweep.eval.run_name", "?"),
                      settings=tags.get("diffsweep.eval.settings", "{}"), end_time=run.info.end_time or 0)


def _with_tables(client: Any, record: EvalRecord, names: Sequence[str], tmp: Path) -> EvalRecord:
    """``record`` with those of the tables ``names`` that its run has as artifacts."""
    tables = {}
    have = {f.path for f in retry_busy(lambda: client.list_artifacts(record.run_id))}
    for name in dict.fromkeys(n for n in names if f"{n}.json" in have):
        dst = tmp / record.run_id
        dst.mkdir(exist_ok=True)
        try:
            path = retry_busy(lambda: client.download_artifacts(record.run_id, f"{name}.json", str(dst)))  # noqa: B023
        except Exception as exc:  # an artifact store that lost the file: say which run, rather than guess
            raise ConfigError(f"run {record.run_id}", f"cannot read its {name}.json artifact ({exc})") from exc
        tables[name] = json.loads(Path(path).read_text())
    return replace(record, tables=tables)


def _write_outputs(result: ProbeComparison, folder: Path, uri: str | None) -> None:
    """``probes.md``, ``probes.json`` and the plots into ``folder`` (replaced as a whole), and the
    comparison run when ``uri`` is given."""
    from diffsweep.sweep.probe_report import markdown, plot

    if folder.exists() and not folder.is_dir():
        raise ConfigError("out", f"{folder} exists and is not a directory")
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    try:
        with parents_made_for(folder):
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                names = []
                for t in result.tables:
                    name = f"{t.probe}-{t.spec.table}.png" if t.probe != t.spec.table else f"{t.probe}.png"
                    plot(t, result, tmp / name)
                    names.append(name)
                result.folder = folder
                result.files = [folder / "probes.md", folder / "probes.json", *(folder / n for n in names)]
                (tmp / "probes.md").write_text(markdown(result, names))
                if uri is not None:
                    result.mlflow_run_id = _log(uri, result, tmp)
                (tmp / "probes.json").write_text(json.dumps(result.to_dict(), indent=1) + "\n")
                if folder.exists():
                    shutil.rmtree(folder)
                os.replace(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise ConfigError("out", f"cannot write {folder} ({exc.strerror or exc})") from None


def _log(uri: str, result: ProbeComparison, tmp: Path) -> str:
    """The comparison as its own MLflow run in the sweep's experiment (``diffsweep.kind`` =
    ``comparison``: never an input to a fit), with the outputs as artifacts."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp_id = ensure_experiment(uri, result.experiment)
    sources = sorted({r for t in result.tables for c in t.cells for a in c.arms for r in a.runs})
    tags = source_tags() | {
        "diffsweep.kind": COMPARISON_KIND,
        "diffsweep.comparison.sweep": result.sweep,
        "diffsweep.comparison.of": "probes",
        "diffsweep.comparison.probes": ",".join(dict.fromkeys(t.probe for t in result.tables)),
        "diffsweep.comparison.baseline": result.baseline,
        "diffsweep.comparison.step": "newest" if result.step is None else str(result.step),
        "diffsweep.comparison.runs": ",".join(sources)[:5000],
    }
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    run = retry_busy(lambda: client.create_run(exp_id, run_name=f"compare probes {result.sweep} {stamp}", tags=tags))
    run_id = run.info.run_id
    try:
        (tmp / "probes.json").write_text(json.dumps(result.to_dict() | {"mlflow_run_id": run_id}, indent=1) + "\n")
        retry_busy(lambda: client.log_artifacts(run_id, str(tmp)))
    except BaseException:
        retry_busy(lambda: client.set_terminated(run_id, status="FAILED"))
        raise
    retry_busy(lambda: client.set_terminated(run_id, status="FINISHED"))
    return run_id
