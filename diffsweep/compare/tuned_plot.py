"""``diffsweep compare SWEEP --plot FILE.png`` on a tuned sweep: each cell's metric against its
tuning value, the candidates' seed CIs, the best starred and unstable candidates marked.

One panel per size (and switches), one line per kind: every candidate's mean over its seeds with
its ``level`` CI (Student's t on the pooled seed sd over its seeds), the cell's best as a star,
a candidate with diverged runs as a red cross on the panel's top edge (it has no mean when every
run diverged) and one whose runs logged loss spikes (gradient-norm spikes) as ▲ (∇) with the
count. The file is new: an existing path is refused (diffsweep never replaces a file it did not
write), and it appears whole or not at all.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.fsutil import parents_made_for, temporary_name


def check_plot_path(path: Path) -> None:
    """``--plot``: a new ``.png`` path whose nearest existing parent is a folder. Reads only."""
    if path.suffix.lower() != ".png":
        raise ConfigError("plot", f"expected a .png file path, got {path}")
    if path.exists() or path.is_symlink():
        raise ConfigError("plot", f"{path} exists; give a new file path (diffsweep does not replace a file)")
    for parent in path.absolute().parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise ConfigError("plot", f"{parent} is not a folder, so {path} cannot be made in it")
            break


def write_plot(data: dict[str, Any], path: Path) -> Path:
    """Draw ``TunedSweepComparison.to_dict()``'s cells into the new file ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    panels: dict[str, list[dict]] = {}
    for cell in data["cells"]:
        panels.setdefault(cell["panel"], []).append(cell)
    sd, df = data["pooled_sd"], data["df"]
    t = float(stats.t.ppf(0.5 + data["level"] / 2, df)) if sd is not None else math.nan
    fig, axes = plt.subplots(1, len(panels), figsize=(max(6.0, 3.8 * len(panels) + 1.6), 3.9), squeeze=False)
    kinds = list(dict.fromkeys(c["kind"] for c in data["cells"]))
    for ax, (panel, cells) in zip(axes[0], panels.items()):
        numeric = all(isinstance(k["value"], (int, float)) and k["value"] > 0 for c in cells for k in c["candidates"])
        for cell in cells:
            color = f"C{kinds.index(cell['kind'])}"
            ks = sorted(cell["candidates"], key=lambda k: k["value"] if numeric else 0)
            xs = [k["value"] if numeric else i for i, k in enumerate(ks)]
            read = [(x, k) for x, k in zip(xs, ks) if k["mean"] is not None]
            errors = [t * sd / math.sqrt(k["n"]) if sd is not None else 0.0 for _, k in read]
            ax.errorbar([x for x, _ in read], [k["mean"] for _, k in read], yerr=errors, color=color, marker="o",
                        ms=3, lw=1, capsize=2, label=cell["kind"])
            for x, k in read:
                if k["candidate"] == cell["winner"]:
                    ax.plot([x], [k["mean"]], "*", color=color, ms=11)
                if k["spikes"]:
                    ax.annotate(f"▲{k['spikes']}", (x, k["mean"]), textcoords="offset points", xytext=(4, 4),
                                color=color, fontsize="small")
                if k.get("grad_spikes"):
                    ax.annotate(f"∇{k['grad_spikes']}", (x, k["mean"]), textcoords="offset points", xytext=(4, -11),
                                color=color, fontsize="small")
            for x, k in zip(xs, ks):
                if k["diverged"]:
                    ax.plot([x], [1.0], "x", color="red", ms=8, mew=2, transform=ax.get_xaxis_transform(),
                            clip_on=False)
        if numeric:
            ax.set_xscale("log")
            tried = sorted({k["value"] for c in cells for k in c["candidates"]})
            ax.set_xticks(tried, [f"{v:g}" for v in tried], fontsize="small")
            ax.minorticks_off()
        ax.set_title(panel, fontsize="medium")
        ax.set_xlabel(", ".join(key.rsplit(".", 1)[-1] for key in data["tune"]))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"final {data['metric']}")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ci = f"{data['level']:.0%} seed CI" if sd is not None else "no seed CI (one seed per candidate)"
    fig.suptitle(f"{data['sweep']}: sensitivity to {axes[0][0].get_xlabel()}\n({ci}; star: the best; red x: "
                 "diverged runs; ▲: loss spikes; ∇: gradient-norm spikes)", fontsize="small")
    fig.tight_layout()
    with parents_made_for(path):
        tmp = path.with_name(temporary_name(path.name))
        try:
            fig.savefig(tmp, dpi=110, format="png")
            os.link(tmp, path)  # fails if the path appeared meanwhile: never replaces a file
        except FileExistsError:
            raise ConfigError("plot", f"{path} appeared while the plot was drawn; nothing replaced") from None
        finally:
            tmp.unlink(missing_ok=True)
            plt.close(fig)
    return path
