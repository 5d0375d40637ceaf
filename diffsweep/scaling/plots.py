"""PNG plots of a fit result: loss vs size with fitted curves and CI bands (the paper's Fig. 3
look), residuals, and the efficiency ratio vs reference size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diffsweep.config.kinds import display_color
from diffsweep.config.units import human
from diffsweep.scaling.report import arch_name

_XLABEL = {"N": "parameters N", "D": "training tokens D", "N,D": "parameters N"}


def _color(arch: str, i: int) -> str:
    return display_color(arch) or f"C{i + 3}"  # the kind's KindSpec.color


RATIO_YMAX = 10.0  # the ratio axis stops here; a band or curve beyond it (or at ∞) is drawn to the edge and labelled


def split_measured(band: dict[str, list], x_range: list[float]) -> tuple[list[int], list[int]]:
    """Indices of a fitted curve's grid inside its measured range, and beyond it."""
    lo, hi = x_range[0] * (1 - 1e-9), x_range[1] * (1 + 1e-9)
    inside = [i for i, x in enumerate(band["x"]) if lo <= x <= hi]
    return inside, [i for i in range(len(band["x"])) if i not in inside]


def ratio_markers(r: dict[str, Any], arch: str) -> tuple[list[float], list[float]]:
    """Per-point multipliers at their baseline-equivalent reference x (the baseline size with the
    same fitted loss, x / multiplier): where a ratio curve read at that reference would pass."""
    pts = [p for p in r["per_point"] if p["candidate"] == arch and p["multiplier"]]
    return [p["x"] / p["multiplier"] for p in pts], [p["multiplier"] for p in pts]


def ratio_top(r: dict[str, Any]) -> tuple[float, bool]:
    """The ratio axis's upper limit, and whether anything (a band, a curve, a marker) goes past it."""
    values = [v for c in r["ratio_curve"].values() for k in ("ratio", "hi") for v in c[k]]
    values += [m for a in r["ratio_curve"] for m in ratio_markers(r, a)[1]]
    finite = [v for v in values if v is not None]
    top = min(max([2.0, *(1.1 * v for v in finite)]), RATIO_YMAX)
    return top, any(v is None or v > top for v in values)


def write_plots(r: dict[str, Any], folder: Path) -> dict[str, Path]:
    """Write loss.png, residuals.png and (with a candidate) ratio.png into ``folder``; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    level = f"{100 * r['level']:.0f}% CI"

    fig, ax = plt.subplots(figsize=(7.6, 4.4))
    for i, (arch, fit) in enumerate(r["fits"].items()):
        c, band = _color(arch, i), fit["band"]
        ax.fill_between(band["x"], band["lo"], band["hi"], color=c, alpha=0.18, linewidth=0)
        inside, beyond = split_measured(band, fit["x_range"])
        ax.plot([band["x"][j] for j in inside], [band["loss"][j] for j in inside], color=c, label=arch_name(arch))
        for part in _runs(beyond):  # beyond the measured range: dashed, joined to the solid stretch
            part = [j for j in (part[0] - 1, *part, part[-1] + 1) if 0 <= j < len(band["x"])]
            ax.plot([band["x"][j] for j in part], [band["loss"][j] for j in part], color=c, linestyle="--")
        for p in fit["points"]:
            ax.scatter([p["x"]] * len(p["loss"]), p["loss"], color=c, s=18, zorder=3)
    ax.plot([], [], color="grey", linestyle="--", label="beyond measured range")
    ax.set_xscale("log")
    ax.set_xlabel(_XLABEL[r["axis"]])
    ax.set_ylabel("validation loss")
    ax.set_title(f"Loss vs {r['axis'].split(',')[0]}: fitted curves with {level} bands")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    paths["loss"] = _save(fig, folder / "loss.png")

    fig, ax = plt.subplots(figsize=(7.6, 3.4))
    for i, (arch, fit) in enumerate(r["fits"].items()):
        xs = [p["x"] for p in fit["points"]]
        ax.plot(xs, [100 * p["residual"] for p in fit["points"]], "o-", color=_color(arch, i), label=arch_name(arch))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(_XLABEL[r["axis"]])
    ax.set_ylabel("residual (% of loss)")
    ax.set_title("Residuals: observed over fitted (mean per size)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    paths["residuals"] = _save(fig, folder / "residuals.png")

    if r["ratio_curve"]:
        paths["ratio"] = _ratio_plot(plt, r, folder / "ratio.png", level)
    if (r.get("tuning") or {}).get("sensitivity"):
        paths["sensitivity"] = _sensitivity_plot(plt, r, folder / "sensitivity.png")
    return paths


def _sensitivity_plot(plt, r: dict[str, Any], path: Path) -> Path:
    """A tuned fit: each architecture's loss against the tuning value, one line per size, relative
    to that size's best (the best marked), the run-to-run noise shaded."""
    col = r["tuning"]["columns"][0]
    archs = list(dict.fromkeys(c["arch"] for c in r["tuning"]["cells"]))
    fig, axes = plt.subplots(1, len(archs), figsize=(3.6 * len(archs) + 1.0, 3.4), sharey=True, squeeze=False)
    noise = 100 * r["noise"]["sd"]
    for ax, arch in zip(axes[0], archs):
        cells = [c for c in r["tuning"]["cells"] if c["arch"] == arch]
        for i, c in enumerate(cells):
            best = min(k["loss"] for k in c["candidates"])
            pts = sorted((k["value"][col], 100 * (k["loss"] / best - 1)) for k in c["candidates"])
            ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=f"C{i}", ms=3, lw=1, label=human(c["x"]))
            ax.plot([c["winner_values"][col]], [0.0], "*", color=f"C{i}", ms=9)
        ax.axhspan(0, noise, color="0.85", zorder=0)
        ax.set_xscale("log")
        tried = sorted({k["value"][col] for c in cells for k in c["candidates"]})
        ax.set_xticks(tried, [f"{v:g}" for v in tried], fontsize="small")
        ax.minorticks_off()
        ax.set_title(arch_name(arch), fontsize="medium")
        ax.set_xlabel(col)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("loss above the size's best (%)")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="size")
    fig.suptitle(f"Sensitivity to {col} (star: the best; grey: one run's noise sd)", fontsize="medium")
    return _save(fig, path)


def _ratio_plot(plt, r: dict[str, Any], path: Path, level: str) -> Path:
    fig, ax = plt.subplots(figsize=(7.6, 4.0))
    lo, hi = r["measured_range"]
    top, beyond = ratio_top(r)
    ax.axvspan(lo, hi, color="grey", alpha=0.12, label=f"{arch_name(r['baseline'])}'s measured range")
    nan = float("nan")
    for i, (arch, curve) in enumerate(r["ratio_curve"].items()):
        c = _color(arch, i + 1)
        band_lo = [v if v is not None else nan for v in curve["lo"]]
        band_hi = [min(v, top) if v is not None else top for v in curve["hi"]]  # ∞ drawn to the edge
        ax.fill_between(curve["x"], band_lo, band_hi, color=c, alpha=0.18, linewidth=0)
        ax.plot(curve["x"], [v if v is not None else nan for v in curve["ratio"]], color=c,
                label=f"{arch_name(arch)} / {arch_name(r['baseline'])}")
        xs, ys = ratio_markers(r, arch)
        ax.scatter(xs, [min(y, top) for y in ys], color=c, marker="x", zorder=3)
        gone = [x for x, v in zip(curve["x"], curve["ratio"]) if v is None]
        if gone:
            ax.annotate(f"{arch_name(arch)}: no finite ratio from {human(min(gone))}", (min(gone), top),
                        xytext=(0, -12), textcoords="offset points", fontsize="small", color=c, ha="right")
    ax.axhline(1.0, color="black", linewidth=0.8)
    if beyond:
        ax.axhline(top, color="black", linewidth=0.8, linestyle=":")
        ax.annotate(f"axis cut at {top:.3g}: bands (or curves) above it go on, up to ∞", (0.01, 0.98),
                    xycoords="axes fraction", va="top", fontsize="small")
    ax.set_xscale("log")
    ax.set_ylim(0, top * (1.02 if beyond else 1.0))
    ax.set_xlabel(f"reference {_XLABEL[r['axis']]} of the {arch_name(r['baseline'])}")
    ax.set_ylabel("ratio at equal loss")
    ax.set_title(f"Efficiency ratio vs reference size ({level}; x: per-point multipliers)", fontsize="medium")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, path)


def _runs(indices: list[int]) -> list[list[int]]:
    """Consecutive runs of indices (a curve's stretches below and above its measured range)."""
    out: list[list[int]] = []
    for i in indices:
        if out and i == out[-1][-1] + 1:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
