"""The probe comparison's markdown and plots (``diffsweep compare SWEEP --probes``): a section per
probe table, one table per group of arms (a size), and one plot per section."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from diffsweep.compare.probe_tables import ArmGroup, ArmStat, Cell, Difference, ProbeComparison, ProbeTable


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


def sections(tables: Sequence[ProbeTable]) -> list[list[ProbeTable]]:
    """The tables by (probe, table), in order: one section of the report and one plot each, its
    tables one per group of arms (size)."""
    out: dict[tuple[str, str], list[ProbeTable]] = {}
    for t in tables:
        out.setdefault((t.probe, t.spec.table), []).append(t)
    return list(out.values())


def _group_of(t: ProbeTable, result: ProbeComparison) -> ArmGroup:
    return next((g for g in result.arm_groups if g.size == t.size), result.arm_groups[0])


def group_heading(t: ProbeTable, result: ProbeComparison) -> str | None:
    """``size S: against B`` above a table of one size's arms (None: the one table of all arms)."""
    return None if t.size is None else f"size {t.size}: its arms against {_group_of(t, result).baseline}"


def group_markdown(t: ProbeTable, result: ProbeComparison) -> list[str]:
    """``table_markdown`` of ``t`` with its group's arms and baseline."""
    group = _group_of(t, result)
    return table_markdown(t, group.arms, t.baseline or group.baseline, result.level)


def markdown(result: ProbeComparison, plots: Sequence[str]) -> str:
    """The report: one section per probe table (one table per size where sizes are compared
    apart), arms as columns, differences vs the baseline."""
    step = "the newest evaluated step of each run" if result.step is None else f"step {result.step}"
    groups = result.arm_groups
    against = (f"baseline ({groups[0].baseline})" if groups[0].size is None else
               "the baseline of the arm's size (" + ", ".join(f"{g.size}: {g.baseline}" for g in groups) + ")")
    out = [f"# Probes of sweep {result.sweep}", "",
           (f"Experiment `{result.experiment}`; evaluations at {step}. Each arm: mean ± {result.level:.0%} CI over "
            "its seeds (n runs; Student t on the seed sd pooled over the arms of its table; one seed per arm: the "
            f"value, no CI). Differences: arm − {against} with a {result.level:.0%} CI and the p-value of the "
            "same t statistic: a paired t test over the seeds both arms have where they share two or more "
            "(marked 'paired on N seeds'), else Student t on the pooled seed sd; 'within seed noise' when the "
            "CI contains 0."), ""]
    for tables, png in zip(sections(result.tables), plots, strict=True):
        t = tables[0]
        steps = sorted({s for x in tables for s in x.steps.values()})
        settings = sorted({s for x in tables for s in x.settings})
        out += [f"## {t.probe}: {t.spec.title}", "",
                f"Step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))}; settings: "
                + "; ".join(f"`{s}`" for s in settings), ""]
        for x in tables:
            heading = group_heading(x, result)
            out += [f"### {heading}", ""] if heading else []
            out += [*group_markdown(x, result), ""]
        out += [f"![{t.probe}]({png})", ""]
    if result.notes:
        out += ["## Notes", "", *(f"- {n}" for n in result.notes), ""]
    return "\n".join(out)


# -- plots ---------------------------------------------------------------------------------------------

# An arm's colour is its kind's; its marker and line style (bars: hatch) tell the arms of one
# colour apart, by size where they differ in size. Ten markers x four line styles: 40 arms per colour.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx", "\\\\", "oo", "++", "--", "||", "**")
PALETTE = ("tab10", "tab20")  # after the kinds' own colours; distinct colours for 20 kinds


@dataclass(frozen=True)
class ArmStyle:
    """How one arm is drawn."""

    color: str
    linestyle: str
    marker: str
    hatch: str


def arm_styles(arms: Sequence[str], kinds: Mapping[str, str], sizes: Mapping[str, str]) -> dict[str, ArmStyle]:
    """Each arm's colour (its kind's: the kind's own ``KindSpec.color``, else the next unused one of
    the palettes) and style (its size's index among the arms' sizes, or the next free one among the
    arms of its colour): no two arms share colour, marker and line style while a colour has at most
    40 arms, nor colour and hatch while it has at most 10. Arms without a kind are each their own."""
    from matplotlib import colormaps, colors

    from diffsweep.config.kinds import display_color

    kind_order = list(dict.fromkeys(kinds.get(a, a) for a in arms))
    declared = {k: display_color(k) for k in kind_order}
    taken = {colors.to_hex(c) for c in declared.values() if c is not None}
    spare = [h for name in PALETTE for c in colormaps[name].colors  # type: ignore[attr-defined]
             if (h := colors.to_hex(c)) not in taken]
    colour: dict[str, str] = {}
    used: set[str] = set()
    for k in kind_order:
        own = declared[k]
        if own is not None and colors.to_hex(own) not in used:
            colour[k] = colors.to_hex(own)
        else:
            colour[k] = spare.pop(0) if spare else "#000000"
        used.add(colour[k])
    size_order = list(dict.fromkeys(sizes.get(a, "") for a in arms))
    styles: dict[str, ArmStyle] = {}
    free: dict[str, set[int]] = {}
    for a in arms:
        c = colour[kinds.get(a, a)]
        taken_here = free.setdefault(c, set())
        i = size_order.index(sizes.get(a, ""))
        while i in taken_here:
            i += 1
        taken_here.add(i)
        # (i % 10, (3 * (i // 10) + i) % 4) is a different pair for each i < 40
        styles[a] = ArmStyle(color=c, marker=MARKERS[i % len(MARKERS)],
                             linestyle=LINESTYLES[(i // len(MARKERS) + i) % len(LINESTYLES)],
                             hatch=HATCHES[i % len(HATCHES)])
    return styles


def figure(tables: Sequence[ProbeTable], result: ProbeComparison) -> Figure:
    """One panel per value column of one probe table (``tables``: its groups of arms): curves
    against ``spec.x`` (with a CI band) or bars by cell (with CI error bars), every arm in its own
    colour and style (``arm_styles``), the legend outside the panels, the y axis labelled and
    spanning at least the column's natural range (``value_range``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = tables[0]
    cells = [c for x in tables for c in x.cells]
    values = list(dict.fromkeys(c.value for c in cells))
    arms = [a for a in result.arms if any(s.arm == a for c in cells for s in c.arms)]
    styles = arm_styles(arms, result.kinds, result.sizes)
    width = max(6.4, 5.2 * len(values))
    fig, axes = plt.subplots(1, len(values), figsize=(width, 4.2), squeeze=False)
    for ax, value in zip(axes[0], values, strict=True):
        mine = [c for c in cells if c.value == value]
        if t.spec.x is not None:
            _curves(ax, t, mine, arms, styles)
        else:
            _bars(ax, t, mine, arms, styles)
        ax.set_title(value, fontsize="medium")
        ax.set_ylabel(value)
        ax.grid(True, alpha=0.3)
        _y_range(ax, t.spec, value, mine)
    handles, labels = axes[0][0].get_legend_handles_labels()
    # outside the panels, right of the last one: a legend of 15 arms inside would cover the data
    axes[0][-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                       fontsize="small", ncol=1 if len(labels) <= 16 else 2)
    fig.suptitle(textwrap.fill(f"{result.sweep}: {t.spec.title}", int(11 * width)), fontsize="medium")
    fig.tight_layout()
    return fig


def plot(tables: Sequence[ProbeTable], result: ProbeComparison, path: Path) -> Path:
    """``figure`` saved to ``path`` (PNG), the legend included."""
    import matplotlib.pyplot as plt

    fig = figure(tables, result)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def value_range(spec: Any, value: str) -> tuple[float, float] | None:
    """The natural range of a value column (e.g. (0, 1) for an accuracy) if the probe's table
    declares one: ``ranges``, pairs of (value column, (low, high)), on its ``TableComparison``."""
    declared = dict(getattr(spec, "ranges", ()) or ())
    got = declared.get(value)
    return (float(got[0]), float(got[1])) if got is not None else None


def _y_range(ax: Any, spec: Any, value: str, cells: Sequence[Cell]) -> None:
    """At least the column's natural range; a column without spread (all needles missed: every
    accuracy 0) at least [min(0, v), max(1, v)], so that a constant does not read as a difference
    on matplotlib's +-0.05 axis around it."""
    ys = [y for c in cells for s in c.arms for y in (s.mean - (s.half or 0.0), s.mean + (s.half or 0.0))
          if math.isfinite(y)]
    if not ys:
        return
    lo, hi = min(ys), max(ys)
    natural = value_range(spec, value)
    if natural is not None:
        lo, hi = min(lo, natural[0]), max(hi, natural[1])
    elif hi - lo <= 1e-9 * max(1.0, abs(hi)):
        lo, hi = min(0.0, lo), max(1.0, hi)
    else:
        return  # matplotlib's own range around data with spread
    pad = 0.04 * (hi - lo)
    ax.set_ylim(lo - pad, hi + pad)


def _stat(c: Cell, arm: str) -> ArmStat | None:
    return next((s for s in c.arms if s.arm == arm), None)


def _curves(ax: Any, t: ProbeTable, cells: list[Cell], arms: list[str], styles: Mapping[str, ArmStyle]) -> None:
    at = t.spec.keys.index(t.spec.x) if t.spec.x in t.spec.keys else 0
    for arm in arms:
        points = sorted((c.key[at], s) for c in cells if (s := _stat(c, arm)) is not None
                        and isinstance(c.key[at], (int, float)))
        if not points:
            continue
        xs = [x for x, _ in points]
        ys = [s.mean for _, s in points]
        st = styles[arm]
        ax.plot(xs, ys, marker=st.marker, linestyle=st.linestyle, markersize=4, color=st.color, label=arm)
        if all(s.half is not None for _, s in points):
            ax.fill_between(xs, [s.mean - (s.half or 0) for _, s in points], [s.mean + (s.half or 0) for _, s in points],
                            color=st.color, alpha=0.15)
    if t.spec.log_x:
        ax.set_xscale("log")
    ax.set_xlabel(t.spec.x or "")


def _bars(ax: Any, t: ProbeTable, cells: list[Cell], arms: list[str], styles: Mapping[str, ArmStyle]) -> None:
    keys = list(dict.fromkeys(c.key for c in cells))  # a cell's key, once over the groups of arms
    width = 0.8 / max(1, len(arms))
    for i, arm in enumerate(arms):
        xs, ys, errs = [], [], []
        for c in cells:
            s = _stat(c, arm)
            if s is not None:
                xs.append(keys.index(c.key) + (i - (len(arms) - 1) / 2) * width)
                ys.append(s.mean)
                errs.append(s.half or 0.0)
        st = styles[arm]
        ax.bar(xs, ys, width=width, yerr=errs, capsize=2, color=st.color, hatch=st.hatch, edgecolor="white",
               linewidth=0.5, label=arm)
    varying = [i for i in range(len(t.spec.keys)) if len({k[i] for k in keys}) > 1] or [0]  # the rest: alike
    labels = [", ".join(f"{t.spec.keys[i]}={_key_text(k[i])}" if len(varying) > 1 else _key_text(k[i])
                        for i in varying) for k in keys]
    ax.set_xticks(range(len(keys)), labels, rotation=45 if len(keys) > 4 else 0,
                  ha="right" if len(keys) > 4 else "center", fontsize="small")
    ax.set_xlabel(", ".join(t.spec.keys[i] for i in varying))
