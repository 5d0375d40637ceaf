"""Counts of parameters, tokens and FLOPs as people write them (1.31M, 11B)."""

from __future__ import annotations


def human(n: float) -> str:
    """``1_310_000 -> '1.31M'`` (3 significant digits, K to E)."""
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"
