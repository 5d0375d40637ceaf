"""Expansion: a ``SweepSpec`` to a validated, deterministic list of runs. Pure (reads only the
base config file); nothing here submits, writes or imports torch.

Order of operations: points = grid x zip groups, in the order written, then ``runs`` entries;
each crossed with the ``tune`` grid, then with ``seeds``; ``include`` then ``exclude`` filters; axes that do not apply to a
point's attention kind are dropped (so they do not multiply its runs) and the points this makes
identical merge; each point's config (base, ``set``, ``--set``, the point's values, then its
own rules and ``derive``); validation with the run config rules; duplicate check by key.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffsweep.config import (
    AttentionKind,
    ConfigError,
    ConfigWarning,
    DataConfig,
    ResolvedConfig,
    config_from_dict,
    declared_config,
    to_dict,
)
from diffsweep.config.enums import TRANSFORMER
from diffsweep.config.identity import flatten, run_key
from diffsweep.config.kinds import NameToken, kind_spec, kind_specs
from diffsweep.config.loading import copy_tree, read_yaml, set_dotted
from diffsweep.model import counting
from diffsweep.sweep.branches import (
    Branch,
    BranchSettings,
    branch_config,
    check_branch_of,
    cooldown_flops,
    with_checkpoints,
)
from diffsweep.sweep.derive import derive_value
from diffsweep.sweep.spec import SweepSpec

KIND_KEY = "model.attention.kind"
SEED_KEY = "train.seed"
BUDGET_KEYS = {"train.max_tokens": "train.max_steps", "train.max_steps": "train.max_tokens"}
# Attention switches a sweep axis varies only for the kinds that use them (each kind's
# ``KindSpec.sweep_axes``): a grid over them must not multiply the other kinds' runs. The Transformer
# + per-head norm row of Table 6 is an explicit ``runs`` entry: explicit runs are never collapsed.


def kind_axes() -> dict[AttentionKind, frozenset[str]]:
    """The sweep axes each registered kind uses."""
    return {kind: spec.sweep_axes for kind, spec in kind_specs().items()}


def collapsible() -> frozenset[str]:
    """Axes some kind uses and others ignore."""
    return frozenset().union(*kind_axes().values())


# Readable name tokens of axes that are not one kind's: key -> token. Unlisted keys use their last
# component. The kinds' own tokens sit between the two groups, in kind order (``name_tokens``).
_TOKENS_BEFORE_KINDS: dict[str, NameToken] = {
    "model.attention.head_dim": NameToken("hd"),
    "model.attention.kv_group_size": NameToken("g"),
}
_TOKENS_AFTER_KINDS: dict[str, NameToken] = {
    "model.ffn_hidden": NameToken("ffn"),
    "train.lr": NameToken("lr"),
    "train.batch_tokens": NameToken("bs"),
    "train.max_tokens": NameToken("tok"),
    "train.max_steps": NameToken("steps"),
}


def name_tokens() -> dict[str, NameToken]:
    """Every named axis's token, in the order axes appear in run names."""
    tokens = dict(_TOKENS_BEFORE_KINDS)
    for spec in kind_specs().values():
        for key, token in spec.name_tokens.items():
            tokens.setdefault(key, token)  # the first kind to name a shared axis spells it
    return tokens | {k: v for k, v in _TOKENS_AFTER_KINDS.items() if k not in tokens}


@dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its identity, where it came from, and its resolved config."""

    key: str
    name: str
    origin: str  # e.g. "grid (model.size=1.4B, model.attention.kind=diff_v1)" or "runs[3]"
    config: ResolvedConfig
    values: dict[str, Any]  # the point's own axis values (after collapsing), for names and filters
    num_params: int
    num_non_embedding_params: int
    tokens: int
    flops: float  # training FLOPs: train FLOPs/token x tokens (diffsweep.model.counting conventions); a branch's cooldown's
    branch: Branch | None = None  # a cooldown branch: its parent run and branch point (diffsweep.sweep.branches)

    @property
    def kind(self) -> str:
        return self.config.model.attention.kind

    @property
    def size(self) -> str:
        return self.config.model.size or "custom"


@dataclass
class Expansion:
    """The runs of a sweep plus the config warnings met while validating them (deduplicated)."""

    runs: list[SweepRun]
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Point:
    origin: str
    values: dict[str, Any]
    collapsible: bool  # grid/zip points drop axes that do not apply to their kind


def expand(spec: SweepSpec) -> Expansion:
    """Expand ``spec`` into runs, validating each. Raises ``ConfigError`` naming the bad point.

    A relative ``data.path`` left by the base config (or the default) is made absolute against
    ``spec.data_root`` (the sweep file's directory), as the sweep's own paths already are, so a
    job finds its data from anywhere and the key does not depend on where a command runs.
    """
    base = read_yaml(spec.base) if spec.base is not None else {}
    for key, value in [*spec.set.items(), *spec.overrides.items()]:
        set_dotted(base, key, value)

    points = _points(spec)
    points = [p for p in points if _keep(p, spec, base)]
    if not points:
        raise ConfigError(f"{spec.path}: include", "the include/exclude filters leave no runs")
    points = _collapse(points, base)

    runs: list[SweepRun] = []
    seen: dict[str, str] = {}
    messages: dict[str, None] = {}
    axis_keys = _axis_keys(spec)
    for point in points:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            config = _resolve(point, base, spec)
        for w in caught:
            if issubclass(w.category, ConfigWarning):
                messages[f"{w.message} (in {point.origin})"] = None
        key = run_key(config)
        if key in seen:
            raise ConfigError(f"{spec.path}", f"duplicate run: {seen[key]} and {point.origin} resolve to the "
                              f"same config (key {key}); remove one of them")
        seen[key] = point.origin
        tokens = config.train.max_tokens or config.train.total_steps * config.train.batch_tokens
        runs.append(SweepRun(
            key=key, name=_name(config, point.values, axis_keys), origin=point.origin, config=config,
            values=point.values, num_params=counting.num_params(config.model),
            num_non_embedding_params=counting.num_non_embedding_params(config.model), tokens=tokens,
            flops=float(counting.train_flops_per_token(config.model, config.train.seq_len)) * tokens,
        ))
    if spec.branches is not None:
        runs = _with_branches(runs, spec.branches, f"{spec.path}: branches.{spec.branches.unit}", seen)
    _unique_names(runs)
    return Expansion(runs=runs, warnings=list(messages))


def _with_branches(parents: list[SweepRun], settings: BranchSettings, where: str, seen: dict[str, str]
                   ) -> list[SweepRun]:
    """Each run followed by its cooldown branches; the run checkpoints (and keeps) their branch points."""
    out: list[SweepRun] = []
    budget_key = "train.max_steps" if settings.steps else "train.max_tokens"
    for parent in parents:
        family: list[SweepRun] = []
        points: set[int] = set()
        for i, budget in enumerate(settings.budgets):
            config = branch_config(parent.config, settings, budget, f"{where}[{i}]")
            step = check_branch_of(parent.config, config, parent.name, f"{where}[{i}]")
            points.add(step)
            key = run_key(config)
            origin = f"branches.{settings.unit}[{i}] of {parent.origin}"
            if key in seen:
                raise ConfigError(f"{where}[{i}]", f"duplicate run: {seen[key]} and {origin} resolve to the same "
                                  f"config (key {key}); remove one of them")
            seen[key] = origin
            text = str(budget) if settings.steps else _human(budget)
            family.append(SweepRun(
                key=key, name=f"{parent.name}-branch_{text}", origin=origin, config=config,
                values={**parent.values, budget_key: budget}, num_params=parent.num_params,
                num_non_embedding_params=parent.num_non_embedding_params,
                tokens=config.train.max_tokens or config.train.total_steps * config.train.batch_tokens,
                flops=cooldown_flops(config, step),
                branch=Branch(parent_key=parent.key, parent_name=parent.name, step=step, budget=budget,
                              unit=settings.unit, cooldown=settings.share(budget), shape=settings.shape)))
        out.append(dataclasses.replace(parent, config=with_checkpoints(parent.config, points)))
        out += family
    return out


def _points(spec: SweepSpec) -> list[_Point]:
    axes: list[list[dict[str, Any]]] = [[{k: v} for v in values] for k, values in spec.grid.items()]
    for group in spec.zip:
        n = len(next(iter(group.values())))
        axes.append([{k: values[i] for k, values in group.items()} for i in range(n)])
    points: list[_Point] = []
    if axes:
        for combo in itertools.product(*axes):
            values: dict[str, Any] = {}
            for part in combo:
                values.update(part)
            label = ", ".join(f"{k}={v}" for k, v in values.items())
            points.append(_Point(f"grid ({label})", values, collapsible=True))
    points += [_Point(f"runs[{i}]", dict(run), collapsible=False) for i, run in enumerate(spec.runs)]
    if spec.tune:  # every point is a cell; its candidates are the tuning grid's combinations
        cells = points or [_Point("base", {}, collapsible=True)]
        combos = [dict(c) for c in itertools.product(*[[(k, v) for v in vs] for k, vs in spec.tune.items()])]
        points = [_Point(f"{p.origin} tune ({', '.join(f'{k}={v}' for k, v in c.items())})", {**p.values, **c},
                         p.collapsible) for p in cells for c in combos]
    if spec.seeds is not None:
        points = [_Point(f"{p.origin} seed {s}", {**p.values, SEED_KEY: s}, p.collapsible)
                  for p in points for s in spec.seeds]
    return points


def _effective(point: _Point, base: dict[str, Any], key: str) -> Any:
    if key in point.values:
        return point.values[key]
    node: Any = base
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _matches(point: _Point, pattern: dict[str, list[Any]], base: dict[str, Any]) -> bool:
    return all(any(_same(_value(point, base, k), v) for v in values) for k, values in pattern.items())


def _value(point: _Point, base: dict[str, Any], key: str) -> Any:
    """The point's value for ``key``: as written in the sweep, else the default (size preset applied)."""
    value = _effective(point, base, key)
    if value is not None:
        return value
    raw = copy_tree(base)
    for k, v in point.values.items():
        set_dotted(raw, k, v)
    try:
        return flatten(to_dict(declared_config(raw))).get(key)
    except ConfigError:
        return None  # validation reports it later if the point is kept


def _same(actual: Any, wanted: Any) -> bool:
    """Equal as config values: 1e-3 (YAML reads it as a string) matches 0.001, 100 matches 100.0."""
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return str(actual).lower() == str(wanted).lower()
    try:
        return float(actual) == float(wanted)
    except (TypeError, ValueError):
        return str(actual) == str(wanted)


def _keep(point: _Point, spec: SweepSpec, base: dict[str, Any]) -> bool:
    if spec.include and not any(_matches(point, pat, base) for pat in spec.include):
        return False
    return not any(_matches(point, pat, base) for pat in spec.exclude)


def _kind(point: _Point, base: dict[str, Any]) -> AttentionKind:
    value = _effective(point, base, KIND_KEY) or TRANSFORMER
    if not isinstance(value, str):
        raise ConfigError(f"{point.origin}: {KIND_KEY}", f"expected an attention kind's name, got {value!r}")
    kind_spec(value, f"{point.origin}: {KIND_KEY}")  # an unknown name lists every registered kind
    return value


def _collapse(points: list[_Point], base: dict[str, Any]) -> list[_Point]:
    """Drop axes a point's kind does not use; merge the grid points this makes identical."""
    out: list[_Point] = []
    seen: set[str] = set()
    axes = collapsible()
    for p in points:
        if p.collapsible:
            kind = _kind(p, base)
            drop = (axes - kind_spec(kind).sweep_axes) & p.values.keys()
            if drop:  # only points this made identical merge; other duplicates are reported
                p = _Point(p.origin, {k: v for k, v in p.values.items() if k not in drop}, True)
                signature = repr(sorted(p.values.items()))
                if signature in seen:
                    continue
                seen.add(signature)
        out.append(p)
    return out


def _resolve(point: _Point, base: dict[str, Any], spec: SweepSpec) -> ResolvedConfig:
    """The point's config: its plain values over ``base``, then its own rules, then ``derive``."""
    raw = copy_tree(base)
    try:
        rules = {}
        for key, value in point.values.items():
            if _is_rule(value):
                rules[key] = (value, f"{point.origin}: {key}")
            else:
                set_dotted(raw, key, value)
        _absolute_data_path(raw, spec.data_root)
        config = config_from_dict(raw)
        rules |= {key: (rule, f"{spec.path}: derive.{key}") for key, rule in spec.derive.items()}
        for key, (rule, where) in rules.items():
            set_dotted(raw, key, derive_value(rule, key, config, where))
            if key in BUDGET_KEYS:  # a derived budget replaces the other kind of budget
                set_dotted(raw, BUDGET_KEYS[key], None)
            config = config_from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(exc.key, f"{exc.message} (in {point.origin})") from None
    return config


def _is_rule(value: Any) -> bool:
    return isinstance(value, dict)  # spec checked every mapping among point values to be a rule


def _absolute_data_path(raw: dict[str, Any], root: Path) -> None:
    data = raw.setdefault("data", {})
    if not isinstance(data, dict):
        return  # decoding reports the bad section
    path = data.get("path", DataConfig().path)
    if isinstance(path, str):
        data["path"] = _absolute(path, str(root))


@functools.lru_cache(maxsize=1024)
def _absolute(path: str, root: str) -> str:
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(root, path))


def _axis_keys(spec: SweepSpec) -> list[str]:
    keys: dict[str, None] = {}
    for k in [*spec.grid, *(k for g in spec.zip for k in g), *(k for r in spec.runs for k in r), *spec.tune]:
        if k not in (KIND_KEY, "model.size", SEED_KEY):
            keys[k] = None
    order = list(name_tokens())
    return sorted(keys, key=lambda k: (order.index(k) if k in order else len(order), k))


def name_token(key: str, value: Any, tokens: dict[str, NameToken]) -> str:
    token = tokens.get(key) or NameToken(key.rsplit(".", 1)[-1])
    prefix, text = token.prefix, token.render(str(value))
    if key == "train.max_tokens" and isinstance(value, (int, float)):
        text = _human(value)
    return f"{prefix}_{re.sub(r'[^A-Za-z0-9.+]', '_', text)}"


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def _name(config: ResolvedConfig, values: dict[str, Any], axis_keys: list[str]) -> str:
    """``diff_v1-1.4B-lam_exp-gn_on-s0``: kind, size, the point's axis values (a rule's result),
    seed."""
    parts = [config.model.attention.kind, config.model.size or "custom"]
    flat = flatten(to_dict(config)) if any(_is_rule(v) for v in values.values()) else {}
    tokens = name_tokens()
    parts += [name_token(k, flat[k] if _is_rule(values[k]) else values[k], tokens) for k in axis_keys if k in values]
    parts.append(f"s{config.train.seed}")
    return "-".join(parts)


def _unique_names(runs: list[SweepRun]) -> None:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.name] = counts.get(r.name, 0) + 1
    for i, r in enumerate(runs):
        if counts[r.name] > 1:  # distinct values that spell the same; the key tells them apart
            object.__setattr__(runs[i], "name", f"{r.name}-{r.key[:6]}")


def only_pattern(only: str | None) -> re.Pattern[str]:
    """``--only``: a regular expression searched in run names and keys (None: every run). An empty
    one is refused: it would select every run (``cancel --only "$UNSET"`` would cancel them all)."""
    if only is not None and not only.strip():
        raise ConfigError("only", f"expected a regular expression matching run names or keys, got {only!r} "
                          "(leave out --only for every run)")
    try:
        return re.compile(only or "")
    except re.error as exc:
        raise ConfigError("only", f"not a valid regular expression ({exc})") from None


def select(runs: list[SweepRun], only: str | None, path: Path) -> list[SweepRun]:
    """The runs whose name or key ``only`` matches; a pattern matching none is a ``ConfigError``."""
    pattern = only_pattern(only)
    chosen = [r for r in runs if pattern.search(r.name) or pattern.search(r.key)]
    if not chosen:
        raise ConfigError("only", f"{only!r} matches no run of {path}")
    return chosen
