"""The sweep file: a base config, axes over dotted config keys, filters, derived values, seeds.

A sweep file is data (YAML); this module only reads it strictly into a ``SweepSpec``. Expansion
into runs is ``diffsweep.sweep.expand``. Shape (every key optional except some source of runs):

    name: table6-ablation          # [A-Za-z0-9._-]; default: the file's stem
    experiment: table6-ablation    # MLflow experiment; default: the name
    base: ../runs/paper-1.4B-transformer.yaml   # run config under every run (relative to this file)
    set: {model.size: 1.4B}        # dotted overrides on top of the base, for every run
    grid: {model.attention.kind: [transformer, diff_v1], ...}   # cartesian product
    zip: [{train.lr: [...], train.batch_tokens: [...]}]         # paired axes (equal lengths)
    runs: [{model.attention.head_dim: 256}, ...]                # explicit extra points
    seeds: [0, 1, 2]               # crossed with every point (train.seed)
    include: [{model.size: [1.4B, 2.8B]}]   # keep only points matching one of these
    exclude: [{model.attention.kind: transformer, model.size: 13.1B}]   # drop matching points
    derive: {train.max_tokens: {rule: tokens_per_param, ratio: 20}}     # see sweep.derive
    launch: {profile: localhost, max_retries: 2, max_parallel: 4, output: runs/table6}

Launch settings never enter a run's identity: they live outside the run config.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffsweep.config import Config, ConfigError
from diffsweep.config.loading import read_yaml

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Sweep values reach job names, paths and Slurm scripts; none of these may ever carry a shell
# metacharacter or quote, so they are refused outright rather than escaped.
SHELL_UNSAFE = set("'\"`$\\;&|<>*?!(){}[]~#\n\r\t")


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """How a sweep is launched (never part of a run's identity)."""

    profile: str | None = None  # cluster profile name or YAML path (slurm/profiles/); None: auto
    max_retries: int = 2  # a failed run is resubmitted at most this many times
    max_parallel: int | None = None  # runs executing at once (Slurm array %N; local workers)
    output: str | None = None  # sweep output directory; None: runs/<sweep name>
    gpus_per_run: int | None = None  # None: the fewest GPUs each run fits on (memory estimate)


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A sweep file, read strictly; dotted keys are checked against the run config schema."""

    path: Path
    name: str
    experiment: str
    base: Path | None = None
    set: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zip: list[dict[str, list[Any]]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    seeds: list[int] | None = None
    include: list[dict[str, list[Any]]] = field(default_factory=list)
    exclude: list[dict[str, list[Any]]] = field(default_factory=list)
    derive: dict[str, dict[str, Any]] = field(default_factory=dict)
    launch: LaunchSettings = field(default_factory=LaunchSettings)


TOP_KEYS = ("name", "experiment", "base", "set", "grid", "zip", "runs", "seeds", "include", "exclude", "derive",
            "launch")


def config_keys() -> frozenset[str]:
    """Every dotted leaf key of a run config (``model.attention.kind``, ``train.lr``, ...)."""
    return _keys(Config, "")


def _keys(cls: type, prefix: str) -> frozenset[str]:
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out |= _keys(tp, f"{prefix}{f.name}.")
        else:
            out.add(f"{prefix}{f.name}")
    return frozenset(out)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep file. Raises ``ConfigError`` naming the file and key."""
    p = Path(path)
    raw = read_yaml(p)
    where = str(p)
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(f"{where}: {key}", f"unknown sweep key{_did_you_mean(str(key), TOP_KEYS)}; "
                              f"expected one of [{', '.join(TOP_KEYS)}]")
    _check_safe(raw, where)
    keys = config_keys()

    name = raw.get("name", p.stem)
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ConfigError(f"{where}: name", f"expected letters, digits, '.', '_' or '-', got {name!r}")
    experiment = raw.get("experiment", name)
    if not isinstance(experiment, str) or not experiment.strip():
        raise ConfigError(f"{where}: experiment", f"expected a non-empty string, got {experiment!r}")
    base = raw.get("base")
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{where}: base", f"expected a path to a run config YAML, got {base!r}")
        base_path = (p.parent / base) if not Path(base).is_absolute() else Path(base)
        if not base_path.is_file():
            raise ConfigError(f"{where}: base", f"run config {base_path} not found")
        base = base_path

    settings = _mapping(raw.get("set"), f"{where}: set")
    for key in settings:
        _check_key(key, keys, f"{where}: set")

    grid = _mapping(raw.get("grid"), f"{where}: grid")
    for key, values in grid.items():
        _check_key(key, keys, f"{where}: grid")
        grid[key] = _values(values, f"{where}: grid.{key}")

    zips: list[dict[str, list[Any]]] = []
    for i, group in enumerate(_list(raw.get("zip"), f"{where}: zip")):
        group = _mapping(group, f"{where}: zip[{i}]")
        if not group:
            raise ConfigError(f"{where}: zip[{i}]", "empty zip group; expected {key: [values], ...}")
        lengths = {}
        for key, values in group.items():
            _check_key(key, keys, f"{where}: zip[{i}]")
            group[key] = _values(values, f"{where}: zip[{i}].{key}")
            lengths[key] = len(group[key])
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise ConfigError(f"{where}: zip[{i}]", f"conflicting lengths ({detail}); zipped axes pair "
                              "values one to one, so they need the same number of values")
        zips.append(group)

    axis_keys = [*grid] + [k for g in zips for k in g]
    repeated = sorted({k for k in axis_keys if axis_keys.count(k) > 1})
    if repeated:
        raise ConfigError(f"{where}: {repeated[0]}", "is swept by more than one axis (grid/zip); sweep it once")

    runs: list[dict[str, Any]] = []
    for i, run in enumerate(_list(raw.get("runs"), f"{where}: runs")):
        run = _mapping(run, f"{where}: runs[{i}]")
        for key in run:
            _check_key(key, keys, f"{where}: runs[{i}]")
        runs.append(run)

    seeds = raw.get("seeds")
    if seeds is not None:
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            seeds = list(range(seeds))  # ``seeds: 3`` means 0, 1, 2
        if (not isinstance(seeds, list) or not seeds
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)):
            raise ConfigError(f"{where}: seeds", f"expected a count or a non-empty list of integers >= 0, got {seeds!r}")
        if len(set(seeds)) != len(seeds):
            raise ConfigError(f"{where}: seeds", f"repeats a seed: {seeds}")
        if "train.seed" in axis_keys or any("train.seed" in r for r in runs):
            raise ConfigError(f"{where}: seeds", "train.seed is also set by an axis or a run; set seeds in one place")

    filters = {}
    for which in ("include", "exclude"):
        patterns = []
        for i, pattern in enumerate(_list(raw.get(which), f"{where}: {which}")):
            pattern = _mapping(pattern, f"{where}: {which}[{i}]")
            if not pattern:
                raise ConfigError(f"{where}: {which}[{i}]", "empty pattern; expected {key: value or [values]}")
            for key, value in pattern.items():
                _check_key(key, keys, f"{where}: {which}[{i}]")
                pattern[key] = value if isinstance(value, list) else [value]
            patterns.append(pattern)
        filters[which] = patterns

    derive = _mapping(raw.get("derive"), f"{where}: derive")
    for key, rule in derive.items():
        _check_key(key, keys, f"{where}: derive")
        if key in axis_keys or key in settings or any(key in r for r in runs):
            raise ConfigError(f"{where}: derive.{key}", "is also set by set/grid/zip/runs; a value is either "
                              "given or derived")
        from diffsweep.sweep.derive import check_rule  # here to keep the dependency one-way and lazy

        derive[key] = check_rule(rule, key, f"{where}: derive.{key}")

    if not grid and not zips and not runs:
        raise ConfigError(f"{where}: grid", "empty sweep: give at least one of grid, zip or runs")

    return SweepSpec(
        path=p, name=name, experiment=experiment, base=base, set=settings, grid=grid, zip=zips, runs=runs,
        seeds=seeds, include=filters["include"], exclude=filters["exclude"], derive=derive,
        launch=_launch(raw.get("launch"), f"{where}: launch"),
    )


def _launch(raw: Any, where: str) -> LaunchSettings:
    data = _mapping(raw, where)
    allowed = [f.name for f in dataclasses.fields(LaunchSettings)]
    for key, value in data.items():
        if key not in allowed:
            raise ConfigError(f"{where}.{key}", f"unknown launch setting{_did_you_mean(str(key), allowed)}; "
                              f"expected one of [{', '.join(allowed)}]")
        if key in ("profile", "output") and value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}.{key}", f"expected a string, got {value!r}")
        if key == "max_retries" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"{where}.{key}", f"expected an integer >= 0, got {value!r}")
        if key in ("max_parallel", "gpus_per_run") and value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}.{key}", f"expected an integer >= 1, got {value!r}")
    return LaunchSettings(**data)


def _check_safe(value: Any, where: str, path: str = "") -> None:
    """Refuse quotes and shell metacharacters in every string (keys too) of the sweep file."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_safe(k, where, path)
            _check_safe(v, where, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_safe(v, where, f"{path}[{i}]")
    elif isinstance(value, str):
        bad = sorted(set(value) & SHELL_UNSAFE)
        if bad:
            raise ConfigError(f"{where}: {path or value!r}", f"value {value!r} contains {bad[0]!r}: quotes and shell "
                              "metacharacters are not allowed in sweep files (they would reach job scripts)")


def _check_key(key: Any, keys: frozenset[str], where: str) -> None:
    if not isinstance(key, str) or key not in keys:
        raise ConfigError(f"{where}.{key}", f"unknown config key{_did_you_mean(str(key), keys)}; expected a dotted "
                          "run config key such as model.size, model.attention.kind or train.lr")


def _did_you_mean(key: str, options: Any) -> str:
    close = difflib.get_close_matches(key, sorted(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _mapping(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(where, f"expected a mapping, got {raw!r}")
    return dict(raw)


def _list(raw: Any, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(where, f"expected a list, got {raw!r}")
    return raw


def _values(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise ConfigError(where, f"expected a list of values, got {raw!r}")
    if not raw:
        raise ConfigError(where, "empty list of values: an axis needs at least one value")
    return list(raw)
