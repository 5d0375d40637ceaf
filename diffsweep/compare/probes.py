"""``diffsweep compare SWEEP --probes``: read the sweep's evaluation runs from the MLflow store,
build each probe's tables across the arms (``probe_tables``: how they are built and judged) and
write and log them (``probe_output``, ``probe_report``)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from diffsweep.compare.probe_output import check_out, write_outputs
from diffsweep.compare.probe_tables import (
    ArmGroup,
    EvalRecord,
    ProbeComparison,
    ProbeTable,
    TableSpec,
    arm_groups,
    build_table,
    choose,
    size_label,
)
from diffsweep.compare.runs import sweep_rows
from diffsweep.config import ConfigError
from diffsweep.sweep.expand import SweepRun
from diffsweep.sweep.spec import SweepSpec
from diffsweep.tracking import tags as tag
from diffsweep.tracking.store import all_runs, mlflow_client, retry_busy
from diffsweep.tracking.tags import tag_is


def compare_probes(uri: str, spec: SweepSpec, runs: Sequence[SweepRun],
                   comparisons: Callable[[str], Sequence[TableSpec]], *, baseline: str | None = None,
                   step: int | None = None, level: float = 0.95, out: Path | None = None,
                   log: bool = True) -> ProbeComparison:
    """Read the sweep's FINISHED evaluation runs (``diffsweep.eval.sweep`` = the sweep, of a run
    key of ``runs``) from ``spec``'s experiment, build each probe's tables (``comparisons(probe)``)
    per group of arms (``arm_groups``), write ``probes.md``, ``probes.json`` and a PNG per table
    into ``out`` (default ``compare/<sweep>-probes``; ``probe_output.check_out`` says which folders
    it may write, checked first) and log them as an MLflow run of kind ``comparison``. Raises
    ``ConfigError`` when the sweep has no evaluation (at ``step``), ``baseline`` is no arm or has no
    evaluation, or ``out`` may not be written."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per table read, on stderr
    rows = sweep_rows(runs)
    arm_of = {run.key: row.label for row in rows for run in row.runs}
    arms = [row.label for row in rows]
    if baseline is not None and baseline not in arms:
        raise ConfigError("baseline", f"expected an arm of {spec.name}: one of [{', '.join(arms)}], got {baseline!r}")
    folder = out or Path("compare") / f"{spec.name}-probes"
    old = check_out(folder)  # before anything is read: a folder it may not write is refused first
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(spec.experiment)
    found = [] if exp is None else all_runs(client, exp.experiment_id, f"{tag_is(tag.KIND, tag.EVAL_KIND)} and "
                                            f"{tag_is(tag.EVAL_SWEEP, spec.name)} and "
                                            "attributes.status = 'FINISHED'")
    seed_of = {run.key: run.config.train.seed for run in runs}
    records = [replace(_record(r), seed=seed_of[r.data.tags[tag.EVAL_RUN_KEY]]) for r in found
               if r.data.tags.get(tag.EVAL_RUN_KEY) in arm_of]
    first = f"run `diffsweep eval {spec.path} --probe PROBE` first"
    if not records:
        raise ConfigError(str(spec.path), f"no evaluation run of sweep '{spec.name}' in experiment "
                          f"'{spec.experiment}' of {uri}; {first}")
    chosen = choose(records, step)
    if not chosen:
        have = sorted({r.step for r in records})
        raise ConfigError("step", f"no evaluation of sweep '{spec.name}' at step {step}; evaluated steps: {have}")
    evaluated = [a for a in arms if any(arm_of[r.run_key] == a for r in chosen)]
    if baseline is not None and baseline not in evaluated:
        raise ConfigError("baseline", f"arm {baseline} has no evaluation{'' if step is None else f' at step {step}'};"
                          f" evaluated arms: [{', '.join(evaluated)}]")
    kinds = {row.label: str(row.runs[0].config.model.attention.kind) for row in rows}
    sizes = {row.label: size_label(row.runs[0].config) for row in rows}
    groups, notes = arm_groups(arms, kinds, sizes, evaluated, baseline)
    tables = []
    with tempfile.TemporaryDirectory(prefix="diffsweep-probes-") as tmp:
        for probe in dict.fromkeys(r.probe for r in sorted(chosen, key=lambda r: r.probe)):
            specs = comparisons(probe)
            mine = [r for r in chosen if r.probe == probe]
            if not specs:
                notes.append(f"{probe}: no comparison table defined for this probe; left out")
                continue
            loaded = [(arm_of[r.run_key], _with_tables(client, r, [s.table for s in specs], Path(tmp))) for r in mine]
            tables += _probe_tables(probe, specs, loaded, groups, level, notes)
    result = ProbeComparison(sweep=spec.name, experiment=spec.experiment,
                             baseline=groups[0].baseline if len(groups) == 1 else None, level=level, step=step,
                             arms=tuple(arms), tables=tables, notes=notes, groups=tuple(groups), kinds=kinds,
                             sizes=sizes)
    write_outputs(result, folder, old, uri if log else None)
    return result


def _probe_tables(probe: str, specs: Sequence[TableSpec], loaded: Sequence[tuple[str, EvalRecord]],
                  groups: Sequence[ArmGroup], level: float, notes: list[str]) -> list[ProbeTable]:
    """One probe's tables, one per spec and group of arms; what is left out goes to ``notes``."""
    out = []
    for group in groups:
        if not any(arm == group.baseline for arm, _ in loaded) and any(arm in group.arms for arm, _ in loaded):
            at = "" if group.size is None else f" of size {group.size}"
            notes.append(f"{probe}: the baseline {group.baseline}{at} has no evaluation; differences left out")
    for s in specs:
        if not any(s.table in record.tables for _, record in loaded):
            continue  # a table the probe makes only with some settings (quantization's tasks)
        if len({record.settings for _, record in loaded}) > 1:
            notes.append(f"{probe}: evaluated with {len({r.settings for _, r in loaded})} different settings; cells "
                         "of one key may mix them (evaluate all runs with the same --probe-set)")
        built = []
        for group in groups:
            mine = [(arm, record) for arm, record in loaded if arm in group.arms]
            if mine:
                table = build_table(probe, s, mine, group.arms, group.baseline, level)
                if table.cells:
                    built.append(replace(table, size=group.size, baseline=group.baseline))
        if not built:
            notes.append(f"{probe}: table {s.table} has no rows to compare")
        out += built
    return out


def _record(run: Any) -> EvalRecord:
    tags = run.data.tags
    return EvalRecord(run_id=run.info.run_id, probe=tags.get(tag.EVAL_PROBE, "?"),
                      step=int(tags.get(tag.EVAL_STEP, "0")), run_key=tags[tag.EVAL_RUN_KEY],
                      run_name=tags.get(tag.EVAL_SWEEP_RUN) or tags.get(tag.EVAL_RUN_NAME, "?"),
                      settings=tags.get(tag.EVAL_SETTINGS, "{}"), end_time=run.info.end_time or 0)


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
