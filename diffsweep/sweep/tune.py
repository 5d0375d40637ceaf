"""Tuned sweeps: the settings a study optimises within each of its cells.

A sweep's ``tune:`` mapping (``{train.lr: [3.0e-4, 6.0e-4, 1.2e-3]}``) is crossed with every point
of its grid, zip and runs, like another grid, and makes the same runs (same keys and names) as that
grid would. What it adds is the reading: a *cell* is one combination of the study's own axes (the
attention kind, the size, the switches: everything but the tuning axes and the seeds), and each
combination of tuning values in it, with its seeds, is a *candidate*. A study compares cells at
their best candidates (``diffsweep fit`` and ``compare``), so each architecture is compared at its
own best learning rate rather than at one shared one. Pure: groups a sweep's runs.
See docs/sweeps.md, 'Tuned sweeps'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diffsweep.sweep.expand import KIND_KEY, SEED_KEY, SweepRun, name_token, name_tokens

SIZE_KEY = "model.size"


@dataclass(frozen=True)
class Candidate:
    """One combination of tuning values in a cell, and its runs (one per seed)."""

    values: tuple[tuple[str, Any], ...]  # (tuning key, value), in the order of ``tune:``
    runs: tuple[SweepRun, ...]

    @property
    def label(self) -> str:
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={_show(v)}" for k, v in self.values)


@dataclass(frozen=True)
class Cell:
    """The runs of one combination of the study's axes: its candidates, in the tuning grid's order."""

    kind: str
    size: str
    fixed: tuple[tuple[str, Any], ...]  # the cell's other axis values (switches, head_dim, ...)
    candidates: tuple[Candidate, ...]

    @property
    def label(self) -> str:
        """``diff_v2 1.4B`` or ``diff_v1 1.4B, head_dim=256``."""
        rest = ", ".join(f"{k.rsplit('.', 1)[-1]}={_show(v)}" for k, v in self.fixed)
        return f"{self.kind} {self.size}" + (f", {rest}" if rest else "")

    @property
    def name(self) -> str:
        """As its runs are named, without the tuning values and the seed: ``diff_v1-1.4B-hd_256``."""
        tokens = name_tokens()
        return "-".join([self.kind, self.size, *(name_token(k, v, tokens) for k, v in self.fixed)])


def edges(cell: Cell, winner: Candidate) -> list[str]:
    """Where ``winner`` sits at an end of its cell's grid, per numeric tuning key tried at more than
    one value: ``lr=0.008 is the largest tried`` (the optimum may lie beyond it)."""
    out = []
    for i, (key, value) in enumerate(winner.values):
        tried = {c.values[i][1] for c in cell.candidates}
        if len(tried) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in tried):
            continue
        end = "smallest" if value == min(tried) else "largest" if value == max(tried) else None
        if end:
            out.append(f"{key.rsplit('.', 1)[-1]}={_show(value)} is the {end} tried")
    return out


def cells(runs: Sequence[SweepRun], tune: Sequence[str]) -> list[Cell]:
    """The cells of a sweep tuned over the keys ``tune`` (its ``tune:`` mapping), in run order."""
    tuned = list(tune)
    groups: dict[tuple[str, ...], tuple[tuple[str, str, tuple[tuple[str, Any], ...]], dict[str, list[SweepRun]]]] = {}
    values_of: dict[str, tuple[tuple[str, Any], ...]] = {}
    for r in runs:
        fixed = tuple((k, v) for k, v in r.values.items() if k not in (*tuned, KIND_KEY, SIZE_KEY, SEED_KEY))
        head = (r.kind, r.size, fixed)
        key = (r.kind, r.size, repr(fixed))
        candidate = tuple((k, r.values[k]) for k in tuned if k in r.values)
        groups.setdefault(key, (head, {}))[1].setdefault(repr(candidate), []).append(r)
        values_of[repr(candidate)] = candidate
    return [Cell(kind=head[0], size=head[1], fixed=head[2],
                 candidates=tuple(Candidate(values_of[c], tuple(rs)) for c, rs in by_candidate.items()))
            for head, by_candidate in groups.values()]


def describe(cells_: Sequence[Cell], tune: dict[str, list[Any]]) -> list[str]:
    """What ``plan`` prints of a tuned sweep: the tuning grid, then each cell's candidates (with
    their seeds), flagging a cell with a single candidate (untuned)."""
    grid = "; ".join(f"{k} [{', '.join(_show(v) for v in values)}]" for k, values in tune.items())
    out = [(f"tuned over {grid}: {len(cells_)} cell(s); each cell is compared at its best candidate "
            "(lowest mean validation loss over its seeds)")]
    for cell in cells_:
        seeds = {len(c.runs) for c in cell.candidates}
        per = f"{seeds.pop()} run(s) each" if len(seeds) == 1 else "runs " + "/".join(
            str(len(c.runs)) for c in cell.candidates)
        untuned = " (one candidate: untuned)" if len(cell.candidates) == 1 else ""
        out.append(f"  {cell.label}: {len(cell.candidates)} candidates ({per}): "
                   + ", ".join(c.label for c in cell.candidates) + untuned)
    return out


def to_dict(cells_: Sequence[Cell], tune: dict[str, list[Any]]) -> dict[str, Any]:
    """``plan --json``'s ``tune``: the grid and each cell's candidates with their runs' names."""
    return {"grid": tune,
            "cells": [{"cell": c.label, "kind": c.kind, "size": c.size, "fixed": dict(c.fixed),
                       "candidates": [{"values": dict(k.values), "runs": [r.name for r in k.runs]}
                                      for k in c.candidates]} for c in cells_]}


def _show(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    return str(value)
