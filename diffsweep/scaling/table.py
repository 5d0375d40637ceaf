"""The fit's input table: finished runs pulled from MLflow (or a CSV), one row per loss point.

Columns (the frozen ``points.csv`` has exactly these, plus ``used`` and ``reason``):
run_id, run_name, run_key, sweep, arch, size, seed, lambda_init, head_norm, v2_pairing,
v2_lambda, num_params, num_non_embedding_params, tokens, flops, loss, step, point
(final | checkpoint), schedule, warmup_steps, lr, min_lr, batch_tokens.

A CSV needs only arch, loss, num_params and tokens; see ``CSV_SCHEMA`` for the optional columns
and what a missing one means (``diffsweep fit --help`` shows it).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from diffsweep.config import ConfigError
from diffsweep.config.loading import parse_scalar
from diffsweep.scaling.schema import CSV_SCHEMA  # noqa: F401  (the documented columns)
from diffsweep.tracking import tags as tag
from diffsweep.tracking.store import all_runs, mlflow_client
from diffsweep.tracking.tags import tag_is

COLUMNS = ("run_id", "run_name", "run_key", "parent", "sweep", "arch", "size", "seed", "lambda_init", "head_norm", "v2_pairing",
           "v2_lambda", "num_params", "num_non_embedding_params", "tokens", "flops", "loss", "step", "point",
           "schedule", "warmup_steps", "lr", "min_lr", "batch_tokens")
REQUIRED_CSV = ("arch", "loss", "num_params", "tokens")
POINTS = ("final", "checkpoint")  # a run's final evaluation, or an intermediate one
COUNT_COLUMNS = ("num_params", "num_non_embedding_params", "tokens")
AUDITED_NUMBERS = ("lr", "min_lr", "batch_tokens")  # compared by the arm audit when known
# A parameter or token count above 1e18 (a million times the largest models and datasets trained
# so far, ~1e12 parameters and ~1e14 tokens) is a typo; near 1e300 the plots and FLOPs overflow.
MAX_COUNT = 1e18
_PARAM_COLUMNS = {"seed": "train.seed", "lambda_init": "model.attention.lambda_init",
                  "head_norm": "model.attention.head_norm", "v2_pairing": "model.attention.v2_pairing",
                  "v2_lambda": "model.attention.v2_lambda", "schedule": "train.schedule",
                  "warmup_steps": "train.warmup_steps", "lr": "train.lr", "min_lr": "train.min_lr",
                  "batch_tokens": "train.batch_tokens"}
CONFIG_KEYS = _PARAM_COLUMNS  # a column's run config key (lr -> train.lr)


class TableWarning(UserWarning):
    """Runs left out of the table, and why."""


def from_csv(path: Path) -> pd.DataFrame:
    """A table from a CSV: at least arch, loss, num_params and tokens (e.g. a frozen points.csv).

    Every problem is one ``ConfigError`` naming the file, the column and (for a cell) the line."""
    if path.is_dir():
        raise ConfigError(str(path), "is a directory; expected a CSV file (e.g. fits/<name>/points.csv)")
    try:
        table = pd.read_csv(path, dtype={c: str for c in ("run_id", "run_name", "run_key", "parent")})
        # the cells as written: pandas renames a repeated column (loss, loss.1) and reads an empty
        # cell as NaN, and both must be told apart from what the file says
        raw = pd.read_csv(path, header=None, dtype=str, keep_default_na=False, na_filter=False)
    except FileNotFoundError:
        raise ConfigError(str(path), "no such file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), f"not a readable CSV ({str(exc).splitlines()[0]})") from None
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read it ({exc.strerror or exc})") from None
    header = [str(c).strip() for c in raw.iloc[0]]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise ConfigError(f"{path}: {repeated[0]}", f"the column appears {header.count(repeated[0])} times in the "
                          "header; keep one (which of them the fit would use is undefined)")
    missing = [c for c in REQUIRED_CSV if c not in table.columns]
    if missing:
        raise ConfigError(str(path), f"missing column(s) {', '.join(missing)}; expected at least "
                          f"{', '.join(REQUIRED_CSV)} (found: {', '.join(map(str, table.columns))})")
    if table.empty:
        raise ConfigError(str(path), "has a header but no rows; expected one row per evaluated run")
    cells = raw.iloc[1:].reset_index(drop=True)
    if not isinstance(table.index, pd.RangeIndex) or len(cells) != len(table):
        raise ConfigError(str(path), "some rows have more cells than the header has columns")
    cells.columns = header
    used = _used(table, cells, path)
    _check_cells(table, cells, used, path)
    _check_counts(table[used], path)
    if "used" in table.columns:
        table["used"] = used
    return _complete(table)


def _line(table: pd.DataFrame, index: int) -> str:
    """'line 5 (run name)': where a row is in the file (its header is line 1)."""
    name = f" ({table.loc[index, 'run_name']})" if "run_name" in table.columns else ""
    return f"line {index + 2}{name}"


def _used(table: pd.DataFrame, cells: pd.DataFrame, path: Path) -> pd.Series:
    """The rows the fit reads: all of them, or a frozen table's used rows (``used`` true/false)."""
    if "used" not in table.columns:
        return pd.Series(True, index=table.index)
    text = cells["used"].str.strip().str.lower()
    odd = ~text.isin(("true", "false"))
    if odd.any():
        index = int(odd.idxmax())
        raise ConfigError(f"{path}: used", f"expected True or False in every row, got {cells.loc[index, 'used']!r} "
                          f"on {_line(table, index)}")
    return text == "true"


# What a fitted row must give: an empty cell in these columns is refused (an explicit nan or inf loss
# is a diverged run, dropped with a warning; an empty one is a value that was never filled in).
_NEEDED = {"arch": "an architecture name", "loss": "a loss (nan for a diverged run)",
           "num_params": "a parameter count", "tokens": "a token count"}
# An architecture name goes into MLflow metric names, plot legends (where $ starts math) and report
# tables: letters, digits and . _ - (spaces inside).
ARCH_RE = re.compile(r"[A-Za-z0-9._-]+(?: [A-Za-z0-9._-]+)*")


def _check_cells(table: pd.DataFrame, cells: pd.DataFrame, used: pd.Series, path: Path) -> None:
    """Refuse an empty required cell, a cell that is not a number where one is expected, and an
    architecture name outside ARCH_RE, naming the file, the column and the line."""
    for col, what in _NEEDED.items():
        empty = used & (cells[col].str.strip() == "")
        if empty.any():
            index = int(empty.idxmax())
            raise ConfigError(f"{path}: {col}", f"empty cell on {_line(table, index)}; every row needs {what}")
    for col, what in [*((c, "a number") for c in ("loss", *COUNT_COLUMNS)),
                      *((c, "a number (or nothing)") for c in AUDITED_NUMBERS)]:
        if col not in table.columns or pd.api.types.is_numeric_dtype(table[col]):
            continue
        text = cells[col].str.strip()
        bad = (text != "") & pd.to_numeric(text, errors="coerce").isna() & ~text.str.lower().isin(_NAN_WORDS)
        index = int(bad.idxmax()) if bad.any() else int(text.index[0])
        raise ConfigError(f"{path}: {col}", f"expected {what} in every row, got {cells.loc[index, col]!r} on "
                          f"{_line(table, index)}")
    odd = used & ~cells["arch"].str.fullmatch(ARCH_RE.pattern)
    if odd.any():
        index = int(odd.idxmax())
        raise ConfigError(f"{path}: arch", f"expected a name of letters, digits and . _ - (spaces inside), got "
                          f"{cells.loc[index, 'arch']!r} on {_line(table, index)}")
    if "point" in cells.columns:
        odd = ~cells["point"].isin(("", *POINTS))
        if odd.any():
            index = int(odd.idxmax())
            raise ConfigError(f"{path}: point", f"expected one of [{', '.join(POINTS)}] (or nothing: final) in every "
                              f"row, got {cells.loc[index, 'point']!r} on {_line(table, index)}")


_NAN_WORDS = ("nan", "na", "n/a", "null", "none", "-nan", "#n/a", "<na>")  # pandas reads these as missing


def _check_counts(rows: pd.DataFrame, path: Path) -> None:
    """Refuse a count that cannot be one (a typo misplaces a point on the x axis, so the row is not
    silently dropped as a bad loss is): naming the column and the file's line."""
    for col in (c for c in COUNT_COLUMNS if c in rows.columns):
        values = rows[col].astype(float)
        bad = ~(np.isfinite(values) & (values >= 1) & (values <= MAX_COUNT))
        if bad.any():
            index, value = bad.idxmax(), values[bad].iloc[0]
            raise ConfigError(f"{path}: {col}", f"expected a count from 1 to {MAX_COUNT:.0e} in every row, got "
                              f"{value:g} on {_line(rows, index)}")


def _complete(table: pd.DataFrame) -> pd.DataFrame:
    table = table.copy()
    defaults = {"run_id": "", "run_key": "", "parent": "", "sweep": "", "size": "", "seed": 0, "lambda_init": "", "head_norm": "",
                "v2_pairing": "", "v2_lambda": "", "flops": np.nan, "step": np.nan, "point": "final", "schedule": "",
                "warmup_steps": np.nan,  # step / warmup unknown: no evaluation is taken for one in warmup
                "lr": np.nan, "min_lr": np.nan, "batch_tokens": np.nan}  # unknown: not compared by the arm audit
    for col, value in defaults.items():
        if col not in table.columns:
            table[col] = value
    if "run_name" not in table.columns:
        table["run_name"] = [f"row {i + 2}" for i in range(len(table))]
    if "num_non_embedding_params" not in table.columns:
        table["num_non_embedding_params"] = table["num_params"]
    if "used" in table.columns:  # a frozen table: refit exactly the rows it used (and a tuned fit's candidates)
        lost = table["tuned"].astype(str) == "lost" if "tuned" in table.columns else False
        table = table[table["used"].astype(bool) | lost].drop(columns=["used", "reason"], errors="ignore")
    for col in ("run_id", "run_name", "run_key", "parent", "sweep", "arch", "size", "lambda_init", "head_norm", "v2_pairing",
                "v2_lambda", "schedule"):
        table[col] = table[col].astype(object).fillna("").astype(str)  # an all-empty column reads as float
    table["point"] = table["point"].astype(object).fillna("final").astype(str)  # checked by from_csv
    return table.reset_index(drop=True)[list(COLUMNS)]


def parse_where(items: list[str]) -> list[tuple[str, str, object]]:
    """``KEY=VALUE`` / ``KEY!=VALUE`` filters; KEY is a config key (params) or ``tags.NAME``."""
    out = []
    for item in items:
        op = "!=" if "!=" in item else "="
        key, sep, value = item.partition(op)
        if not sep or not key.strip():
            raise ConfigError("where", f"expected KEY=VALUE or KEY!=VALUE, got '{item}'")
        out.append((key.strip(), op, _typed(value.strip())))
    return out


def _typed(text: str) -> object:
    value = parse_scalar(text)
    return value if isinstance(value, (str, int, float, bool)) or value is None else text


def _matches(run, filters: list[tuple[str, str, object]]) -> bool:
    for key, op, value in filters:
        if key.startswith("tags."):
            raw = run.data.tags.get(key[5:])
        else:
            raw = run.data.params.get(key.removeprefix("params."))
        equal = raw is not None and _typed(raw) == value
        if equal != (op == "="):
            return False
    return True


def from_mlflow(uri: str, experiment: str, sweep: str | None = None, where: list[str] | None = None,
                checkpoints: bool = False, keys: frozenset[str] | None = None) -> pd.DataFrame:
    """Finished runs of ``experiment`` (optionally of one sweep, filtered by ``where``) as a table.

    With ``checkpoints`` every validation evaluation becomes a row (point = checkpoint), read from
    the metric history; otherwise each run gives one row, its final evaluation. With ``keys`` (a
    sweep file's current run keys) runs of earlier versions of the sweep are left out."""
    from diffsweep.sweep.spec import NAME_RE

    filters = parse_where(where or [])
    if sweep is not None and not NAME_RE.match(sweep):  # it goes into a search filter string below
        raise ConfigError("sweep", f"expected a sweep name ([A-Za-z0-9._-], as in its sweep file), got {sweep!r}")
    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ConfigError("experiment", f"no experiment '{experiment}' in {uri}; experiments there: "
                          f"{', '.join(names) or 'none'}")
    query = tag_is(tag.SWEEP, sweep) if sweep else ""
    runs = all_runs(client, exp.experiment_id, query)
    not_training = (tag.FIT_KIND, tag.EVAL_KIND, tag.COMPARISON_KIND)
    runs = [r for r in runs if r.data.tags.get(tag.KIND) not in not_training and _matches(r, filters)]
    stale = 0
    if keys is not None:
        current = [r for r in runs if r.data.tags.get(tag.RUN_KEY) in keys]
        stale, runs = len(runs) - len(current), current
    what = f"experiment '{experiment}'" + (f", sweep '{sweep}'" if sweep else "") + (
        f", --where {' '.join(where or [])}" if where else "")
    if not runs:
        hint = (f"; {stale} run(s) of the sweep have other run keys (an earlier version of the sweep file, or "
                "launched with other --set overrides: pass the same --set to fit)") if stale else ""
        raise ConfigError("where" if where else "sweep" if sweep else "experiment",
                          f"no runs match ({what}){hint}")
    if stale:
        warnings.warn(TableWarning(f"left out {stale} run(s) that are not in the sweep file's current expansion "
                                   "(an earlier version of the sweep, or launched with other --set overrides)"))
    finished = [r for r in runs if r.info.status == "FINISHED"]
    if len(finished) < len(runs):
        states = pd.Series([r.info.status for r in runs if r.info.status != "FINISHED"]).value_counts()
        warnings.warn(TableWarning(f"left out {len(runs) - len(finished)} unfinished run(s) ("
                                   + ", ".join(f"{n} {s}" for s, n in states.items()) + ")"))
    if not finished:
        raise ConfigError("experiment", f"none of the {len(runs)} matching runs has finished ({what})")
    rows, latest = [], {}
    for run in sorted(finished, key=lambda r: r.info.end_time or 0):
        key = run.data.tags.get(tag.RUN_KEY, run.info.run_id)
        if key in latest:
            warnings.warn(TableWarning(f"run key {key} was trained twice; using the later run {run.info.run_id}"))
        latest[key] = run
    for run in latest.values():
        rows.extend(_rows(client, run, checkpoints))
    # a fixed order (not the store's), so the same runs give the same bootstrap draws
    order = ["arch", "num_params", "tokens", "seed", "run_key", "step"]
    return _complete(pd.DataFrame(rows).sort_values(order, kind="stable"))


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return np.nan


def _rows(client, run, checkpoints: bool) -> list[dict]:
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    missing = [t for t in (tag.ARCH, tag.PARAMS, tag.NON_EMBEDDING_PARAMS,
                           tag.FLOPS_PER_TOKEN) if t not in tags]
    if missing or "val/loss" not in metrics:
        what = f"tag(s) {', '.join(missing)}" if missing else "metric val/loss"
        raise ConfigError(f"run {run.info.run_name} ({run.info.run_id})",
                          f"has no {what}: not a diffsweep training run (or logged by an older diffsweep)")
    def count(what: str, text: str | None, minimum: int = 0) -> int:  # a tag or param the user may have edited
        try:
            value = int(text or 0)
        except ValueError:
            value = -1
        if value < minimum:
            raise ConfigError(f"run {run.info.run_name} ({run.info.run_id})",
                              f"{what} is {text!r}, expected an integer >= {minimum} (edited in the store?)")
        return value

    base = {"run_id": run.info.run_id, "run_name": run.info.run_name, "run_key": tags.get(tag.RUN_KEY, ""),
            "parent": tags.get(tag.BRANCH_PARENT_KEY, ""),  # a cooldown branch: its parent's run key (they share its offset)
            "sweep": tags.get(tag.SWEEP, ""), "arch": tags[tag.ARCH], "size": tags.get(tag.SIZE, ""),
            "num_params": count("tag diffsweep.params", tags[tag.PARAMS], 1),
            "num_non_embedding_params": count("tag diffsweep.non_embedding_params",
                                              tags[tag.NON_EMBEDDING_PARAMS], 1)}
    base |= {col: params.get(key, "") for col, key in _PARAM_COLUMNS.items()}
    base["seed"] = count("param train.seed", base["seed"])
    base["warmup_steps"] = count("param train.warmup_steps", base["warmup_steps"])
    for col in AUDITED_NUMBERS:  # for the arm audit; an older run without them: unknown
        base[col] = _number(base[col])
    per_token = count("tag diffsweep.flops_per_token", tags[tag.FLOPS_PER_TOKEN], 1)
    if not checkpoints:
        tokens = float(metrics.get("train/tokens", np.nan))
        max_steps = params.get("train.max_steps")
        step = count("param train.max_steps", max_steps) if max_steps not in (None, "None") else 0
        return [base | {"tokens": tokens, "flops": per_token * tokens, "loss": float(metrics["val/loss"]),
                        "step": step, "point": "final"}]
    tokens_at = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/tokens")}
    history = sorted(client.get_metric_history(run.info.run_id, "val/loss"), key=lambda m: m.step)
    last = history[-1].step
    return [base | {"tokens": tokens_at.get(m.step, np.nan), "flops": per_token * tokens_at.get(m.step, np.nan),
                    "loss": m.value, "step": m.step, "point": "final" if m.step == last else "checkpoint"}
            for m in history]
