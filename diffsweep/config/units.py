"""Counts of parameters, tokens and FLOPs as people write them (1.31M, 11B), and sizes in bytes as
people type them (256M, 1G)."""

from __future__ import annotations

import math

from diffsweep.config.errors import ConfigError

BYTE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
INT64_MAX = 2**63 - 1


def parse_bytes(text: str, key: str) -> int:
    """``'256M'`` -> bytes (suffixes K, M, G, T: powers of 1024; a trailing B is allowed).

    Raises ``ConfigError(key, ...)`` for anything that is not a finite positive size that fits in
    64 bits (``nanM``, ``infG``, ``-1K``, ``1e30T``).
    """
    number, unit = text.strip().rstrip("Bb"), ""
    if number and number[-1].upper() in BYTE_UNITS:
        number, unit = number[:-1], number[-1].upper()
    try:
        size = float(number) * BYTE_UNITS[unit]
    except ValueError:
        raise ConfigError(key, f"expected a size such as 256M or 1G, got {text!r}") from None
    if not math.isfinite(size):
        raise ConfigError(key, f"expected a finite size such as 256M or 1G, got {text!r}")
    if size > INT64_MAX:
        raise ConfigError(key, f"expected a size of at most 2**63 - 1 bytes (8E), got {text!r}")
    if size < 1:
        raise ConfigError(key, f"expected a positive size, got {text!r}")
    return int(size)


def human(n: float) -> str:
    """``1_310_000 -> '1.31M'`` (3 significant digits, K to E)."""
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"
