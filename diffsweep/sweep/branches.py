"""Cooldown branches in a sweep: a token scan read off one warmup-stable-decay run per arm.

A sweep's ``branches:`` section turns every run of the sweep (a *parent*, which must use a wsd
schedule) into a family: the parent itself, and one branch per budget in ``steps`` (or
``tokens``). A branch is the WSD run of that budget whose last ``cooldown`` share of steps (or
last ``cooldown_length`` steps or tokens, the budgets' unit) decays to ``min_lr`` with the given
``shape``; up to the start of its cooldown it follows the parent step
for step, so it is trained from the parent's checkpoint at that step (its *branch point*) and costs
only its cooldown (``diffsweep.train.branch``). Its config, key and results are those of that run
trained from scratch; it records its parent and branch point. The parent checkpoints every branch
point and keeps those checkpoints (``train.checkpoint_at``).

Refused here, naming the key: a parent that is not wsd, a budget past the parent's end, a branch
point after the parent's stable phase, a cooldown that is not a share of the budget in (0, 1) (or a
length not shorter than a budget, or both ways in one file), a branch that is the parent itself. Pure: builds runs from runs. See docs/sweeps.md, 'Cooldown
branches'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from diffsweep.config import ConfigError, LRSchedule, ResolvedConfig, config_from_dict, to_dict
from diffsweep.config.decode import AtLeast, Check
from diffsweep.config.identity import run_key
from diffsweep.config.units import human
from diffsweep.model import counting

SHAPES = {"linear": LRSchedule.WSD, "sqrt": LRSchedule.WSD_SQRT, "cosine": LRSchedule.WSD_COSINE}


def _shape(value: Any, key: str) -> str:
    if value not in SHAPES:
        raise ConfigError(key, f"expected one of {', '.join(SHAPES)} (the cooldown's decay: linear, 1 - sqrt, "
                          f"cosine), got {value!r}")
    return str(value)


def _share(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(key, f"expected a share of each branch's budget in (0, 1), such as 0.2, got {value!r}")
    if not 0 < value < 1:
        longer = " (a cooldown as long as the budget or longer)" if value >= 1 else ""
        raise ConfigError(key, f"{value!r}{longer} is not a share of the budget in (0, 1); expected e.g. 0.2: "
                          "the last 20% of each branch's steps decay")
    return float(value)


@dataclass(frozen=True)
class BranchSettings:
    """A sweep's ``branches:`` section (read by ``diffsweep.config.decode``)."""

    steps: tuple[Annotated[int, AtLeast(1)], ...] = ()  # each branch's budget in steps ...
    tokens: tuple[Annotated[int, AtLeast(1)], ...] = ()  # ... or in tokens (exactly one of the two)
    cooldown: Annotated[float, Check(_share)] = 0.2  # the share of each branch's budget that decays ...
    cooldown_length: Annotated[int, AtLeast(0)] = 0  # ... or its length, in the budgets' unit (0: the share)
    shape: Annotated[str, Check(_shape)] = "linear"  # linear | sqrt (1 - sqrt) | cosine

    @property
    def unit(self) -> str:
        return "steps" if self.steps else "tokens"

    @property
    def budgets(self) -> tuple[int, ...]:
        return self.steps or self.tokens

    def share(self, budget: int) -> float:
        """The share of the branch of ``budget`` that decays: ``cooldown``, or ``cooldown_length`` of it."""
        return self.cooldown_length / budget if self.cooldown_length else self.cooldown

    @property
    def described(self) -> str:
        """``its last 20%`` or ``its last 2,000 steps``."""
        if self.cooldown_length:
            length = f"{self.cooldown_length:,}" if self.steps else human(self.cooldown_length)
            return f"its last {length} {self.unit}"
        return f"its last {self.cooldown:.0%}"


def check_settings(settings: BranchSettings, where: str) -> None:
    """What the section alone must satisfy: one kind of budget, no budget twice, a cooldown length
    shorter than every budget."""
    if bool(settings.steps) == bool(settings.tokens):
        raise ConfigError(f"{where}: branches.steps", "expected exactly one of steps and tokens: each branch's "
                          "budget, e.g. steps: [2000, 4000]")
    budgets = settings.budgets
    if len(set(budgets)) != len(budgets):
        raise ConfigError(f"{where}: branches.{settings.unit}", f"repeats a budget: {list(budgets)}")
    length = settings.cooldown_length
    for i, budget in enumerate(budgets):
        if length and length >= budget:
            raise ConfigError(f"{where}: branches.cooldown_length", f"a cooldown of {length:,} {settings.unit} is as "
                              f"long as the branch of {budget:,} (branches.{settings.unit}[{i}]) or longer; expected a "
                              "length shorter than every budget, or a share: cooldown: 0.2")


def check_written(raw: Any, where: str) -> None:
    """One file's ``branches:`` gives its cooldown one way: a share or a length, not both."""
    if isinstance(raw, dict) and "cooldown" in raw and "cooldown_length" in raw:
        raise ConfigError(f"{where}: branches.cooldown_length", "sets the cooldown's length and branches.cooldown its "
                          "share; expected one of the two")


@dataclass(frozen=True)
class Branch:
    """Where a branch comes from: its parent run and the parent's checkpoint it starts from."""

    parent_key: str
    parent_name: str
    step: int  # the branch point: the parent's checkpoint the branch starts from (its own cooldown's start)
    budget: int  # the branch's length, in ``unit``
    unit: str  # steps | tokens
    cooldown: float
    shape: str

    @property
    def label(self) -> str:
        """``from diff_v1-tiny-s-s0 at step 480, 20% linear cooldown``."""
        return f"from {self.parent_name} at step {self.step}, {self.cooldown:.0%} {self.shape} cooldown"


def branch_config(parent: ResolvedConfig, settings: BranchSettings, budget: int, where: str) -> ResolvedConfig:
    """The config of the branch of ``parent`` with ``budget`` (in ``settings.unit``), validated:
    a ``ConfigError`` on ``where`` if it is no valid run (a budget within the warmup)."""
    raw = to_dict(parent)
    raw["train"] |= {"max_steps": budget if settings.steps else None, "max_tokens": budget if settings.tokens else None,
                     "decay_fraction": settings.share(budget), "schedule": SHAPES[settings.shape].value,
                     "checkpoint_at": []}
    try:
        return config_from_dict(raw)
    except ConfigError as exc:
        raise ConfigError(where, f"the branch of {budget} {settings.unit} is no valid run ({exc.key}: {exc.message})"
                          ) from None


def with_checkpoints(config: ResolvedConfig, steps: set[int]) -> ResolvedConfig:
    """``config`` that also checkpoints (and keeps) ``steps``: a parent's branch points."""
    pins = tuple(sorted(steps | set(config.train.checkpoint_at)))  # and those the run's config asks for
    return dataclasses.replace(config, train=dataclasses.replace(config.train, checkpoint_at=pins))


def check_branch_of(parent: ResolvedConfig, branch: ResolvedConfig, parent_name: str, where: str) -> int:
    """The branch point of ``branch`` in ``parent`` (the step its cooldown starts at), or a
    ``ConfigError`` on ``where`` saying why the parent cannot give it."""
    p, b = parent.train, branch.train
    if not p.schedule.is_wsd:
        raise ConfigError(where, f"run {parent_name} has train.schedule {p.schedule.value}; a cooldown branch starts "
                          "from the stable phase of a warmup-stable-decay run: set train.schedule: wsd")
    total, start = p.total_steps, b.decay_start
    if b.total_steps > total:
        raise ConfigError(where, f"a branch of {b.total_steps} steps ends after run {parent_name} does ({total} "
                          "steps); expected budgets up to the parent's")
    if start > p.decay_start:
        raise ConfigError(where, f"the branch of {b.total_steps} steps starts its cooldown at step {start}, after "
                          f"run {parent_name}'s stable phase ends (step {p.decay_start}); a branch starts from "
                          "a checkpoint of the stable phase (shorten it, or lengthen its cooldown)")
    if start < 1:
        raise ConfigError(where, f"the branch of {b.total_steps} steps would decay from its first step: nothing "
                          f"of run {parent_name} to start from; expected a longer budget")
    if run_key(branch) == run_key(parent):
        raise ConfigError(where, f"the branch of {b.total_steps} steps is run {parent_name} itself; expected "
                          "budgets shorter than the parent's, or another cooldown")
    return start


def cooldown_flops(config: ResolvedConfig, start: int) -> float:
    """The training FLOPs of a branch: its steps after ``start`` only."""
    steps = config.train.total_steps - start
    return float(counting.train_flops_per_token(config.model, config.train.seq_len)) * steps * config.train.batch_tokens


def describe(runs: Sequence[Any], settings: BranchSettings) -> list[str]:
    """What ``plan`` prints of a sweep's branches: the rule, then each parent's family (branch points
    and cooldown cost against the separate runs it replaces)."""
    branches = [r for r in runs if r.branch is not None]
    parents = {r.key: r for r in runs if r.branch is None}
    shown = ", ".join(f"{b:,}" if settings.steps else human(b) for b in settings.budgets)
    out = [(f"cooldown branches at {shown} {settings.unit}, each decaying over {settings.described} "
           f"({settings.shape}): {len(branches)} branch(es) of {len(parents)} run(s); a branch starts from its "
           "parent's checkpoint at its branch point once the parent has saved it, and trains only its cooldown")]
    for key, parent in parents.items():
        family = [r for r in branches if r.branch.parent_key == key]
        if not family:
            continue
        cost = sum(r.flops for r in family)
        separate = sum(r.flops * r.config.train.total_steps / (r.config.train.total_steps - r.branch.step)
                       for r in family)
        points = ", ".join(f"{r.branch.budget:,}" if settings.steps else human(r.branch.budget) for r in family)
        steps = ", ".join(str(r.branch.step) for r in family)
        out.append(f"  {parent.name} ({key}): branches {points} from its steps {steps}; the family costs "
                   f"{(parent.flops + cost) / parent.flops:.2g}x its parent's FLOPs ({(parent.flops + separate) / parent.flops:.2g}x "
                   "as separate runs)")
    return out
