"""``diffsweep fit`` end to end: load the points, analyse, write the outputs, log the fit run.

Nothing is written until the analysis has succeeded. The outputs are written to a staging folder
beside the output folder, logged from there as the MLflow fit run, and only then renamed into
place: a fit that fails (or whose logging fails) leaves no folder and no finished run behind.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from diffsweep.config import ConfigError
from diffsweep.config.units import human
from diffsweep.fsutil import parents_made_for, publish
from diffsweep.scaling import table as tables
from diffsweep.scaling.analysis import Axis, FitRequest, TokenPoints, analyse
from diffsweep.scaling.folder import check_out
from diffsweep.scaling.plots import write_plots
from diffsweep.scaling.report import markdown
from diffsweep.sweep import expand, load_sweep
from diffsweep.tracking import tags as tag
from diffsweep.tracking.results import store_errors
from diffsweep.tracking.store import check_tracking, existing_store, fail_fast_http, tracking_uri
from diffsweep.tracking.tags import tag_is

FIT_EXPERIMENT = "diffsweep-fits"  # where fits of a CSV are logged


@dataclass(frozen=True)
class Source:
    """Where the runs come from: an MLflow experiment (optionally one sweep), or a CSV."""

    uri: str
    experiment: str | None = None
    sweep: str | None = None
    where: tuple[str, ...] = ()
    csv: Path | None = None
    keys: frozenset[str] | None = None  # a sweep file's current run keys: runs of older versions are left out

    @property
    def label(self) -> str:
        if self.csv is not None:
            return self.csv.stem
        return self.sweep or self.experiment or "runs"


@dataclass
class Outcome:
    """The result and where it went."""

    result: dict
    folder: Path
    files: dict[str, Path] = field(default_factory=dict)
    mlflow_run_id: str | None = None
    mlflow_run_reused: bool = False  # an earlier run of identical inputs holds these outputs
    notes: list[str] = field(default_factory=list)


def resolve_source(sweep: Path | None, experiment: str | None, sweep_name: str | None, where: Sequence[str] | None,
                   csv: Path | None, log: bool, sets: Sequence[str] | None = None) -> Source:
    """Where a fit's points come from: a CSV, a sweep file's runs (as launched, ``sets`` included),
    or an experiment's (``sweep_name``: one sweep's); the tracking store is checked first whenever
    the fit uses it."""
    uri, keys = tracking_uri(), None
    if sets and sweep is None:
        raise ConfigError("set", "selects the runs of a sweep launched with these overrides; give the sweep file")
    if csv is not None:
        if sweep or experiment or sweep_name or where:
            raise ConfigError("csv", "fits the CSV alone; drop the sweep, --experiment, --sweep and --where")
        if log:  # the fit run goes to the store
            fail_fast_http()
            check_tracking(uri)
        return Source(uri=uri, csv=csv)
    if sweep is not None:
        spec = load_sweep(sweep, sets or ())  # the runs of the sweep as launched, --set included
        keys = frozenset(run.key for run in expand(spec).runs)
        experiment, sweep_name = experiment or spec.experiment, sweep_name or spec.name
    elif experiment is None and sweep_name is not None:
        experiment = sweep_name  # a sweep's experiment defaults to its name
    if experiment is None:
        raise ConfigError("fit", "give a sweep file, --experiment NAME or --csv FILE")
    existing_store(uri)
    return Source(uri=uri, experiment=experiment, sweep=sweep_name, where=tuple(where or ()), keys=keys)


def tune_columns(sweep: Path | None, sets: Sequence[str] | None = None) -> tuple[str, ...]:
    """A tuned sweep's tuning keys as columns of the fit's table (``train.lr`` -> ``lr``)."""
    if sweep is None:
        return ()
    column = {key: col for col, key in tables.CONFIG_KEYS.items()}
    out = []
    for key in load_sweep(sweep, sets or ()).tune:
        if key not in column:
            raise ConfigError(f"{sweep}: tune.{key}", "the fit's table has no column for it; a fit can choose among "
                              f"[{', '.join(k for k in column if k != 'train.seed')}]")
        out.append(column[key])
    return tuple(out)


def load_points(source: Source, request: FitRequest) -> pd.DataFrame:
    """The input table; intermediate evaluations are read only when a token fit needs them."""
    if source.csv is not None:
        return tables.from_csv(source.csv)
    with store_errors(source.uri, "read the runs from"):
        return _runs(source, request)


def _runs(source: Source, request: FitRequest) -> pd.DataFrame:
    assert source.experiment is not None
    finals = tables.from_mlflow(source.uri, source.experiment, source.sweep, list(source.where), keys=source.keys)
    if request.law_form.joint_nd or request.token_points is TokenPoints.FINAL:
        return finals
    base = finals[finals["arch"] == request.baseline]
    token_fit = request.axis is Axis.D or (request.axis is Axis.AUTO and base["num_params"].nunique() == 1)
    if token_fit and (request.token_points is TokenPoints.CHECKPOINTS or base["tokens"].nunique() < 3):
        return tables.from_mlflow(source.uri, source.experiment, source.sweep, list(source.where), checkpoints=True,
                                  keys=source.keys)
    return finals


def run_fit(source: Source, request: FitRequest, out: Path | None = None, log: bool = True) -> Outcome:
    """Load, fit and report; returns what was produced. Raises ConfigError on bad input, keyed by the
    ``FitRequest`` field (or ``out``) at fault."""
    inputs = (source.csv,) if source.csv is not None else ()
    if out is not None:  # refused before the (long) fit, not after it
        check_out(out, inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tables.TableWarning)
        points = load_points(source, request)
    notes = [str(w.message) for w in caught if issubclass(w.category, tables.TableWarning)]
    fit = analyse(points, request)
    result = fit.to_dict()
    result["warnings"] = notes + result["warnings"]
    used = fit.points
    assert used is not None
    result["audit"] = arm_audit(used, request.baseline, request.tune)
    if result["audit"] and result["audit"]["flagged"]:
        result["warnings"].append(f"arm audit: {result['audit']['flagged']} difference(s) between the arms compared "
                                  "(same size, other kind) beyond matching; see the report's Arm audit")
    folder = out or Path("fits") / f"{source.label}-{result['axis'].replace(',', '')}"
    check_out(folder, inputs)  # (again: the default folder is known only now)
    result["source"] = {k: (str(v) if isinstance(v, Path) else sorted(v) if isinstance(v, (tuple, frozenset)) else v)
                        for k, v in asdict(source).items() if k != "keys"}
    outcome = Outcome(result=result, folder=folder, notes=notes)
    try:
        with parents_made_for(folder):
            # a fresh staging folder of our own beside the output (the same file system: renamed into place)
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
            try:
                _write(tmp, outcome, used, source)
                if log:
                    with store_errors(source.uri, "log the fit run to"):
                        outcome.mlflow_run_id = _log(tmp, outcome, used, source, request)
                publish(tmp, folder, fill_empty=True)  # a folder the user made is kept
            finally:  # e.g. Ctrl-C while plotting: no half-written folder is left behind
                shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        raise ConfigError("out", f"cannot write {folder} ({exc.strerror or exc})") from None
    outcome.files = {"report": folder / "report.md", "plots": folder / "plots", "points": folder / "points.csv",
                     "json": folder / "fit.json"}
    return outcome


def arm_audit(used: pd.DataFrame, baseline: str, tune: tuple[str, ...] = ()) -> dict | None:
    """The matched-arm audit (``diffsweep.sweep.audit``) of the runs the fit used, from what the
    table knows of each (its last used point): parameters, non-embedding parameters, FLOPs per
    token (in total: the table has no breakdown), tokens, batch tokens, lr, min lr, lr schedule and
    warmup, seeds (a value the table lacks, e.g. a CSV without the column, is not compared). Arms are
    grouped by size label; None when no point has one (a CSV without a size column). A tuned fit's
    candidates are audited too, its tuning columns (``tune``) as each arm's tuning grid."""
    from diffsweep.scaling.table import CONFIG_KEYS
    from diffsweep.sweep.audit import ArmRecord, audit_records

    lost = used["tuned"].astype(str) == "lost" if "tuned" in used.columns else False
    rows = used[used["used"].astype(bool) | lost]
    if rows.empty or (rows["size"].astype(str) == "").all():
        return None
    ident = [k or i or n for k, i, n in zip(rows["run_key"], rows["run_id"], rows["run_name"], strict=True)]
    last = rows.assign(_run=ident).sort_values("tokens", kind="stable").groupby("_run", sort=False).tail(1)
    records = []
    for r in last.itertuples():
        tokens = float(r.tokens)
        values = {"params": int(r.num_params), "non_embedding_params": int(r.num_non_embedding_params),
                  "flops_per_token": float(r.flops) / tokens if pd.notna(r.flops) and tokens else None,
                  "tokens": tokens, "schedule": r.schedule or None,
                  "warmup_steps": int(r.warmup_steps) if pd.notna(r.warmup_steps) else None, "seeds": int(r.seed),
                  "batch_tokens": int(r.batch_tokens) if pd.notna(r.batch_tokens) else None,
                  "lr": float(r.lr) if pd.notna(r.lr) else None, "min_lr": float(r.min_lr) if pd.notna(r.min_lr) else None}
        records.append(ArmRecord(name=str(r.run_name), kind=str(r.arch), group=str(r.size) or "(no size)",
                                 values=values))
    audit = audit_records(records, baseline=baseline, tuned=tuple(CONFIG_KEYS.get(c, c) for c in tune))
    return audit.to_dict() | {"lines": audit.lines()}


def _write(tmp: Path, outcome: Outcome, used: pd.DataFrame, source: Source) -> None:
    """The outputs (``folder.FILES`` and plots), into the staging folder ``tmp`` (made if missing)."""
    tmp.mkdir(exist_ok=True)
    used.to_csv(tmp / "points.csv", index=False)
    (tmp / "fit.json").write_text(json.dumps(outcome.result, indent=1) + "\n")
    (tmp / "report.md").write_text(markdown(outcome.result, source.label))
    write_plots(outcome.result, tmp / "plots")


def ref_slug(row: dict) -> str:
    """A ratio row's reference as a metric-name part: 'N_13.1B_largest', 'N_3.11B_geomean', 'D_251B'."""
    kind = {"largest measured": "_largest", "geometric mean": "_geomean"}
    label = row["at_label"]
    return f"{row['axis']}_{human(row['at'])}" + next((v for k, v in kind.items() if k in label), "")


def _ref_slugs(r: dict) -> dict[str, str]:
    return {ref_slug(row): row["at_label"] for row in r["ratios"]}


def fit_hash(used: pd.DataFrame, request: FitRequest, source: dict) -> str:
    """The identity of a fit: its points, its options, its source and the fit code (this package's
    source files), so that re-running the same fit finds its earlier run instead of adding one."""
    h = hashlib.sha256()
    h.update(used.to_csv(index=False).encode())
    h.update(json.dumps([asdict(request), source], sort_keys=True, default=str).encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def _log(tmp: Path, outcome: Outcome, used: pd.DataFrame, source: Source, request: FitRequest) -> str:
    """The fit as its own MLflow run: tagged as a fit, linked to its source runs, outputs attached."""
    from diffsweep.scaling.report import sentence
    from diffsweep.tracking.provenance import source_tags
    from diffsweep.tracking.results import result_run
    from diffsweep.tracking.store import ensure_experiment, mlflow_client

    r = outcome.result
    experiment = source.experiment or FIT_EXPERIMENT
    client = mlflow_client(source.uri)
    exp_id = ensure_experiment(source.uri, experiment)
    digest = fit_hash(used, request, r["source"])
    same = client.search_runs([exp_id], f"{tag_is(tag.FIT_HASH, digest)} and attributes.status = 'FINISHED'",
                              max_results=1)
    if same:  # the same points, options and fit code: the earlier run already holds these outputs
        outcome.mlflow_run_reused = True
        return same[0].info.run_id
    ids = sorted({i for i in used.loc[used["used"], "run_id"].astype(str) if i})
    joined = ",".join(ids)
    tags = source_tags() | {
        tag.KIND: tag.FIT_KIND,
        tag.FIT_OF: source.label,
        tag.SOURCE_RUNS: joined if len(joined) <= 5000 else joined[:4980] + ",…(see points.csv)",
        tag.SOURCE_RUN_COUNT: str(len(ids)),
        tag.NOTE: "\n".join(sentence(r, row) for row in r["ratios"]) or "one architecture: no ratio",
        tag.FIT_HASH: digest,
        tag.REFS: "; ".join(f"{slug}={label}" for slug, label in _ref_slugs(r).items()),
    }
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")  # names tell successive fits apart in the UI
    with result_run(client, exp_id, f"fit {source.label} {r['axis']} {r['form']} {stamp}", tags) as run:
        params = {"form": r["form"], "axis": r["axis"], "objective": r["objective"], "count": r["count"],
                  "baseline": r["baseline"], "candidates": ",".join(r["candidates"]), "shared_e": r["shared_e"],
                  "n_boot": r["n_boot"], "level": r["level"], "seed": r["seed"], "noise": r["noise"]["source"],
                  "holdout": request.holdout, "where": " ".join(source.where)}
        metrics = []
        for arch, fit in r["fits"].items():
            metrics += [(f"fit/{arch}/{k}", v, 0) for k, v in fit["params"].items()]
        for row in r["ratios"]:
            for k in ("ratio", "lo", "hi"):
                if row[k] is not None:
                    metrics.append((f"ratio/{row['candidate']}/{ref_slug(row)}/{k}", row[k], 0))
        run.log(metrics, {k: str(v) for k, v in params.items()}, timestamp_ms=0)
        run.attach(tmp)
    run_id = run.run_id
    return run_id
