"""Derived values: a run config value computed from the rest of that run's resolved config.

Each rule is a StrEnum member with one implementation in ``RULES`` (a new rule is one entry).
In a sweep file::

    derive:
      model.ffn_hidden: {rule: param_parity}                   # FFN size matching the transformer's count
      train.max_tokens: {rule: tokens_per_param, ratio: 20}    # D = ratio x N (total params)
      train.eval_every: {rule: steps_for_tokens, tokens: 40e9} # an evaluation every 40B tokens
      train.lr: {rule: lookup, by: model.size, table: {830M: 1.5e-4, 6.8B: 7.5e-5}}
      train.warmup_steps: {rule: scale, factor: 0.5}           # half the value the run has without it

Rules run in the order written, each on the config as resolved after the previous ones. A rule
may also be one point's value in a grid, zip or runs entry (e.g. Table 6's head dims, as
multiples of the size's own: ``model.attention.head_dim: {rule: scale, factor: 2}``); such
rules run first, in the order written, then ``derive``'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from diffsweep.config import AttentionConfig, Config, ConfigError, ModelConfig, ResolvedConfig, to_dict
from diffsweep.config.enums import TRANSFORMER
from diffsweep.config.identity import flatten
from diffsweep.model import counting


class DeriveRule(StrEnum):
    """How a derived value is computed."""

    TOKENS_PER_PARAM = "tokens_per_param"  # ratio x total params, rounded to whole batches
    STEPS_FOR_TOKENS = "steps_for_tokens"  # ceil(tokens / train.batch_tokens)
    LOOKUP = "lookup"  # a table keyed by another config value (e.g. lr by model.size)
    PARAM_PARITY = "param_parity"  # the model.ffn_hidden that matches the transformer's param count
    SCALE = "scale"  # factor x the value the run has without the rule (size preset, base, set, --set)


ARGS: dict[DeriveRule, dict[str, type | tuple[type, ...]]] = {
    DeriveRule.TOKENS_PER_PARAM: {"ratio": (int, float)},
    DeriveRule.STEPS_FOR_TOKENS: {"tokens": (int, float)},
    DeriveRule.LOOKUP: {"by": str, "table": dict},
    DeriveRule.PARAM_PARITY: {},
    DeriveRule.SCALE: {"factor": (int, float)},
}


# Which keys each rule may derive (None: any key, e.g. a lookup table).
TARGETS: dict[DeriveRule, tuple[str, ...] | None] = {
    DeriveRule.TOKENS_PER_PARAM: ("train.max_tokens",),
    DeriveRule.STEPS_FOR_TOKENS: ("train.max_steps", "train.warmup_steps", "train.eval_every",
                                  "train.checkpoint_every", "train.log_every"),
    DeriveRule.LOOKUP: None,
    DeriveRule.PARAM_PARITY: ("model.ffn_hidden",),
    DeriveRule.SCALE: None,
}


def check_rule(raw: Any, key: str, where: str) -> dict[str, Any]:
    """Check a ``{rule: ..., <args>}`` mapping; returns it with the rule as a ``DeriveRule``."""
    if not isinstance(raw, dict) or "rule" not in raw:
        raise ConfigError(where, f"expected {{rule: <one of {', '.join(r.value for r in DeriveRule)}>, ...}}, got {raw!r}")
    try:
        rule = DeriveRule(raw["rule"])
    except ValueError:
        raise ConfigError(f"{where}.rule", f"expected one of [{', '.join(r.value for r in DeriveRule)}], "
                          f"got {raw['rule']!r}") from None
    args = {k: v for k, v in raw.items() if k != "rule"}
    wanted = ARGS[rule]
    for name in args:
        if name not in wanted:
            raise ConfigError(f"{where}.{name}", f"unknown argument for rule {rule.value}; expected "
                              f"[{', '.join(wanted) or 'no arguments'}]")
    for name, tp in wanted.items():
        value = args.get(name)
        if isinstance(value, str) and tp == (int, float):
            try:  # YAML 1.1 reads 40e9 (no dot) as a string
                value = args[name] = float(value)
            except ValueError:
                pass
        if value is None or isinstance(value, bool) or not isinstance(value, tp):
            raise ConfigError(f"{where}.{name}", f"rule {rule.value} needs {name}, got {value!r}")
        if isinstance(value, (int, float)) and tp == (int, float) and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{where}.{name}", f"expected a finite positive number, got {value!r}")
    targets = TARGETS.get(rule)
    if targets is not None and key not in targets:
        raise ConfigError(where, f"rule {rule.value} derives [{', '.join(targets)}], not {key}")
    return {"rule": rule, **args}


def derive_value(rule: dict[str, Any], key: str, config: ResolvedConfig, where: str) -> Any:
    """The value of ``key`` for the resolved ``config`` under ``rule`` (checked by ``check_rule``)."""
    return RULES[rule["rule"]](rule, key, config, where)


def _tokens_per_param(rule: dict[str, Any], key: str, config: ResolvedConfig, where: str) -> int:
    tokens = rule["ratio"] * counting.num_params(config.model)
    batch = config.train.batch_tokens
    return max(1, round(tokens / batch)) * batch  # whole optimizer steps


def _steps_for_tokens(rule: dict[str, Any], key: str, config: ResolvedConfig, where: str) -> int:
    return max(1, math.ceil(rule["tokens"] / config.train.batch_tokens))


def _lookup(rule: dict[str, Any], key: str, config: ResolvedConfig, where: str) -> Any:
    flat = flatten(to_dict(config))
    by = rule["by"]
    if by not in flat:
        raise ConfigError(f"{where}.by", f"unknown config key {by!r}")
    value = str(flat[by])
    table = {str(k): v for k, v in rule["table"].items()}
    if value not in table:
        raise ConfigError(f"{where}.table", f"no entry for {by} = {value}; the table has [{', '.join(table)}]")
    return table[value]


def _param_parity(rule: dict[str, Any], key: str, config: ResolvedConfig, where: str) -> int | None:
    if key != "model.ffn_hidden":
        raise ConfigError(where, "rule param_parity derives model.ffn_hidden only")
    if config.model.attention.kind == TRANSFORMER:
        return config.model.ffn_hidden
    from diffsweep.config.validate import resolve  # the baseline: same model, transformer attention

    a = config.model.attention
    model = {f.name: getattr(config.model, f.name) for f in dataclasses.fields(ModelConfig)}
    model["attention"] = AttentionConfig(kind=TRANSFORMER, backend=a.backend, head_dim=a.head_dim,
                                         kv_group_size=a.kv_group_size)
    baseline = resolve(Config(model=ModelConfig(**model), train=config.train, data=config.data))
    target = counting.num_params(baseline.model)
    per_unit = 3 * config.model.d_model * config.model.n_layers  # SwiGLU params per unit of hidden size
    return config.model.ffn_hidden + round((target - counting.num_params(config.model)) / per_unit)


def _scale(rule: dict[str, Any], key: str, config: ResolvedConfig, where: str) -> int | float:
    value = flatten(to_dict(config)).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(where, f"rule scale multiplies a number, but {key} is {value!r}")
    scaled = rule["factor"] * value
    if isinstance(value, float):
        return scaled
    if not float(scaled).is_integer():  # an integer key (a head dim, a step count) stays one
        raise ConfigError(where, f"{rule['factor']} x {key} = {rule['factor']} x {value} = {scaled} is not a whole "
                          "number; expected a factor that gives one")
    return int(scaled)


RULES: dict[DeriveRule, Callable[[dict[str, Any], str, ResolvedConfig, str], Any]] = {
    DeriveRule.TOKENS_PER_PARAM: _tokens_per_param,
    DeriveRule.STEPS_FOR_TOKENS: _steps_for_tokens,
    DeriveRule.LOOKUP: _lookup,
    DeriveRule.PARAM_PARITY: _param_parity,
    DeriveRule.SCALE: _scale,
}
