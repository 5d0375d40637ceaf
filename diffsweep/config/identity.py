"""A run's identity: a short hash of the resolved config fields that change what is trained.

Fields that only change how often something is logged, evaluated or saved, or which kernel
computes attention, are not part of it: changing them continues the same run.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

from diffsweep.config.loading import to_dict
from diffsweep.config.schema import Config

NOT_IDENTITY = (
    "model.attention.backend",
    "train.log_every",
    "train.eval_every",
    "train.eval_tokens",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.checkpoint_at",
    "train.spike_threshold",
    "train.parallel",
    "train.activation_checkpointing",
    "train.compile",
)


def flatten(data: dict, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def identity_fields(config: Config) -> dict[str, object]:
    """The flattened config fields a run's identity is made of (all but ``NOT_IDENTITY``)."""
    fields: dict[str, object] = {}
    for f in dataclasses.fields(config):
        fields.update(_identity_items(f.name, getattr(config, f.name)))
    return fields


def run_key(config: Config) -> str:
    """12 hex digits identifying the run of a resolved config."""
    fields = identity_fields(config)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=4096)  # sections are frozen; a sweep shares its model sections
def _identity_items(name: str, section: object) -> tuple[tuple[str, object], ...]:
    flat = flatten(to_dict(section), f"{name}.")
    return tuple((k, v) for k, v in flat.items() if k not in NOT_IDENTITY)


def run_name(config: Config) -> str:
    """A readable, unique name: ``<size>-<kind>-seed<seed>-<run key>`` (the MLflow run's name)."""
    return run_name_of(identity_fields(config), run_key(config))


def run_name_of(fields: dict[str, object], key: str) -> str:
    """``run_name`` from a run's identity fields and key (e.g. a sweep ledger's entry)."""
    size = fields.get("model.size") or "custom"
    return f"{size}-{fields.get('model.attention.kind')}-seed{fields.get('train.seed')}-{key}"
