"""The sweep file: a base config, axes over dotted config keys, filters, derived values, seeds.

A sweep file is data (YAML); this module only reads it strictly into a ``SweepSpec`` (its docstring
shows every key). Expansion into runs is ``diffsweep.sweep.expand``. A relative path in a sweep file
is relative to the directory of the file that writes it, a ``--set`` value to the working directory;
``extends`` layers a file's keys over another sweep's (``MERGED_KEYS`` merge key by key, the others
replace; ``OWN_KEYS`` and ``launch.output`` are never inherited). Launch and eval settings never
enter a run's identity.

See docs/sweeps.md, 'Sweep files'; its paths, merge rules and precedence in full: sweeps/README.md.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from diffsweep.config import Config, ConfigError
from diffsweep.config.decode import AtLeast, Check, decode, decode_value, did_you_mean, strict_string, unknown_key
from diffsweep.config.loading import parse_override, read_yaml
from diffsweep.sweep.branches import BranchSettings, check_settings, check_written
from diffsweep.sweep.derive import check_rule

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Sweep values reach job names, paths and Slurm scripts; none of these may ever carry a shell
# metacharacter or quote, so they are refused outright rather than escaped.
SHELL_UNSAFE = set("'\"`$\\;&|<>*?!(){}[]~#\n\r\t")
DATA_PATH = "data.path"
SEED_KEY = "train.seed"
# Keys a tuning grid may not hold, and why: they define the cells (or, seeds, the noise) a tuning
# value is chosen within.
UNTUNABLE = {
    "model.attention.kind": "the attention kind is what a study compares, not a setting tuned for it",
    "model.size": "the size is an axis of the study (a cell), not a setting tuned within one",
    SEED_KEY: "seeds are the noise a tuning value's loss is averaged over (seeds:), not candidates",
    DATA_PATH: "the data is the same for every candidate of a cell",
}


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """How a sweep is launched (never part of a run's identity)."""

    # The annotations are what the decoder checks (diffsweep.config.decode): strings as written,
    # integers with a lower bound.
    profile: Annotated[str, Check(strict_string)] | None = None  # cluster profile name or YAML path; None: auto
    max_retries: Annotated[int, AtLeast(0)] = 2  # a failed run is resubmitted at most this many times
    max_parallel: Annotated[int, AtLeast(1)] | None = None  # runs executing at once (Slurm array %N; local workers)
    output: Annotated[str, Check(strict_string)] | None = None  # None: runs/<sweep name> beside the sweep file
    gpus_per_run: Annotated[int, AtLeast(1)] | None = None  # None: the fewest GPUs each run fits on (memory)
    max_runs: Annotated[int, AtLeast(1)] = 100_000  # refuse a sweep that expands to more (a typo in seeds or an axis)


@dataclass(frozen=True)
class EvalSettings:
    """Probes each launched job runs once its run has trained (never part of a run's identity)."""

    probes: tuple[Annotated[str, Check(strict_string)], ...] = ()  # names in diffsweep.eval.probe.PROBES
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # probe -> {setting: value}
    steps: tuple[Annotated[int, AtLeast(1)], ...] = ()  # also these checkpoints (if kept), besides the newest


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """A sweep file, read strictly; dotted keys are checked against the run config schema.

    Its YAML (every key optional except some source of runs)::

        name: table6-ablation          # [A-Za-z0-9._-]; default: the file's stem
        experiment: table6-ablation    # MLflow experiment; default: the name
        extends: table6-ablation.yaml  # start from another sweep's keys
        base: runs/paper-1.4B-transformer.yaml   # run config under every run
        set: {model.size: 1.4B}        # dotted overrides on top of the base, for every run
        grid: {model.attention.kind: [transformer, diff_v1], ...}   # cartesian product
        zip: [{train.lr: [...], train.batch_tokens: [...]}]         # paired axes (equal lengths)
        runs: [{model.attention.head_dim: 256}, ...]                # explicit extra points
        tune: {train.lr: [3.0e-4, 6.0e-4, 1.2e-3]}   # tuning axes: crossed with every point; see sweep.tune
        seeds: [0, 1, 2]               # crossed with every point (train.seed); a count: 3
        include: [{model.size: [1.4B, 2.8B]}]   # keep only points matching one of these
        exclude: [{model.attention.kind: transformer, model.size: 13.1B}]   # drop matching points
        derive: {train.max_tokens: {rule: tokens_per_param, ratio: 20}}     # see sweep.derive
        launch: {profile: localhost, max_retries: 2, max_parallel: 4, output: ../runs/table6, max_runs: 100000}
        eval: {probes: [outliers, needle], settings: {needle: {samples: 10}}, steps: [2000]}   # after training
        branches: {steps: [2000, 4000], cooldown: 0.2, shape: linear}   # or cooldown_length: 500; see sweep.branches

    A value in grid, zip or runs may be a derive rule computed for that point alone, e.g.
    ``model.attention.head_dim: {rule: scale, factor: 2}``: twice the head dim of the run's size.

    Every path in it is absolute: a relative one was resolved against the directory of the file that
    wrote it. A relative ``data.path`` from the base config (or the default) is resolved when the
    sweep expands, against ``data_root``: the directory of the sweep file that names the base.
    """

    path: Path
    name: str
    experiment: str
    base: Path | None = None
    data_root: Path  # where a relative data.path of the base config (or the default) lives
    set: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)  # --set: over ``set``, for every run
    grid: dict[str, list[Any]] = field(default_factory=dict)
    zip: list[dict[str, list[Any]]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    tune: dict[str, list[Any]] = field(default_factory=dict)  # tuning axes (``diffsweep.sweep.tune``)
    seeds: list[int] | None = None
    include: list[dict[str, list[Any]]] = field(default_factory=list)
    exclude: list[dict[str, list[Any]]] = field(default_factory=list)
    derive: dict[str, dict[str, Any]] = field(default_factory=dict)
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    branches: BranchSettings | None = None  # cooldown branches of every run (``diffsweep.sweep.branches``)


TOP_KEYS = ("name", "experiment", "extends", "base", "set", "grid", "zip", "runs", "tune", "seeds", "include",
            "exclude", "derive", "launch", "eval", "branches")
MERGED_KEYS = ("set", "grid", "tune", "derive", "launch", "eval", "branches")  # merged key by key under ``extends``; others replace
OWN_KEYS = ("name", "experiment", "extends")  # never inherited (nor launch.output)


def config_keys() -> frozenset[str]:
    """Every dotted leaf key of a run config (``model.attention.kind``, ``train.lr``, ...)."""
    return _keys(Config, "")


def _keys(cls: type, prefix: str) -> frozenset[str]:
    hints = typing.get_type_hints(cls)
    out: set[str] = set()
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a section (a class, not an instance)
            out |= _keys(tp, f"{prefix}{f.name}.")
        else:
            out.add(f"{prefix}{f.name}")
    return frozenset(out)


def load_sweep(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """Read and check a sweep file (and the files it extends), then ``--set``-style ``overrides``
    (``a.b=c``) for every run. Raises ``ConfigError`` naming the file and key."""
    p = Path(path)
    where = str(p)
    raw, data_root = _layers(p, ())
    raw = _check(raw, where, _directory(p), parent=False)
    launch = LaunchSettings(**raw["launch"])
    seeds = raw["seeds"]
    if isinstance(seeds, int):
        seeds = list(range(seeds))  # ``seeds: 3`` means 0, 1, 2 (the count was checked first)
    spec = SweepSpec(
        path=p, name=raw.get("name", p.stem), experiment=raw.get("experiment", raw.get("name", p.stem)),
        base=Path(raw["base"]) if raw["base"] is not None else None, data_root=data_root, set=raw["set"],
        grid=raw["grid"], zip=raw["zip"], runs=raw["runs"], tune=raw["tune"], seeds=seeds, include=raw["include"],
        exclude=raw["exclude"], derive=raw["derive"], launch=launch,
        eval=EvalSettings(probes=tuple(raw["eval"].get("probes", ())), settings=raw["eval"].get("settings", {}),
                          steps=tuple(raw["eval"].get("steps", ()))),
        branches=_branches(raw["branches"], where) if raw["branches"] is not None else None,
    )
    return dataclasses.replace(spec, overrides=_overrides(spec, overrides))


def _directory(path: Path) -> Path:
    """The directory relative paths in ``path`` are relative to (symlinked directories resolved,
    so a sweep reached through a link gives the same absolute paths, hence the same run keys)."""
    return path.absolute().parent.resolve()


def _check_base(path: Path, where: str) -> None:
    """``base:`` names a run config YAML: its top-level keys are the run config's sections. A sweep
    file there (a common slip: ``extends`` composes sweeps) is named as such."""
    raw = read_yaml(path)
    sections = [f.name for f in dataclasses.fields(Config)]
    foreign = [k for k in raw if k not in sections]
    if not foreign:
        return
    sweep_keys = [k for k in foreign if k in TOP_KEYS]
    what = (f"{path} is a sweep file (it has {', '.join(map(repr, sweep_keys[:3]))}; a sweep builds on another "
            "with extends:)" if sweep_keys else f"{path} has the key {foreign[0]!r}")
    raise ConfigError(f"{where}: base", f"{what}; expected a run config YAML (keys {', '.join(sections)})")


def _absolute(value: str, directory: Path) -> str:
    return value if os.path.isabs(value) else os.path.normpath(directory / value)


def _layers(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], Path]:
    """The sweep at ``path`` with the sweeps it extends merged under it, each file checked and its
    paths made absolute; and the directory a relative data.path of the base config is relative to."""
    raw = read_yaml(path)
    directory = _directory(path)
    extends = raw.get("extends")
    if extends is None:
        return raw, directory
    where = f"{path}: extends"
    if not isinstance(extends, str) or not extends:
        raise ConfigError(where, f"expected a path to a sweep YAML, got {extends!r}")
    parent_path = Path(_absolute(extends, directory))
    seen = [*chain, path.absolute().resolve()]
    if parent_path.resolve() in seen:
        cycle = " -> ".join(str(p) for p in [*seen, parent_path.resolve()])
        raise ConfigError(where, f"sweeps extend each other in a cycle ({cycle}); expected a chain that ends")
    if not parent_path.is_file():
        raise ConfigError(where, f"sweep {parent_path} not found")
    parent_raw, parent_root = _layers(parent_path, tuple(seen))
    parent = _check(parent_raw, str(parent_path), _directory(parent_path), parent=True)
    merged = {k: v for k, v in parent.items() if k not in OWN_KEYS and v is not None}
    merged["launch"] = {k: v for k, v in parent["launch"].items() if k != "output"}
    for key, value in raw.items():
        if value is None:
            continue  # a key written with no value keeps the parent's
        below = merged.get(key)
        if key == "branches" and isinstance(below, dict) and isinstance(value, dict):
            below = _without_other_cooldown(below, value)
        merged[key] = {**below, **value} if key in MERGED_KEYS and isinstance(below, dict) and isinstance(
            value, dict) else value
    names_base = raw.get("base") is not None or parent["base"] is None
    return merged, directory if names_base else parent_root


def _without_other_cooldown(below: dict[str, Any], written: dict[str, Any]) -> dict[str, Any]:
    """An inherited ``branches:`` less the cooldown's other form where a file gives one (a share
    replaces an inherited length, a length an inherited share)."""
    for mine, other in (("cooldown", "cooldown_length"), ("cooldown_length", "cooldown")):
        if mine in written:
            below = {k: v for k, v in below.items() if k != other}
    return below


def _check(raw: dict[str, Any], where: str, directory: Path, *, parent: bool) -> dict[str, Any]:
    """Check one sweep file's keys (or a merged chain's) and return them normalised: every
    section present, relative paths made absolute against ``directory``. A ``parent`` (a file
    another extends) may have no source of runs."""
    for key in raw:
        if key not in TOP_KEYS:
            raise unknown_key(key, TOP_KEYS, f"{where}: ", "sweep key")
    _check_safe(raw, where)
    keys = config_keys()
    out: dict[str, Any] = {}

    if "name" in raw:
        name = out["name"] = raw["name"]
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ConfigError(f"{where}: name", f"expected letters, digits, '.', '_' or '-', got {name!r}")
    if "experiment" in raw:
        experiment = out["experiment"] = raw["experiment"]
        if not isinstance(experiment, str) or not experiment.strip():
            raise ConfigError(f"{where}: experiment", f"expected a non-empty string, got {experiment!r}")
    if raw.get("extends") is not None:
        out["extends"] = raw["extends"]  # read by _layers
    out["base"] = base = raw.get("base")
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{where}: base", f"expected a path to a run config YAML, got {base!r}")
        out["base"] = _absolute(base, directory)
        if not Path(out["base"]).is_file():
            found = "is not a file" if Path(out["base"]).exists() else "not found"
            raise ConfigError(f"{where}: base", f"run config {out['base']} {found}; expected a run config YAML")
        _check_base(Path(out["base"]), where)

    out["set"] = settings = _mapping(raw.get("set"), f"{where}: set")
    for key in settings:
        _check_key(key, keys, f"{where}: set")
    _anchor(settings, directory)

    out["grid"] = grid = _mapping(raw.get("grid"), f"{where}: grid")
    for key, values in grid.items():
        _check_key(key, keys, f"{where}: grid")
        grid[key] = _values(values, key, directory, f"{where}: grid.{key}")

    out["zip"] = zips = []
    for i, group in enumerate(_list(raw.get("zip"), f"{where}: zip")):
        group = _mapping(group, f"{where}: zip[{i}]")
        if not group:
            raise ConfigError(f"{where}: zip[{i}]", "empty zip group; expected {key: [values], ...}")
        for key, values in group.items():
            _check_key(key, keys, f"{where}: zip[{i}]")
            group[key] = _values(values, key, directory, f"{where}: zip[{i}].{key}")
        lengths = {key: len(values) for key, values in group.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise ConfigError(f"{where}: zip[{i}]", f"conflicting lengths ({detail}); zipped axes pair "
                              "values one to one, so they need the same number of values")
        zips.append(group)

    axis_keys = [*grid] + [k for g in zips for k in g]
    repeated = sorted({k for k in axis_keys if axis_keys.count(k) > 1})
    if repeated:
        raise ConfigError(f"{where}: {repeated[0]}", "is swept by more than one axis (grid/zip); sweep it once")

    out["runs"] = runs = []
    for i, run in enumerate(_list(raw.get("runs"), f"{where}: runs")):
        run = _mapping(run, f"{where}: runs[{i}]")
        for key, value in run.items():
            _check_key(key, keys, f"{where}: runs[{i}]")
            run[key] = _point_value(value, key, f"{where}: runs[{i}].{key}")
        _anchor(run, directory)
        runs.append(run)

    out["tune"] = tune = _mapping(raw.get("tune"), f"{where}: tune")
    for key, values in tune.items():
        _check_key(key, keys, f"{where}: tune")
        if key in UNTUNABLE:
            raise ConfigError(f"{where}: tune.{key}", f"{UNTUNABLE[key]}; expected a setting to tune, such as "
                              "train.lr or train.warmup_steps")
        owner = "an axis (grid/zip)" if key in axis_keys else "a run" if any(key in r for r in runs) else None
        if owner is not None:
            raise ConfigError(f"{where}: tune.{key}", f"is also swept by {owner}; a setting is either an axis "
                              "of the study or tuned within each of its cells")
        tune[key] = _values(values, key, directory, f"{where}: tune.{key}")
        rules = [i for i, v in enumerate(tune[key]) if isinstance(v, dict)]
        if rules:
            raise ConfigError(f"{where}: tune.{key}[{rules[0]}]", "expected a plain value; a tuning grid holds "
                              "the values tried, not derive rules")
        if len({str(v) for v in tune[key]}) != len(tune[key]):
            raise ConfigError(f"{where}: tune.{key}", f"repeats a value: {tune[key]}")

    out["seeds"] = seeds = raw.get("seeds")
    if seeds is not None:
        if not (_is_int(seeds) and seeds > 0 or isinstance(seeds, list) and seeds
                and all(_is_int(s) and s >= 0 for s in seeds)):
            raise ConfigError(f"{where}: seeds", f"expected a count or a non-empty list of integers >= 0, got {seeds!r}")
        if SEED_KEY in axis_keys or any(SEED_KEY in r for r in runs):
            raise ConfigError(f"{where}: seeds", "train.seed is also set by an axis or a run; set seeds in one place")

    for which in ("include", "exclude"):
        out[which] = patterns = []
        for i, pattern in enumerate(_list(raw.get(which), f"{where}: {which}")):
            pattern = _mapping(pattern, f"{where}: {which}[{i}]")
            if not pattern:
                raise ConfigError(f"{where}: {which}[{i}]", "empty pattern; expected {key: value or [values]}")
            for key, value in pattern.items():
                _check_key(key, keys, f"{where}: {which}[{i}]")
                pattern[key] = [_absolute(v, directory) if key == DATA_PATH and isinstance(v, str) else v
                                for v in (value if isinstance(value, list) else [value])]
            patterns.append(pattern)

    out["derive"] = derive = _mapping(raw.get("derive"), f"{where}: derive")
    for key, rule in derive.items():
        _check_key(key, keys, f"{where}: derive")
        if key in axis_keys or key in settings or key in tune or any(key in r for r in runs):
            raise ConfigError(f"{where}: derive.{key}", "is also set by set/grid/zip/runs/tune; a value is either "
                              "given or derived")
        derive[key] = check_rule(rule, key, f"{where}: derive.{key}")

    out["launch"] = launch = _launch(raw.get("launch"), directory, where)
    evals = decode(EvalSettings, raw.get("eval") or {}, "eval", source=where, noun="eval setting",
                   expected="a mapping")
    # only what it writes (a child's merge over its parent's), as plain data (checked again when merged)
    out["eval"] = {key: (list(v) if isinstance(v := getattr(evals, key), tuple) else v) for key in raw.get("eval") or {}}
    out["branches"] = None
    if raw.get("branches") is not None:  # only what it writes, as plain data (a child's merges over its parent's)
        branches = _branches(raw["branches"], where, complete=False)
        out["branches"] = {key: (list(v) if isinstance(v := getattr(branches, key), tuple) else v)
                           for key in raw["branches"]}
        if tune:
            raise ConfigError(f"{where}: branches", "cooldown branches of a tuned sweep are not supported yet; "
                              "expected a sweep with either tune or branches")
    _check_count(out, launch.get("max_runs", LaunchSettings().max_runs), where)
    if isinstance(seeds, list) and len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}: seeds", f"repeats a seed: {seeds}")
    if not parent and not grid and not zips and not runs and not tune:
        raise ConfigError(f"{where}: grid", "empty sweep: give at least one of grid, zip, runs or tune")
    return out


def _check_count(sections: dict[str, Any], max_runs: int, where: str) -> None:
    """Refuse a sweep whose axes multiply to more than ``max_runs`` runs, from their lengths alone
    (include/exclude and the per-kind collapse can only lower the count)."""
    factors: dict[str, int] = {f"grid.{k}": len(v) for k, v in sections["grid"].items()}
    factors |= {f"zip[{i}]": len(next(iter(g.values()))) for i, g in enumerate(sections["zip"])}
    points = (math.prod(factors.values()) if factors else 0) + len(sections["runs"])
    tuned = {f"tune.{k}": len(v) for k, v in sections["tune"].items()}
    points *= math.prod(tuned.values()) if tuned else 1
    factors |= tuned
    seeds = sections["seeds"]
    factors["runs"] = len(sections["runs"])
    factors["seeds"] = seeds if isinstance(seeds, int) else len(seeds) if seeds is not None else 1
    branches = sections.get("branches") or {}
    factors["branches"] = 1 + len(branches.get("steps") or branches.get("tokens") or ())  # each run and its branches
    total = points * factors["seeds"] * factors["branches"]
    if total > max_runs:
        biggest = max(factors, key=lambda k: factors[k])
        count = f"{total:,}" if total < 10**15 else f"{total:.3g}"
        raise ConfigError(f"{where}: {biggest}", f"the sweep expands to {count} runs ({biggest} has "
                          f"{factors[biggest]:,} values), more than launch.max_runs = {max_runs:,}; sweep fewer "
                          "values, or raise launch.max_runs")


def _overrides(spec: SweepSpec, items: Sequence[str]) -> dict[str, Any]:
    """``--set a.b=c`` for every run: a run config key that no axis, run, seed list or derive
    rule of the sweep sets; a relative data.path is relative to the working directory."""
    keys = config_keys()
    out: dict[str, Any] = {}
    for item in items:
        key, value = parse_override(item)
        if key not in keys:
            raise ConfigError("set", f"{key}: unknown config key{did_you_mean(key, keys)}; expected a dotted run "
                              "config key such as model.size or train.lr")
        if key == DATA_PATH and isinstance(value, str):
            value = _absolute(value, Path.cwd())
        out[key] = value
    _check_safe(out, "set")
    owners = {k: f"the grid of {spec.path}" for k in spec.grid}
    owners |= {k: f"zip[{i}] of {spec.path}" for i, g in enumerate(spec.zip) for k in g}
    owners |= {k: f"runs[{i}] of {spec.path}" for i, r in reversed(list(enumerate(spec.runs))) for k in r}
    owners |= {k: f"derive in {spec.path}" for k in spec.derive}
    owners |= {k: f"the tuning grid (tune) of {spec.path}" for k in spec.tune}
    if spec.seeds is not None:
        owners[SEED_KEY] = f"seeds in {spec.path}"
    for key in out:
        if key in owners:
            raise ConfigError("set", f"{key} is set by {owners[key]}; --set applies to every run, so it cannot "
                              "replace it (select runs with --only, or write a sweep that extends this one)")
    return out


def _branches(raw: Any, where: str, *, complete: bool = True) -> BranchSettings:
    """The ``branches:`` section, decoded; ``complete``: the whole of it (a merged chain's), whose
    budgets are checked too."""
    settings = decode(BranchSettings, raw, "branches", source=where, noun="branches setting", expected="a mapping")
    if complete:
        check_settings(settings, where)
    else:
        check_written(raw, where)
    return settings


def _launch(raw: Any, directory: Path, where: str) -> dict[str, Any]:
    """The launch settings ``raw`` writes (only those: a child merges them over its parent's),
    checked, with relative paths made absolute against ``directory``."""
    settings = decode(LaunchSettings, raw, "launch", source=where, noun="launch setting", expected="a mapping")
    data = {key: getattr(settings, key) for key in raw or {}}
    if isinstance(data.get("output"), str):
        data["output"] = _absolute(data["output"], directory)
    profile = data.get("profile")
    if isinstance(profile, str) and (profile.endswith((".yaml", ".yml")) or "/" in profile):
        data["profile"] = _absolute(profile, directory)  # a path; otherwise a profile name
    return data


def _anchor(values: dict[str, Any], directory: Path) -> None:
    """Make a relative data.path among ``values`` absolute against ``directory``."""
    if isinstance(values.get(DATA_PATH), str):
        values[DATA_PATH] = _absolute(values[DATA_PATH], directory)


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
        raise ConfigError(f"{where}.{key}", f"unknown config key{did_you_mean(str(key), keys)}; expected a dotted "
                          "run config key such as model.size, model.attention.kind or train.lr")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(raw: Any, where: str) -> dict[str, Any]:
    """A mapping (a copy; nothing written means an empty one)."""
    return decode_value(dict[str, Any], raw, where)


def _list(raw: Any, where: str) -> list[Any]:
    """A list (a copy; nothing written means an empty one)."""
    return decode_value(list[Any], raw, where)


def _values(raw: Any, key: str, directory: Path, where: str) -> list[Any]:
    """An axis: a non-empty list of values (a relative data.path made absolute; rules checked)."""
    if not isinstance(raw, list):
        raise ConfigError(where, f"expected a list of values, got {raw!r}")
    if not raw:
        raise ConfigError(where, "empty list of values: an axis needs at least one value")
    values = [_point_value(v, key, f"{where}[{i}]") for i, v in enumerate(raw)]
    return [_absolute(v, directory) if key == DATA_PATH and isinstance(v, str) else v for v in values]


def _point_value(value: Any, key: str, where: str) -> Any:
    """A grid, zip or runs value: plain, or a mapping that must be a derive rule for this point."""
    return check_rule(value, key, where) if isinstance(value, dict) else value
