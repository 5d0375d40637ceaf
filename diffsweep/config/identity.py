"""A run's identity: a short hash of the resolved config fields that change what is trained.

Fields that only change how often something is logged, evaluated or saved, or which kernel
computes attention, are not part of it: changing them continues the same run.
"""

from __future__ import annotations

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
    "train.spike_threshold",
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


def run_key(config: Config) -> str:
    """12 hex digits identifying the run of a resolved config."""
    fields = {k: v for k, v in flatten(to_dict(config)).items() if k not in NOT_IDENTITY}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def run_name(config: Config) -> str:
    """A readable, unique name: ``<size>-<kind>-seed<seed>-<run key>``."""
    size = config.model.size or "custom"
    return f"{size}-{config.model.attention.kind.value}-seed{config.train.seed}-{run_key(config)}"
