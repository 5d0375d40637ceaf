"""DIFF V1's λ_init as a typed value: parsed once from its config spelling, then asked for per layer.

The config keeps the string (``exp_decay`` or ``constant:<value>``; it is what YAML, run keys and
MLflow see); ``LambdaInit.parse`` turns it into this value once (cached), and the model, the
summaries and validation use the value. Pure Python, no torch.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from diffsweep.config.enums import LambdaInitStrategy
from diffsweep.config.errors import ConfigError

KEY = "model.attention.lambda_init"
_FORMS = "[exp_decay, constant:<value in (0, 1)>]"


def exp_decay(layer: int, value: float | None = None) -> float:
    """Paper §2.1: λ_init = 0.8 − 0.6·exp(−0.3·(l − 1)) for layer l = 1..L."""
    return 0.8 - 0.6 * math.exp(-0.3 * (layer - 1))


def constant(layer: int, value: float | None = None) -> float:
    """Table 6 ablation: the same λ_init (e.g. 0.8 or 0.5) in every layer."""
    assert value is not None, "constant λ_init needs a value (checked when parsed)"
    return value


# The one registry from strategy to its function of the 1-based layer index.
LAMBDA_INIT: dict[LambdaInitStrategy, Callable[[int, float | None], float]] = {
    LambdaInitStrategy.EXP_DECAY: exp_decay,
    LambdaInitStrategy.CONSTANT: constant,
}


@dataclass(frozen=True)
class LambdaInit:
    """A parsed ``lambda_init``: its strategy and, for ``constant``, the value in (0, 1)."""

    strategy: LambdaInitStrategy
    value: float | None = None

    @staticmethod
    def parse(text: str, key: str = KEY) -> LambdaInit:
        """Parse ``exp_decay`` or ``constant:<value>``; a ``ConfigError`` naming ``key`` otherwise."""
        return _parse(str(text), key)

    def for_layer(self, layer: int) -> float:
        """λ_init of 1-based ``layer``."""
        return LAMBDA_INIT[self.strategy](layer, self.value)

    def schedule(self, n_layers: int) -> list[float]:
        """λ_init for layers 1..n_layers."""
        return [self.for_layer(layer) for layer in range(1, n_layers + 1)]

    def __str__(self) -> str:
        """The canonical spelling (what a resolved config stores)."""
        return self.strategy.value if self.value is None else f"{self.strategy.value}:{self.value!r}"


@functools.lru_cache(maxsize=256)  # the same few spellings are parsed for every layer and run
def _parse(text: str, key: str) -> LambdaInit:
    name, sep, arg = text.partition(":")
    try:
        strategy = LambdaInitStrategy(name.strip())
    except ValueError:
        raise ConfigError(key, f"expected one of {_FORMS}, got {text!r}") from None
    if strategy is LambdaInitStrategy.EXP_DECAY:
        if sep:
            raise ConfigError(key, f"exp_decay takes no value; expected one of {_FORMS}, got {text!r}")
        return LambdaInit(strategy)
    try:
        value = float(arg)
    except ValueError:
        raise ConfigError(key, f"expected one of {_FORMS}, got {text!r}") from None
    if not 0.0 < value < 1.0:  # paper §2.1: lambda_init in (0, 1)
        raise ConfigError(key, f"constant value must be in (0, 1) (paper §2.1), got {value}")
    return LambdaInit(strategy, value)
