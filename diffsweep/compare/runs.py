"""Differences between a sweep's rows, judged against seed-to-seed noise.

Table 6's rows differ by 0.001-0.004 nats in the paper, which is about what two seeds of one row
differ by; a comparison that prints the differences without the noise invites a wrong reading.
Given each row's values over its seed replicates (e.g. the final ``val/loss`` of
``diff_v1-1.4B-hd_128-s0``, ``-s1``, ``-s2``), ``compare_rows`` gives every row's mean and seed sd,
and each row's difference from a baseline row with a confidence interval from the pooled seed sd
and a verdict in words (``WITHIN``, ``BEYOND``, ``UNKNOWN``); its docstring says how. Coverage of
these CIs is checked by a Monte Carlo test (tests/compare/test_runs.py).

See docs/sweeps.md, 'Compare a sweep's rows: `diffsweep compare`'.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diffsweep.config import ConfigError, ConfigWarning
from diffsweep.config.decode import confidence_level
from diffsweep.config.identity import identity_fields
from diffsweep.sweep.expand import SEED_KEY, SweepRun
from diffsweep.sweep.spec import SweepSpec
from diffsweep.tracking import tags as tag
from diffsweep.tracking.store import all_runs, mlflow_client
from diffsweep.tracking.tags import tag_is

if TYPE_CHECKING:
    from diffsweep.tracking.results import Run

WITHIN = "within seed noise"
BEYOND = "beyond seed noise"
UNKNOWN = "seed noise unknown"


@dataclass(frozen=True, kw_only=True)
class RowDifference:
    """One row against the baseline row."""

    row: str
    n: int  # seed replicates of this row
    mean: float
    sd: float | None  # this row's own seed sd (None with one seed)
    delta: float  # mean(row) - mean(baseline)
    lo: float | None  # CI of delta; None when the seed noise is unknown
    hi: float | None
    verdict: str  # WITHIN, BEYOND or UNKNOWN (the baseline row itself: WITHIN, delta 0)
    sentence: str


@dataclass(frozen=True, kw_only=True)
class RowComparison:
    """Every row against ``baseline``, with the pooled seed sd the verdicts rest on."""

    baseline: str
    level: float
    pooled_sd: float | None  # None: no row has two seeds
    df: int
    rows: tuple[RowDifference, ...]


def compare_rows(values: Mapping[str, Sequence[float]], baseline: str, level: float = 0.95,
                 unit: str = "nats") -> RowComparison:
    """Each row's mean over its seeds and its difference from ``baseline`` with a ``level`` CI
    from the pooled seed sd. ``values`` maps a row name to its values,
    one per seed. Raises ``ConfigError`` for an unknown baseline, an empty row, a non-finite value or a
    ``level`` outside [0.5, 1) (``confidence_level``).

    - the seed sd is pooled over all rows that have at least two seeds (df = sum of n_i - 1): every
      row is assumed to have the same seed-to-seed spread, which pools 14 df out of 7 rows x 3 seeds
      where one row alone would have 2;
    - the CI of ``mean(row) - mean(baseline)`` is Student's t: ``delta +- t(df) * s * sqrt(1/n_row +
      1/n_base)``. It treats the rows' seeds as independent (unpaired), which holds whether or not the
      same seed gives two rows the same data order; pairing could only narrow it;
    - "within seed noise" when the CI contains 0 (the sign of the difference is not established),
      "beyond seed noise" otherwise, and "seed noise unknown" when no row has two seeds: then no CI
      is given, since one run per row cannot separate a difference from a seed's luck.
    """
    from scipy import stats

    if baseline not in values:
        raise ConfigError("baseline", f"expected one of the rows [{', '.join(values)}], got {baseline!r}")
    confidence_level(level)
    for row, vals in values.items():
        if len(vals) == 0 or not all(math.isfinite(float(v)) for v in vals):
            raise ConfigError(f"row {row}", f"expected one finite value per seed, got {list(vals)!r}")
    means = {row: sum(map(float, vals)) / len(vals) for row, vals in values.items()}
    ss = {row: sum((float(v) - means[row]) ** 2 for v in vals) for row, vals in values.items()}
    df = sum(len(vals) - 1 for vals in values.values())
    pooled = math.sqrt(sum(ss.values()) / df) if df > 0 else None
    t = float(stats.t.ppf(0.5 + level / 2, df)) if df > 0 else math.nan
    n_base = len(values[baseline])
    out = []
    for row, vals in values.items():
        n = len(vals)
        own_sd = math.sqrt(ss[row] / (n - 1)) if n > 1 else None
        delta = means[row] - means[baseline]
        if row == baseline:
            out.append(RowDifference(row=row, n=n, mean=means[row], sd=own_sd, delta=0.0, lo=None, hi=None,
                                     verdict=WITHIN, sentence=f"{row}: the baseline ({_seeds(n)})."))
            continue
        if pooled is None:
            out.append(RowDifference(
                row=row, n=n, mean=means[row], sd=own_sd, delta=delta, lo=None, hi=None, verdict=UNKNOWN,
                sentence=(f"{row} - {baseline}: {delta:+.4f} {unit}; {UNKNOWN}: one seed per row, so this "
                          "difference cannot be told apart from seed-to-seed variation (run >= 2 seeds per row).")))
            continue
        half = t * pooled * math.sqrt(1 / n + 1 / n_base)
        lo, hi = delta - half, delta + half
        verdict = WITHIN if lo <= 0 <= hi else BEYOND
        why = ("the CI contains 0, so the sign of the difference is not established" if verdict == WITHIN
               else f"the CI excludes 0: {row} is {'higher' if delta > 0 else 'lower'}")
        out.append(RowDifference(
            row=row, n=n, mean=means[row], sd=own_sd, delta=delta, lo=lo, hi=hi, verdict=verdict,
            sentence=(f"{row} - {baseline}: {delta:+.4f} {unit} ({level:.0%} CI {lo:+.4f} to {hi:+.4f}; "
                      f"{_seeds(n)} vs {_seeds(n_base)}, pooled seed sd {pooled:.4f} on {df} df): {verdict}; {why}.")))
    return RowComparison(baseline=baseline, level=level, pooled_sd=pooled, df=df, rows=tuple(out))


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


# -- a launched sweep's rows, read from the MLflow store -----------------------------------------------

SEED_TOKEN = re.compile(r"-s\d+(?:-[0-9a-f]{6})?$")  # a run name's seed (and a disambiguating key prefix)


@dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One row of a sweep: its runs that differ only in ``train.seed``, in the sweep's order."""

    label: str  # the runs' name without the seed, e.g. diff_v1-1.4B-hd_128
    runs: tuple[SweepRun, ...]


def sweep_rows(runs: Sequence[SweepRun]) -> list[SweepRow]:
    """Group a sweep's runs into rows (every config field of a run's identity but ``train.seed``
    equal), in the order of each row's first run. Pure."""
    groups: dict[str, list[SweepRun]] = {}
    for run in runs:
        fields = {k: v for k, v in identity_fields(run.config).items() if k != SEED_KEY}
        key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]
        groups.setdefault(key, []).append(run)
    labels = {key: SEED_TOKEN.sub("", members[0].name) for key, members in groups.items()}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return [SweepRow(label=labels[key] if counts[labels[key]] == 1 else f"{labels[key]}-{key[:6]}",
                     runs=tuple(members)) for key, members in groups.items()]


@dataclass(frozen=True, kw_only=True)
class RowRuns:
    """A row's finished runs that logged the metric: run names, seeds and final values."""

    label: str
    planned: int  # runs of this row in the sweep
    names: tuple[str, ...]
    run_ids: tuple[str, ...]  # their MLflow runs
    seeds: tuple[int, ...]
    values: tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class SweepComparison:
    """``compare_rows`` on a launched sweep's finished runs."""

    sweep: str
    experiment: str
    metric: str
    rows: tuple[RowRuns, ...]  # rows with at least one finished run, in the sweep's order
    missing: tuple[str, ...]  # rows with none
    comparison: RowComparison

    @property
    def noise(self) -> str:
        """What the verdicts rest on, in one line."""
        c = self.comparison
        if c.pooled_sd is None:
            return (f"{UNKNOWN}: one seed per row, so no difference can be told apart from seed-to-seed variation "
                    "(give the sweep `seeds: [0, 1, 2]`)")
        pooled = sum(len(r.values) > 1 for r in self.rows)
        return (f"seed noise: pooled seed sd {c.pooled_sd:.4g} on {c.df} df (from the {pooled} row(s) with >= 2 "
                f"seeds); {c.level:.0%} CIs are Student's t on the difference of row means")

    def to_dict(self) -> dict:
        c = self.comparison
        by_row = {r.label: r for r in self.rows}
        return {"sweep": self.sweep, "experiment": self.experiment, "metric": self.metric,
                "baseline": c.baseline, "level": c.level, "pooled_sd": c.pooled_sd, "df": c.df, "noise": self.noise,
                "rows": [{"row": d.row, "n": d.n, "planned": by_row[d.row].planned,
                          "seeds": list(by_row[d.row].seeds), "runs": list(by_row[d.row].names),
                          "run_ids": list(by_row[d.row].run_ids),
                          "values": list(by_row[d.row].values), "mean": d.mean, "sd": d.sd, "delta": d.delta,
                          "lo": d.lo, "hi": d.hi, "verdict": d.verdict, "sentence": d.sentence} for d in c.rows],
                "missing": list(self.missing)}


def compare_sweep(uri: str, spec: SweepSpec, runs: Sequence[SweepRun], metric: str = "val/loss",
                  baseline: str | None = None, level: float = 0.95) -> SweepComparison:
    """The final value of ``metric`` in each finished run of ``runs`` (found in ``spec``'s
    experiment by run key; a key trained twice: its later run), grouped into rows, compared with
    ``compare_rows`` against ``baseline`` (default: the sweep's first row that has a finished run).
    Rows without a finished run are listed as ``missing``. Raises ``ConfigError`` when no run has
    finished, no finished run logged ``metric`` (naming the metrics they have) or ``baseline`` is
    no row or has no finished run."""
    rows = sweep_rows(runs)
    labels = [r.label for r in rows]
    if baseline is not None and baseline not in labels:
        raise ConfigError("baseline", f"expected a row of {spec.name}: one of [{', '.join(labels)}], got {baseline!r}")
    latest = finished_runs(uri, spec, runs, metric)
    read, missing = [], []
    for row in rows:
        names, ids, seeds, values = [], [], [], []
        for planned in row.runs:
            finished = latest.get(planned.key)
            if finished is None:
                continue
            value = final_value(finished, metric, planned.name)
            if value is None:
                continue
            names.append(planned.name)
            ids.append(finished.info.run_id)
            seeds.append(planned.config.train.seed)
            values.append(value)
        if values:
            read.append(RowRuns(label=row.label, planned=len(row.runs), names=tuple(names), run_ids=tuple(ids),
                                seeds=tuple(seeds),
                                values=tuple(values)))
        else:
            missing.append(row.label)
    if baseline is None:
        baseline = read[0].label
    elif baseline in missing:
        raise ConfigError("baseline", f"row {baseline} has no finished run with {metric}; rows that have: "
                          f"[{', '.join(r.label for r in read)}]")
    comparison = compare_rows({r.label: r.values for r in read}, baseline, level, unit=unit(metric))
    return SweepComparison(sweep=spec.name, experiment=spec.experiment, metric=metric, rows=tuple(read),
                           missing=tuple(missing), comparison=comparison)


def ended_runs(uri: str, spec: SweepSpec, runs: Sequence[SweepRun]) -> dict[str, Run]:
    """The ended MLflow run of each of ``runs`` (by run key; a key trained twice: its later run;
    FINISHED or, when none finished, its latest FAILED or KILLED) in ``spec``'s experiment."""
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(spec.experiment)
    found: list[Run] = [] if exp is None else all_runs(client, exp.experiment_id,
                                                       tag_is(tag.SWEEP, spec.name))
    keys = {run.key for run in runs}
    latest: dict[str, Run] = {}
    for run in sorted(found, key=lambda r: (r.info.status == "FINISHED", r.info.end_time or 0)):
        key = run.data.tags.get(tag.RUN_KEY)
        if key in keys and run.info.status in ("FINISHED", "FAILED", "KILLED"):
            latest[key] = run
    return latest


def diverged(run: Run) -> bool:
    """Whether an ended run stopped on a non-finite loss, gradient norm or weights (the trainer's
    ``Diverged``, recorded in its end reason)."""
    return run.info.status == "FAILED" and run.data.tags.get(tag.END_REASON, "").startswith("Diverged")


def finished_runs(uri: str, spec: SweepSpec, runs: Sequence[SweepRun], metric: str,
                  ended: dict[str, Run] | None = None) -> dict[str, Run]:
    """The finished MLflow run of each of ``runs`` (by run key; a key trained twice: its later
    run) in ``spec``'s experiment (or among ``ended``, ``ended_runs``' answer). Raises
    ``ConfigError`` when none has finished or none logged ``metric`` (naming the metrics they have)."""
    latest = {key: run for key, run in (ended_runs(uri, spec, runs) if ended is None else ended).items()
              if run.info.status == "FINISHED"}
    if not latest:
        raise ConfigError(str(spec.path), f"no finished run of sweep '{spec.name}' in experiment '{spec.experiment}' "
                          f"of {uri} ({len(runs)} planned; launch it first, with the same --set)")
    have = sorted({m for run in latest.values() for m in run.data.metrics})
    if metric not in have:
        shown = ", ".join(have[:40]) + (f", ... ({len(have) - 40} more)" if len(have) > 40 else "")
        raise ConfigError("metric", f"no finished run of {spec.name} logged '{metric}'; they have: {shown}")
    return latest


def final_value(run: Run, metric: str, name: str) -> float | None:
    """A finished run's final ``metric``; None (with a warning naming the run) when it is not
    logged or not finite."""
    value = run.data.metrics.get(metric)
    if value is None or not math.isfinite(value):
        warnings.warn(ConfigWarning(f"{name}: left out, its final {metric} is "
                                    f"{'not logged' if value is None else value}"))
        return None
    return float(value)


def unit(metric: str) -> str:
    return "nats" if metric.endswith("loss") else f"({metric})"
