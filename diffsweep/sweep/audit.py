"""The matched-arm audit: do the runs a fit will compare differ only in their attention kind?

An *arm* is the runs of one attention kind in one *group*: the runs that share a size label and every
other sweep axis except the kind, the kinds' own switches (``KindSpec.sweep_axes`` and ``switches``)
and the audited settings themselves. Each other kind's arm is compared with the baseline's arm of its
group (default: the first registered kind, the Transformer) on parameters, FLOPs per token, tokens,
batch tokens, the lr schedule and the seeds; an arm with several runs is compared as the set of its
values (each value of one arm against the nearest of the other's). Pure: ``audit_runs`` takes a
sweep's runs, ``audit_records`` any ``ArmRecord``s (``diffsweep fit`` builds them from its table).
Nothing here imports torch. See docs/sweeps.md, 'The arm audit: are the compared runs matched?'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from diffsweep.config import ConfigError, ResolvedConfig, to_dict
from diffsweep.config.identity import flatten
from diffsweep.config.kinds import kind_spec, kind_specs
from diffsweep.config.units import human

DEFAULT_THRESHOLD = 0.01  # relative difference in parameters or FLOPs per token that is flagged
OK_LINES = 20  # matched pairs (and groups not compared) listed in text before "... more"

# What is compared: field -> (label, config key a mismatch is fixed by, compared relatively).
FIELDS: dict[str, tuple[str, str | None, bool]] = {
    "params": ("params", "model.ffn_hidden", True),
    "non_embedding_params": ("non-embedding params", "model.ffn_hidden", True),
    "flops_per_token": ("FLOPs/token", "model.ffn_hidden", True),
    "tokens": ("tokens", "train.max_tokens", False),
    "batch_tokens": ("batch tokens", "train.batch_tokens", False),
    "lr": ("lr", "train.lr", False),
    "warmup_steps": ("warmup steps", "train.warmup_steps", False),
    "schedule": ("lr schedule", "train.schedule", False),
    "min_lr": ("min lr", "train.min_lr", False),
    "max_steps": ("max steps", "train.max_steps", False),
    "seeds": ("seeds", "train.seed", False),
}
# The compared field a tuning axis's values are (train.lr -> lr): the settings compared exactly.
_FIELD_OF_KEY = {FIELDS[name][1] or name: name for name in ("batch_tokens", "lr", "warmup_steps", "schedule",
                                                              "min_lr", "max_steps")}
# Config keys that never separate groups: the audited settings, and what each kind derives itself.
_AUDITED_KEYS = frozenset({"model.size", "model.attention.kind", "model.ffn_hidden", "model.attention.num_heads",
                           "model.attention.num_kv_heads", "model.attention.head_norm", "train.seed", "train.lr",
                           "train.warmup_steps", "train.schedule", "train.min_lr", "train.max_steps",
                           "train.max_tokens", "train.batch_tokens", "train.decay_fraction"})


@dataclass(frozen=True)
class ArmRecord:
    """One run as the audit sees it. ``values`` holds the ``FIELDS`` it knows (None: unknown, not
    compared); ``seeds`` is its ``train.seed``. ``score_flops_per_token``: the share of
    ``flops_per_token`` spent on attention scores (None: unknown, the total is compared).
    ``config``: the resolved config, when known (for the suggested settings)."""

    name: str
    kind: str
    group: str  # "1.4B" or "1.4B, head_dim=256": the runs a fit compares across kinds
    values: dict[str, Any]
    score_flops_per_token: float | None = None
    config: ResolvedConfig | None = None


@dataclass(frozen=True)
class Difference:
    """One compared setting of a candidate arm against the baseline arm of its group."""

    field: str
    baseline: list[Any]  # the baseline arm's distinct values
    candidate: list[Any]
    relative: float | None  # (candidate - baseline) / baseline, the largest over nearest pairs; relative fields
    flagged: bool
    suggestion: str | None = None  # the setting that would match it
    note: str | None = None  # why a difference is not flagged, or what no setting can match
    tuned: bool = False  # a tuning axis (the sweep's tune:): its values are the arm's tuning grid

    @property
    def label(self) -> str:
        label = FIELDS[self.field][0] if self.field in FIELDS else self.field
        return f"tuning grid of {label}" if self.tuned else label

    def describe(self) -> str:
        """'params +7.9% (1.41B vs 1.52B)', 'max steps 40000 vs 30000'."""
        if self.relative is not None:
            b, c = _show(self.baseline, human), _show(self.candidate, human)
            text = f"{self.label} {100 * self.relative:+.2f}% ({c} vs {b})"
        else:
            b, c = _show(self.baseline), _show(self.candidate)
            text = f"{self.label} {c} vs {b}" if b != c else f"{self.label} {c}"
        return text


@dataclass(frozen=True)
class Pair:
    """A candidate kind's arm and the baseline's arm in one group, every field compared."""

    group: str
    baseline: str
    candidate: str
    baseline_runs: list[str]
    candidate_runs: list[str]
    differences: list[Difference]

    @property
    def flagged(self) -> list[Difference]:
        return [d for d in self.differences if d.flagged]

    @property
    def notes(self) -> list[Difference]:
        return [d for d in self.differences if not d.flagged and d.note]


@dataclass
class Audit:
    """The audit of a set of runs: every compared pair, and the groups with nothing to compare."""

    baseline: str
    threshold: float
    pairs: list[Pair] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # "1.4B, head_dim=256: transformer only"

    @property
    def flagged(self) -> list[tuple[Pair, Difference]]:
        return [(p, d) for p in self.pairs for d in p.flagged]

    def lines(self, matched: bool = True) -> list[str]:
        """The audit as text lines: a head line, then one line per pair with differences (with the
        settings that match them), then (``matched``) the pairs that match, with their notes, and
        the groups not compared."""
        if not self.pairs:
            return [f"arm audit: nothing to compare (no size has the {self.baseline}'s runs and another kind's)"]
        flagged = self.flagged
        head = (f"arm audit (vs {self.baseline}, threshold {100 * self.threshold:g}% in params/FLOPs, any difference "
                f"in tokens, batch, lr schedule, seeds): {len(self.pairs)} pair(s), "
                f"{len({id(p) for p, _ in flagged})} with differences")
        out = [head]
        for p in self.pairs:
            if p.flagged:
                fixes = list(dict.fromkeys(d.suggestion for d in p.flagged if d.suggestion))
                notes = list(dict.fromkeys(d.note for d in p.flagged if d.note))
                out.append(f"  MISMATCH {p.group} {p.candidate}: " + "; ".join(d.describe() for d in p.flagged)
                           + (f" -> set {', '.join(fixes)}" if fixes else "") + "".join(f" ({n})" for n in notes))
        if not matched:
            return out
        matched_pairs = [p for p in self.pairs if not p.flagged]
        for p in matched_pairs[:OK_LINES]:
            shown = [d for d in p.differences if d.field in ("params", "flops_per_token")]
            out.append(f"  ok {p.group} {p.candidate}: "
                       + "; ".join(d.describe() + (f" ({d.note})" if d.note else "") for d in shown))
        if len(matched_pairs) > OK_LINES:
            out.append(f"  ... {len(matched_pairs) - OK_LINES} more matched pairs")
        out += [f"  not compared: {u}" for u in self.unpaired[:OK_LINES]]
        if len(self.unpaired) > OK_LINES:
            out.append(f"  ... {len(self.unpaired) - OK_LINES} more groups not compared")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline, "threshold": self.threshold, "flagged": len(self.flagged),
            "pairs": [{"group": p.group, "baseline": p.baseline, "candidate": p.candidate,
                       "baseline_runs": p.baseline_runs, "candidate_runs": p.candidate_runs,
                       "differences": [{"field": d.field, "baseline": d.baseline, "candidate": d.candidate,
                                        "relative": d.relative, "flagged": d.flagged, "suggestion": d.suggestion,
                                        "note": d.note} for d in p.differences]} for p in self.pairs],
            "unpaired": self.unpaired,
        }


def default_baseline() -> str:
    """The first registered kind (the Transformer)."""
    return next(iter(kind_specs()))


def records(runs: Iterable[Any], tuned: Sequence[str] = ()) -> list[ArmRecord]:
    """``ArmRecord``s of a sweep's runs (``diffsweep.sweep.SweepRun``); ``tuned``: the sweep's
    tuning axes, which do not separate groups (their values are each arm's tuning grid)."""
    switch_keys = {f"model.attention.{s}" for spec in kind_specs().values() for s in spec.switches}
    switch_keys |= {k for spec in kind_specs().values() for k in spec.sweep_axes}
    out = []
    for r in runs:
        c: ResolvedConfig = r.config
        flat: dict[str, Any] | None = None
        shared = []
        for key in r.values:
            if key in _AUDITED_KEYS or key in switch_keys or key in tuned:
                continue
            value = r.values[key]
            if isinstance(value, dict):  # a derive rule: its result
                flat = flat if flat is not None else flatten(to_dict(c))
                value = flat[key]
            shared.append(f"{key.rsplit('.', 1)[-1]}={value}")
        m, t = c.model, c.train
        per_token = r.flops / r.tokens if r.tokens else 0.0
        score = 3 * m.n_layers * kind_spec(m.attention.kind).attention_flops(m.attention, t.seq_len)
        values = {"params": r.num_params, "non_embedding_params": r.num_non_embedding_params,
                  "flops_per_token": per_token, "tokens": r.tokens, "batch_tokens": t.batch_tokens, "lr": t.lr,
                  "warmup_steps": t.warmup_steps, "schedule": t.schedule.value, "min_lr": t.min_lr,
                  "max_steps": t.max_steps, "seeds": t.seed}
        values |= {key: r.values[key] for key in tuned if key in r.values and key not in _FIELD_OF_KEY}
        out.append(ArmRecord(name=r.name, kind=r.kind, group=", ".join([r.size, *sorted(shared)]), values=values,
                             score_flops_per_token=float(score), config=c))
    return out


def audit_runs(runs: Sequence[Any], threshold: float = DEFAULT_THRESHOLD, baseline: str | None = None,
               tuned: Sequence[str] = ()) -> Audit:
    """The audit of a sweep's runs (``SweepRun``s, e.g. a plan's); ``tuned``: its tuning axes.
    Cooldown branches are their parents' shorter copies: the parents are audited."""
    parents = [r for r in runs if getattr(r, "branch", None) is None]
    return audit_records(records(parents, tuned), threshold, baseline, tuned)


def audit_records(items: Sequence[ArmRecord], threshold: float = DEFAULT_THRESHOLD,
                  baseline: str | None = None, tuned: Sequence[str] = ()) -> Audit:
    """Compare every other kind's arm with the ``baseline`` kind's arm of the same group. A tuning
    axis (``tuned``) is compared as each arm's set of values, its tuning grid: the same grid for
    every arm, or flagged."""
    if not 0 <= threshold < 1:
        raise ConfigError("audit_threshold", f"expected a relative difference in [0, 1), got {threshold}")
    baseline = baseline or default_baseline()
    audit = Audit(baseline=baseline, threshold=threshold)
    groups: dict[str, dict[str, list[ArmRecord]]] = {}
    for rec in items:
        groups.setdefault(rec.group, {}).setdefault(rec.kind, []).append(rec)
    for group, arms in groups.items():
        base = arms.get(baseline)
        others = [k for k in arms if k != baseline]
        if base is None or not others:
            audit.unpaired.append(f"{group}: {', '.join(arms)} only")
            continue
        names = [*FIELDS, *(k for k in tuned if k not in _FIELD_OF_KEY)]
        tuned_fields = {_FIELD_OF_KEY.get(k, k) for k in tuned}
        for kind in others:
            cand = arms[kind]
            diffs = [_compare(name, base, cand, threshold, name in tuned_fields) for name in names]
            audit.pairs.append(Pair(group=group, baseline=baseline, candidate=kind,
                                    baseline_runs=[r.name for r in base], candidate_runs=[r.name for r in cand],
                                    differences=[d for d in diffs if d is not None]))
    return audit


def _distinct(arm: list[ArmRecord], name: str) -> list[Any]:
    values = {r.values.get(name) for r in arm}
    return sorted(values, key=lambda v: (v is None, str(type(v)), v if v is not None else 0))


def _compare(name: str, base: list[ArmRecord], cand: list[ArmRecord], threshold: float,
             tuned: bool = False) -> Difference | None:
    b, c = _distinct(base, name), _distinct(cand, name)
    if None in b or None in c:
        return None if all(v is None for v in b + c) else Difference(name, b, c, None, False,
                                                                     note="not known for every run", tuned=tuned)
    relative_field = FIELDS[name][2] if name in FIELDS else False
    if not relative_field:
        if set(b) == set(c):
            return Difference(name, b, c, None, False, tuned=tuned)
        fix = (f"tune.{FIELDS[name][1] if name in FIELDS else name}: [{', '.join(str(v) for v in b)}] for every "
               "kind (check include/exclude)" if tuned else _exact_suggestion(name, b, cand))
        return Difference(name, b, c, None, True, suggestion=fix, tuned=tuned)
    rel = _nearest(c, b)
    flagged = abs(rel) > threshold
    note = None
    if name == "flops_per_token" and rel:
        scores = {r.score_flops_per_token for r in base + cand}
        if None in scores:  # the kinds' score FLOPs differ by design: only parameters can flag it
            flagged = False
            note = "in total, attention scores included; without a breakdown not flagged (parameters are)"
        else:
            rest = _nearest([r.values[name] - (r.score_flops_per_token or 0) for r in cand],
                            [r.values[name] - (r.score_flops_per_token or 0) for r in base])
            if flagged and abs(rest) <= threshold:
                flagged = False
                note = f"the kinds' attention scores, inherent to their math; the rest {100 * rest:+.2f}%"
            else:
                note = f"without attention scores {100 * rest:+.2f}%"
    suggestion = _parity_suggestion(cand) if flagged else None
    if flagged and suggestion is None and all(r.config is not None for r in cand):
        note = (note + "; " if note else "") + "no FFN size matches it: the arms differ in other settings"
    return Difference(name, b, c, rel, flagged, suggestion=suggestion, note=note)


def _nearest(cand: list[float], base: list[float]) -> float:
    """The largest relative difference between a value of one arm and the nearest value of the
    other (either way round), signed as candidate minus baseline."""
    worst = 0.0
    for v in cand:
        ref = min(base, key=lambda b: abs(v - b))
        worst = max(worst, (v - ref) / ref if ref else 0.0, key=abs)
    for ref in base:
        v = min(cand, key=lambda c: abs(c - ref))
        worst = max(worst, (v - ref) / ref if ref else 0.0, key=abs)
    return worst


def _parity_suggestion(cand: list[ArmRecord]) -> str | None:
    """``model.ffn_hidden=N (derive: {rule: param_parity})``: the FFN size the sweep grammar's
    ``param_parity`` rule gives the candidate's runs, where it changes it (None: it does not)."""
    from diffsweep.sweep.derive import DeriveRule, derive_value

    sizes: dict[int, None] = {}
    seen: set[Any] = set()
    for r in cand:
        if r.config is None:
            return None
        if r.config.model in seen:
            continue
        seen.add(r.config.model)
        parity = derive_value({"rule": DeriveRule.PARAM_PARITY}, "model.ffn_hidden", r.config, "audit")
        if parity != r.config.model.ffn_hidden:
            sizes[parity] = None
    if not sizes:
        return None
    value = ", ".join(str(s) for s in sizes)
    return f"model.ffn_hidden={value} (or in the sweep: derive: {{model.ffn_hidden: {{rule: param_parity}}}})"


def _exact_suggestion(name: str, base: list[Any], cand: list[ArmRecord]) -> str:
    key = FIELDS[name][1]
    values = ", ".join(str(v) for v in base)
    if name == "seeds":
        return f"seeds: [{values}] for both kinds"
    if name == "tokens":
        configs = [r.config for r in cand if r.config is not None]
        if configs and all(c.train.max_tokens is None for c in configs) and len(base) == 1:
            batch = {c.train.batch_tokens for c in configs}
            if len(batch) == 1 and base[0] % (b := batch.pop()) == 0:
                return f"train.max_steps={base[0] // b}"  # the baseline's tokens at the candidate's batch
    return f"{key}={values}" if len(base) == 1 else f"{key} to the baseline's values [{values}]"


def _show(values: list[Any], fmt: Callable[[Any], str] | None = None) -> str:
    def one(v: Any) -> str:
        if fmt is not None:
            return fmt(v)
        if isinstance(v, float) and not v.is_integer():
            return f"{v:.4g}"
        if isinstance(v, (int, float)) and abs(v) >= 10_000:
            return f"{v:,.0f}"
        return str(v)

    return one(values[0]) if len(values) == 1 else "[" + ", ".join(one(v) for v in values) + "]"


def audit_markdown(lines: Sequence[str] | None) -> list[str]:
    """An audit's ``Audit.lines`` as a report's section; None: the points had no size labels to pair
    arms by."""
    out = ["", "## Arm audit", ""]
    if lines is None:
        return [*out, "Not audited: the points have no size labels (a `size` column), so there are no arms to pair."]
    head, *rest = lines
    return [*out, head[0].upper() + head[1:] + ".", *([""] if rest else []), *(f"- {line.strip()}" for line in rest)]
