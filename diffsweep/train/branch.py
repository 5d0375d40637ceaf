"""Cooldown branches: a run that starts from another run's checkpoint.

With a warmup-stable-decay schedule (``train.schedule: wsd``) the learning rate of the stable phase
does not depend on the run's length, so a run of D tokens that decays over its last 20% follows, up
to the start of its decay, exactly the steps of any longer WSD run of the same config. A *branch*
takes those steps from the longer run (its *parent*): it starts from the parent's checkpoint at
the step where its own decay begins (model, optimizer, data position, random state and spike
counters) and trains only its cooldown, in its own run directory and MLflow run, tagged with the
parent. The result is the run it names, at the cost of its cooldown (Hägele et al. 2024,
"Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations").

``check_branch`` says whether a checkpoint can start a run: the two configs may differ only in
the schedule's length and cooldown and in cadences (``FREE``), and their learning rates must agree
on every step up to the checkpoint's. The parent's checkpoint is only read (its checksums
verified); the parent keeps training.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError, LRSchedule, ResolvedConfig, to_dict
from diffsweep.config.identity import NOT_IDENTITY, flatten
from diffsweep.tracking import tags as tag
from diffsweep.train.optim import lr_at

# What a branch may set otherwise than its parent: its length, its cooldown and how often it
# evaluates, logs and checkpoints. Everything else decides the steps they share.
# And whatever is no part of a run's identity (cadences, kernels, how processes share the work).
FREE = ("train.max_steps", "train.max_tokens", "train.decay_fraction", "train.min_lr", "train.schedule",
        *NOT_IDENTITY)


def check_branch(state: dict[str, Any], config: ResolvedConfig, path: Path) -> None:
    """Whether the checkpoint ``state`` (read from ``path``) can start a run of ``config``: the
    configs agree but for ``FREE`` keys, the checkpoint's step is before the run's end, and the two
    learning-rate schedules agree on every step up to it. Raises ``ConfigError`` naming ``path``
    and what differs."""
    mine = flatten(to_dict(config))
    theirs = flatten(state["config"])
    for key in sorted(set(mine) | set(theirs)):
        if key not in FREE and mine.get(key) != theirs.get(key):
            raise ConfigError(str(path), f"its run differs from this one in {key} ({theirs.get(key)!r} there, "
                              f"{mine.get(key)!r} here); a branch may differ from its parent only in "
                              f"{', '.join(k.removeprefix('train.') for k in FREE)}")
    step, total = int(state["step"]), config.train.total_steps
    if step >= total:
        raise ConfigError(str(path), f"is at step {step}, and this run ends at step {total}: a branch starts "
                          "before its own end")
    raw: dict[str, Any] = state["config"]["train"]
    parent = dataclasses.replace(config.train, max_steps=raw["max_steps"], max_tokens=raw["max_tokens"],
                                 decay_fraction=raw["decay_fraction"], min_lr=raw["min_lr"],
                                 schedule=LRSchedule(raw["schedule"]))
    for k in range(1, step + 1):
        if lr_at(k, parent) != lr_at(k, config.train):
            raise ConfigError(str(path), f"its run's learning rate at step {k} was {lr_at(k, parent):.6g} and "
                              f"this run's is {lr_at(k, config.train):.6g}: a branch starts from a checkpoint of "
                              "the steps the two schedules share (the parent's stable phase, before both decays)")


def branch_tags(state: dict[str, Any], path: Path) -> dict[str, str]:
    """The tags of a branch's MLflow run: its parent's run key, step and checkpoint, and MLflow's
    own parent tag, under which the UI nests the branch."""
    tags = {tag.BRANCH_PARENT_KEY: str(state["run_key"]), tag.BRANCH_STEP: str(state["step"]),
            tag.BRANCH_CHECKPOINT: str(path.absolute())}
    if state.get("mlflow_run_id"):
        tags[tag.PARENT_RUN] = str(state["mlflow_run_id"])
    return tags
