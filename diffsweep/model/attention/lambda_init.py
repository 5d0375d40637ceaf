"""λ_init per layer for DIFF V1 (pure Python; computed when layers are built, never in forward).

The typed value and its strategies live in ``diffsweep.config.lambda_init`` (``LambdaInit``);
these helpers take the config spelling, for callers that hold a string.
"""

from __future__ import annotations

from diffsweep.config.lambda_init import LAMBDA_INIT, LambdaInit, constant, exp_decay

__all__ = ["LAMBDA_INIT", "LambdaInit", "constant", "exp_decay", "lambda_init_for_layer", "lambda_init_schedule"]


def lambda_init_for_layer(spec: str, layer: int) -> float:
    """λ_init of 1-based ``layer`` for a config string such as ``exp_decay`` or ``constant:0.8``."""
    return LambdaInit.parse(spec).for_layer(layer)


def lambda_init_schedule(spec: str, n_layers: int) -> list[float]:
    """λ_init for layers 1..n_layers."""
    return LambdaInit.parse(spec).schedule(n_layers)
