"""Typed configs, enums, strict YAML loading and the size table. Imports no torch."""

from diffsweep.config.enums import (
    AttentionKind,
    Backend,
    Compile,
    HeadNorm,
    LambdaInitStrategy,
    LRSchedule,
    Parallel,
    Precision,
    TokenizerKind,
    V2Lambda,
    V2Pairing,
)
from diffsweep.config.errors import ConfigError, ConfigWarning, EnvironmentUnavailable
from diffsweep.config.loading import config_from_dict, declared_config, dump_yaml, load_config, load_declared, to_dict
from diffsweep.config.schema import (
    AttentionConfig,
    Config,
    DataConfig,
    ModelConfig,
    ResolvedAttention,
    ResolvedConfig,
    ResolvedModel,
    TrainConfig,
)
from diffsweep.config.sizes import SIZES

__all__ = [
    "SIZES",
    "AttentionConfig",
    "AttentionKind",
    "Backend",
    "Compile",
    "Config",
    "ConfigError",
    "ConfigWarning",
    "DataConfig",
    "EnvironmentUnavailable",
    "HeadNorm",
    "LRSchedule",
    "LambdaInitStrategy",
    "ModelConfig",
    "Parallel",
    "Precision",
    "ResolvedAttention",
    "ResolvedConfig",
    "ResolvedModel",
    "TokenizerKind",
    "TrainConfig",
    "V2Lambda",
    "V2Pairing",
    "config_from_dict",
    "declared_config",
    "dump_yaml",
    "load_config",
    "load_declared",
    "to_dict",
]
