"""The probe comparison's markdown and plots (``diffsweep compare SWEEP --probes``)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diffsweep.sweep.probe_tables import ArmStat, Cell, Difference, ProbeComparison, ProbeTable


def _num(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def arm_text(a: ArmStat) -> str:
    """``mean ± half (n=N)``; the value alone with one seed per arm."""
    if a.half is None:
        return f"{_num(a.mean)} (n={a.n})"
    return f"{_num(a.mean)} ± {_num(a.half)} (n={a.n})"


def difference_text(d: Difference | None) -> str:
    if d is None:
        return "-"
    if d.lo is None or d.hi is None:
        return f"{d.delta:+.4g} (no CI: one seed per arm)"
    p = "" if d.p is None else f", p={d.p:.2g}"
    paired = f", paired on {d.pairs} seeds" if d.pairs else ""
    return f"{d.delta:+.4g} [{d.lo:+.4g}, {d.hi:+.4g}]{p}{paired}: {d.verdict}"


def _key_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def table_markdown(t: ProbeTable, arms: Sequence[str], baseline: str, level: float) -> list[str]:
    shown = [a for a in arms if any(s.arm == a for c in t.cells for s in c.arms)]
    others = [a for a in shown if a != baseline]
    header = [*t.spec.keys, "value", *shown, *(f"{a} − {baseline} ({level:.0%} CI)" for a in others)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in t.cells:
        by_arm = {s.arm: s for s in c.arms}
        diffs = {d.arm: d for d in c.differences}
        cells = [*(_key_text(k) for k in c.key), c.value, *(arm_text(by_arm[a]) if a in by_arm else "-" for a in shown),
                 *(difference_text(diffs.get(a)) for a in others)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(result: ProbeComparison, plots: Sequence[str]) -> str:
    """The report: one section per probe table, arms as columns, differences vs the baseline."""
    step = "the newest evaluated step of each run" if result.step is None else f"step {result.step}"
    out = [f"# Probes of sweep {result.sweep}", "",
           (f"Experiment `{result.experiment}`; evaluations at {step}. Each arm: mean ± {result.level:.0%} CI over "
            "its seeds (n runs; Student t on the seed sd pooled over the arms; one seed per arm: the value, no CI). "
            f"Differences: arm − baseline ({result.baseline}) with a {result.level:.0%} CI and the p-value of the "
            "same t statistic: a paired t test over the seeds both arms have where they share two or more "
            "(marked 'paired on N seeds'), else Student t on the pooled seed sd; 'within seed noise' when the "
            "CI contains 0."), ""]
    for t, png in zip(result.tables, plots, strict=True):
        steps = sorted(set(t.steps.values()))
        out += [f"## {t.probe}: {t.spec.title}", "",
                f"Step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}; settings: "
                + "; ".join(f"`{s}`" for s in t.settings), ""]
        out += table_markdown(t, result.arms, result.baseline, result.level)
        out += ["", f"![{t.probe}]({png})", ""]
    if result.notes:
        out += ["## Notes", "", *(f"- {n}" for n in result.notes), ""]
    return "\n".join(out)


def plot(t: ProbeTable, result: ProbeComparison, path: Path) -> Path:
    """One panel per value column: curves against ``spec.x`` (with a CI band) or bars by cell
    (with CI error bars), one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = list(dict.fromkeys(c.value for c in t.cells))
    width = max(6.4, 5.2 * len(values))
    fig, axes = plt.subplots(1, len(values), figsize=(width, 4.2), squeeze=False)
    arms = [a for a in result.arms if any(s.arm == a for c in t.cells for s in c.arms)]
    for ax, value in zip(axes[0], values, strict=True):
        cells = [c for c in t.cells if c.value == value]
        if t.spec.x is not None:
            _curves(ax, t, cells, arms)
        else:
            _bars(ax, t, cells, arms)
        ax.set_title(value, fontsize="medium")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(textwrap.fill(f"{result.sweep}: {t.spec.title}", int(11 * width)), fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _stat(c: Cell, arm: str) -> ArmStat | None:
    return next((s for s in c.arms if s.arm == arm), None)


def _curves(ax: Any, t: ProbeTable, cells: list[Cell], arms: list[str]) -> None:
    at = t.spec.keys.index(t.spec.x) if t.spec.x in t.spec.keys else 0
    for i, arm in enumerate(arms):
        points = sorted((c.key[at], s) for c in cells if (s := _stat(c, arm)) is not None
                        and isinstance(c.key[at], (int, float)))
        if not points:
            continue
        xs = [x for x, _ in points]
        ys = [s.mean for _, s in points]
        ax.plot(xs, ys, marker="o", markersize=3, color=f"C{i}", label=arm)
        if all(s.half is not None for _, s in points):
            ax.fill_between(xs, [s.mean - (s.half or 0) for _, s in points], [s.mean + (s.half or 0) for _, s in points],
                            color=f"C{i}", alpha=0.2)
    if t.spec.log_x:
        ax.set_xscale("log")
    ax.set_xlabel(t.spec.x or "")


def _bars(ax: Any, t: ProbeTable, cells: list[Cell], arms: list[str]) -> None:
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        xs, ys, errs = [], [], []
        for j, c in enumerate(cells):
            s = _stat(c, arm)
            if s is not None:
                xs.append(j + (i - (len(arms) - 1) / 2) * width)
                ys.append(s.mean)
                errs.append(s.half or 0.0)
        ax.bar(xs, ys, width=width, yerr=errs, capsize=3, color=f"C{i}", label=arm)
    varying = [i for i in range(len(t.spec.keys)) if len({c.key[i] for c in cells}) > 1] or [0]  # the rest: alike
    labels = [", ".join(f"{t.spec.keys[i]}={_key_text(c.key[i])}" if len(varying) > 1 else _key_text(c.key[i])
                        for i in varying) for c in cells]
    ax.set_xticks(range(len(cells)), labels, rotation=45 if len(cells) > 4 else 0,
                  ha="right" if len(cells) > 4 else "center", fontsize="small")
    ax.set_xlabel(", ".join(t.spec.keys[i] for i in varying))
