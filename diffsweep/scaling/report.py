"""Rendering a fit result: the paper's sentence, a terminal table (rich) and a markdown report."""

from __future__ import annotations

import math
from typing import Any

from diffsweep.config.kinds import display_name
from diffsweep.config.units import human
from diffsweep.sweep.audit import audit_markdown

_NOUN = {"N": "parameters", "D": "training tokens"}


def arch_name(arch: str) -> str:
    return display_name(arch)  # the kind's KindSpec.display_name


def pct(v: float | None) -> str:
    if v is None:
        return "∞"
    return f"{100 * v:.2g}%" if v < 1 else f"{100 * v:.3g}%" if v < 10 else f"{100 * v:,.0f}%"


def sentence(r: dict[str, Any], row: dict[str, Any]) -> str:
    """'DIFF V1 needs 62% (95% CI 53%–74%) of the Transformer's parameters to match its loss at 13.1B.'"""
    level = f"{100 * r['level']:.0f}% CI"
    if _curve_fit_only(r):
        level += " from the curve fit only"
    if row["ratio"] is None:
        return (f"{arch_name(row['candidate'])}'s fitted curve never reaches the {arch_name(r['baseline'])}'s loss "
                f"at {row['at_label']} (its floor E is above it): no finite ratio ({level} {pct(row['lo'])}–"
                f"{pct(row['hi'])}).")
    text = (f"{arch_name(row['candidate'])} needs {pct(row['ratio'])} ({level} {pct(row['lo'])}–{pct(row['hi'])}) "
            f"of the {arch_name(r['baseline'])}'s {_NOUN[row['axis']]} to match its loss at {row['at_label']}")
    notes = []
    if row.get("extrapolated_reference", row["extrapolated"]):
        notes.append(f"extrapolated: the reference is outside the {arch_name(r['baseline'])}'s measured range")
    if row.get("extrapolated_candidate"):
        notes.append(f"extrapolated: {arch_name(row['candidate'])} would need {human(row['candidate_x'])}, outside "
                     f"its measured range")
    if row["undefined_share"] > 0:
        notes.append(f"undefined in {row['undefined_share']:.1%} of draws")
    if _curve_fit_only(r):
        notes.append("curve-fit only: one run per architecture, so the CI excludes run-to-run variance")
    return text + (f" [{'; '.join(notes)}]." if notes else ".")


def _curve_fit_only(r: dict[str, Any]) -> bool:
    return r.get("noise", {}).get("ci_scope") == "curve_fit_only"


def _extrapolation_mark(row: dict[str, Any]) -> str:
    sides = [side for side, key in (("reference", "extrapolated_reference"), ("candidate", "extrapolated_candidate"))
             if row.get(key)]
    if not sides and row["extrapolated"]:
        sides = ["reference"]
    return f" (extrapolated: {', '.join(sides)})" if sides else ""


def _ratio_cells(row: dict[str, Any]) -> list[str]:
    """A ratio's row in the terminal's and the report's table: candidate, reference, ratio, CI, the
    candidate's size at equal loss, the undefined share, the pure power law's reading."""
    pure, cand_x = row.get("pure_law"), row.get("candidate_x")
    return [arch_name(row["candidate"]), row["at_label"] + _extrapolation_mark(row), pct(row["ratio"]),
            f"{pct(row['lo'])}–{pct(row['hi'])}", human(cand_x) if cand_x else "—", f"{row['undefined_share']:.1%}",
            f"{pct(pure['ratio'])} ({pct(pure['lo'])}–{pct(pure['hi'])})" if pure else "—"]


def _param_cell(fit: dict, name: str) -> str:
    v, (lo, hi) = fit["params"][name], fit["ci"][name]
    fmt = (lambda x: f"{x:.4g}") if name in ("alpha", "beta", "E") else (lambda x: f"{x:.3g}")
    return f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"


def law_text(r: dict[str, Any]) -> str:
    """The fitted form's formula, on the fit's axis (its definition's ``formula``)."""
    x = "N" if r["axis"] == "N" else "D"
    return _law(r).formula.format(x=x)


def _law(r: dict[str, Any]):  # -> laws.LawForm (not imported at module level: see below)
    """The definition of the result's form (imported here: the laws need numpy, the report's
    import must not)."""
    from diffsweep.scaling.laws import law_form

    return law_form(r["form"])

_RESAMPLING = {"parametric": "a parametric bootstrap (noise added to the fitted curves, every draw refitted)",
               "hierarchical": "a hierarchical parametric bootstrap (a per-run offset shared by all evaluations of "
                               "a run, plus evaluation noise)",
               "case": "case resampling (points drawn with replacement, every draw refitted)",
               "cluster": "cluster resampling by run (all evaluations of a run move together)"}


def noise_words(r: dict[str, Any]) -> str:
    """Where the noise comes from, in words (the stats' own description when it gives one)."""
    noise = r["noise"]
    if noise.get("description"):
        return noise["description"]
    text = {"given": f"given with --noise-sd (sd {noise['sd']:.3g} of log loss)",
            "seeds": f"seed replicates (run-to-run sd {noise['sd']:.3g} of log loss)",
            "residuals": f"the fit's residuals (sd {noise['sd']:.3g} of log loss; no seed replicates)"}
    out = text.get(noise["source"], f"{noise['source']} (sd {noise['sd']:.3g} of log loss)")
    if noise.get("between_sd"):
        out += f", plus a size-level sd {noise['between_sd']:.3g}"
    return out


def resampling_words(r: dict[str, Any]) -> str:
    res = r.get("resampling") or {"method": "parametric"}
    text = _RESAMPLING.get(res["method"], res["method"])
    return text + (f", because {res['why']}" if res.get("why") else "")


def _references(r: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(row["at_label"] for row in r["ratios"]))


_TOKEN_POINTS = {
    "checkpoints": ("intermediate checkpoints of each run (the paper's Fig. 3b reading); with a decaying learning "
                    "rate they overstate the loss of a run trained to that D (Hägele et al. 2024)"),
    "branches": ("annealed cooldown branches: each D is a run decayed to its own end, trained from its parent's "
                 "checkpoint (and the parents' own final evaluations); a parent and its branches share one run "
                 "offset"),
    "runs": "the final evaluations of separate runs, one per D",
}


def first_paragraph(r: dict[str, Any]) -> list[str]:
    """The report's opening, in plain words: law, references, noise, resampling, extrapolation,
    the fit's own caveats, and the takeaway."""
    axis = r["axis"].split(",")[0]
    lines = [(f"- **Law**: {law_text(r)}, {_law(r).words}, fitted to each architecture "
             f"({r['objective']} loss on log L, multi-start).")]
    if r["ratios"]:
        refs = ", ".join(_references(r))
        lines.append(f"- **Reference**: the ratios are read at {refs} of the {arch_name(r['baseline'])}'s "
                     f"{_NOUN.get(axis, 'parameters')}" + _paper_clause(r) + ".")
    else:
        lines.append("- **Reference**: one architecture only, so the law is reported and no ratio is computed.")
    if r.get("token_points"):
        lines.append(f"- **D points**: {_TOKEN_POINTS[r['token_points']]}.")
    lines.append(f"- **Noise**: {noise_words(r)}.")
    if r.get("tuning"):
        lines.append(f"- **Tuning**: {tuning_words(r)}")
    if _curve_fit_only(r):
        lines.append("- **The CIs are curve-fit only**: with one run per architecture and no run-level sd given, "
                     "they exclude run-to-run variance and are too narrow for a claim about the architectures.")
    lines.append(f"- **Resampling**: {r['n_boot']} draws of {resampling_words(r)}.")
    ext = [f"{arch_name(row['candidate'])} at {row['at_label']}{_extrapolation_mark(row)}"
           for row in r["ratios"] if row["extrapolated"]]
    lines.append("- **Extrapolation**: " + ("; ".join(ext) + "." if ext else
                                             "none: every reference and every candidate size at equal loss lies "
                                             "inside the measured ranges."))
    caveats = fit_caveats(r)
    if caveats:
        lines.append("- **Fit caveats**: " + " ".join(f"{c}." for c in caveats))
    lines += [f"- **Takeaway**: {t}" for t in takeaways(r)]
    return lines


def tuning_words(r: dict[str, Any]) -> str:
    """The tuned fit in a sentence: what was tuned, how the choice enters the CI, the edge cases."""
    t = r["tuning"]
    cells = t["cells"]
    edge = [c for c in cells if c["edge"]]
    untuned = [c for c in cells if c["untuned"]]
    text = (f"each architecture and size is fitted at its best {', '.join(t['columns'])} (the lowest mean loss over "
            f"its runs; {len(cells)} cells); every bootstrap draw redoes that choice, and its selection bias (the "
            "lowest of noisy candidates reads low) is removed from the fitted points.")
    if edge:
        where = ", ".join(f"{arch_name(c['arch'])} at {human(c['x'])}" for c in edge[:4])
        text += (f" **In {len(edge)} cell(s) ({where}{', ...' if len(edge) > 4 else ''}) the best value is at the "
                 "edge of the grid: the optimum may lie outside the grid: extend it.**")
    if untuned:
        text += f" {len(untuned)} cell(s) had one candidate (untuned)."
    return text


def tuning_markdown(r: dict[str, Any]) -> list[str]:
    """The winners table: each cell's candidates (mean loss, runs), its best, how often the best
    stayed best in the bootstrap draws, and the selection bias removed."""
    if not r.get("tuning"):
        return []
    lines = ["", "## Tuning: the best candidate per architecture and size", "",
             "| architecture | x | best | candidates (mean loss, runs) | best in draws | selection bias |",
             "|---|---|---|---|---|---|"]
    for c in r["tuning"]["cells"]:
        tried = "; ".join(f"{k['values']}: {k['loss']:.4f} ({k['runs']})" for k in c["candidates"])
        mark = " (edge)" if c["edge"] else " (untuned)" if c["untuned"] else ""
        lines.append(f"| {arch_name(c['arch'])} | {human(c['x'])} | {c['winner']}{mark} | {tried} | "
                     f"{c.get('winner_kept', 1.0):.0%} | {100 * c.get('selection_bias', 0.0):+.2f}% |")
    readings = sensitivity_lines(r)
    if readings:
        lines += ["", ("Sensitivity (the loss at the next value tried either side of each size's best, over its "
                       "best; `plots/sensitivity.png`):"), ""] + [f"- {line}" for line in readings]
    return lines


def _rise(candidate: dict[str, Any], cell: dict[str, Any]) -> str:
    best = min(k["loss"] for k in cell["candidates"])
    if candidate["values"] == cell["winner"]:
        return ""
    label = candidate["values"] if ", " in candidate["values"] else candidate["values"].split("=", 1)[-1]
    return f"{label} {100 * (candidate['loss'] / best - 1):+.2f}%"


def sensitivity_lines(r: dict[str, Any]) -> list[str]:
    """One reading per architecture: how far its loss rises either side of its best value, beside
    the run-to-run noise."""
    out = []
    noise = math.expm1(r["noise"]["sd"])
    for s in (r.get("tuning") or {}).get("sensitivity", []):
        parts = [f"{100 * s[side]['rise']:.2f}% at ×{s[side]['factor']:.3g} its best {s['column']}"
                 for side in ("up", "down") if s[side]]
        if parts:
            out.append(f"{arch_name(s['arch'])}: the loss rises " + " and ".join(parts)
                       + f" (mean over {s['cells']} sizes; one run's noise is sd {100 * noise:.2f}%)")
    return out


def _paper_clause(r: dict[str, Any]) -> str:
    paper = r.get("paper_reading")
    if not paper:
        return ""
    return (f" (the paper read Kaplan-style pure power laws at {paper['at_label']}: "
            f"{'see below' if paper['available'] else 'not readable from these data'})")


_CAVEAT_WORDS = ("sits on its", "starts reached the best fit", "near-singular")


def fit_caveats(r: dict[str, Any]) -> list[str]:
    """The warnings about the fits themselves (bound, fragile optimum, near-singular)."""
    return [w for w in r.get("warnings", []) if any(k in w for k in _CAVEAT_WORDS)]


def takeaways(r: dict[str, Any]) -> list[str]:
    """One plain sentence per candidate: a difference, or none detectable at this scale, and why."""
    out = []
    for cand in r["candidates"]:
        rows = [row for row in r["ratios"] if row["candidate"] == cand]
        if not rows:
            continue
        name, base = arch_name(cand), arch_name(r["baseline"])
        contains = [row["lo"] is not None and row["lo"] <= 1 <= (row["hi"] if row["hi"] is not None else float("inf"))
                    for row in rows]
        sides = {row["ratio"] < 1 for row in rows if row["ratio"] is not None}
        level = f"{100 * r['level']:.0f}%"
        if all(contains):
            out.append(f"no detectable difference at this scale between {name} and the {base}: every {level} CI "
                       f"contains 100% (as much as the {base} needs), so these runs cannot tell the two apart.")
        elif len(sides) > 1:
            out.append(f"no detectable difference at this scale between {name} and the {base}: the references "
                       f"point in opposite directions (below 100% at some, above at others).")
        elif not any(contains):
            better = sides == {True}
            out.append(f"{name} needs {'less' if better else 'more'} than the {base} at every reference "
                       f"(every {level} CI {'below' if better else 'above'} 100%).")
        else:
            where = ", ".join(row["at_label"] for row, c in zip(rows, contains) if not c)
            out.append(f"{name} differs from the {base} at {where} only; at the other references the {level} CI "
                       f"contains 100%.")
    return out


def paper_lines(r: dict[str, Any]) -> list[str]:
    """The paper's reading next to this fit's: the same reference, the two laws, and why they differ."""
    paper = r.get("paper_reading")
    if not paper:
        return []
    level = f"{100 * r['level']:.0f}% CI"
    lines = ["", "## The paper's reading", "",
             (f"The DIFF paper fits Kaplan-style pure power laws L = A·x^-α to its Fig. 3 curves and reads the ratios "
             f"off them at {paper['at_label']} (its claim: {paper['paper']}). This report's headline uses "
             f"{law_text(r)} at the largest measured size and the geometric mean of the measured sizes, because "
             f"those references are inside the data.")]
    if not paper["available"]:
        return lines + ["", f"The paper's reference cannot be read from these data: {paper['why']}."]
    lines += ["", (f"| candidate | pure power law at {paper['at_label']} (the paper's reading) | {law_text(r)} at "
              f"{paper['at_label']} (this fit) |"), "|---|---|---|"]
    for row in paper["rows"]:
        cells = [f"{pct(v['ratio'])} ({level} {pct(v['lo'])}–{pct(v['hi'])})" for v in (row["pure_law"], row["this_fit"])]
        lines.append(f"| {arch_name(row['candidate'])} | {cells[0]} | {cells[1]} |")
    if paper.get("extrapolated"):
        lines += ["", f"{paper['at_label']} is outside the measured range: both readings there are extrapolations."]
    lines += ["", ("Why the two readings differ: a loss curve that levels off towards an irreducible loss E is not a "
              "straight line on log-log axes, and a pure power law is. Fitted to such curves, each pure law bends "
              "its exponent to the curvature over the measured range, and the candidate's curve (lower, so nearer "
              "its floor) is flatter there and gets a smaller exponent; the ratio read off two misfitted lines is "
              "biased, by an amount and in a direction that depend on the reference (noise-free, with a true 62% "
              "everywhere: 71.5% at 11B, 73.5% at 13.1B, 58.2% at 3B, 83.9% at 30B; "
              "docs/references.md §4). On noisy Fig. 3a-shaped synthetic ladders with a true ratio of "
              "62.2% at 11B, the offset law read 68–69% and the pure law 75–78%. The pure-law number is the one "
              "comparable with the paper's; the offset law's is the better estimate of the truth, and its CI says "
              "how far to trust it.")]
    return lines


def print_terminal(r: dict[str, Any], outputs: dict[str, str] | None = None) -> None:
    """The fitted laws and ratios with CIs as rich tables, then warnings and where outputs are."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    level = f"{100 * r['level']:.0f}% CI"
    names = list(next(iter(r["fits"].values()))["params"])
    table = Table(title=f"Fitted {law_text(r)} ({r['objective']} on log loss, {r['n_boot']} bootstrap draws, "
                  f"noise from {r['noise']['source']})")
    table.add_column("architecture")
    for n in names:
        table.add_column(f"{n} [{level}]", justify="right")
    table.add_column("points", justify="right")
    table.add_column("starts at best", justify="right")
    for arch, fit in r["fits"].items():
        d = fit["diagnostics"]
        table.add_row(arch_name(arch), *[_param_cell(fit, n) for n in names], str(fit["n_points"]),
                      f"{d['starts_at_best']}/{d['starts']}")
    console.print(table)
    if r["ratios"]:
        ratios = Table(title=f"Efficiency vs the {arch_name(r['baseline'])} (ratio of "
                       f"{_NOUN.get(r['axis'], 'parameters')} at equal loss)")
        for col in ("candidate", "at", "ratio", level, "candidate x", "undefined", "pure power law (Kaplan)"):
            ratios.add_column(col, justify="right" if col != "candidate" else "left")
        for row in r["ratios"]:
            ratios.add_row(*_ratio_cells(row))
        console.print(ratios)
        for row in r["ratios"]:
            console.print(sentence(r, row), markup=False)
    else:
        console.print(f"One architecture ({arch_name(r['baseline'])}): the law is fitted, no ratio is computed.")
    paper = r.get("paper_reading")
    if paper and paper["available"]:
        for row in paper["rows"]:
            p, h = row["pure_law"], row["this_fit"]
            console.print(f"The paper's reading (pure power law at {paper['at_label']}): {arch_name(row['candidate'])} "
                          f"{pct(p['ratio'])} ({pct(p['lo'])}–{pct(p['hi'])}); this fit's law there: "
                          f"{pct(h['ratio'])} ({pct(h['lo'])}–{pct(h['hi'])}). The paper: {paper['paper']}.",
                          markup=False)
    elif paper:
        console.print(f"The paper's reading (pure power law at {paper['at_label']}) is not available: {paper['why']}.",
                      markup=False)
    if r.get("tuning"):
        best = Table(title=f"Best {', '.join(r['tuning']['columns'])} per architecture and size (each bootstrap draw "
                     "chooses again)")
        for col in ("architecture", "x", "best", "others: loss above the best", "best in draws", "selection bias"):
            best.add_column(col, justify="right" if col in ("x", "best in draws", "selection bias") else "left")
        for c in r["tuning"]["cells"]:
            best.add_row(arch_name(c["arch"]), human(c["x"]),
                         c["winner"] + (" (edge)" if c["edge"] else " (untuned)" if c["untuned"] else ""),
                         ", ".join(t for k in c["candidates"] if (t := _rise(k, c))),
                         f"{c.get('winner_kept', 1.0):.0%}", f"{100 * c.get('selection_bias', 0.0):+.2f}%")
        console.print(best)
        for line in sensitivity_lines(r):
            console.print(f"Sensitivity: {line}", markup=False)
    for line in models_terminal(r):
        console.print(line, markup=False)
    for t in takeaways(r):
        console.print(f"Takeaway: {t}", markup=False)
    if _curve_fit_only(r):
        console.print("The CIs are from the curve fit only: they exclude run-to-run variance (one run per "
                      "architecture, no run-level sd given).", style="bold yellow", markup=False)
    if "holdout" in r:
        for arch, p in r["holdout"]["predictions"].items():
            console.print(f"held out {arch_name(arch)} at {human(p['x'])}: predicted {p['predicted']:.4f}, "
                          f"{100 * r['level']:.0f}% prediction interval [{p['lo']:.4f}, {p['hi']:.4f}], observed "
                          f"{p['observed']:.4f} ({100 * p['relative_error']:+.2f}%"
                          f"{'' if _inside_pi(p) else ', outside the prediction interval'})", markup=False)
    for w in r.get("warnings", []):
        console.print(f"warning: {w}", style="yellow", markup=False)
    for what, where in (outputs or {}).items():
        console.print(f"{what}: {where}")


def _inside_pi(p: dict[str, Any]) -> bool:
    return p.get("inside_prediction_interval", p.get("inside_ci", True))


def markdown(r: dict[str, Any], source: str) -> str:
    """The report: the answer in plain words first, then fitted laws, ratios, the paper's reading,
    diagnostics, the held-out check and the warnings."""
    level = f"{100 * r['level']:.0f}% CI"
    lines = [f"# Scaling fit: {source}", "", *first_paragraph(r), "",
             (f"N counts {'all' if r['count'] == 'total' else 'non-embedding'} parameters. "
             f"{r['points_used']} points used (see `points.csv`)."), ""]
    if r["ratios"]:
        lines += ["## Answer", ""] + [f"- {sentence(r, row)}" for row in r["ratios"]] + [""]
    names = list(next(iter(r["fits"].values()))["params"])
    lines += ["## Fitted laws", "", "| architecture | " + " | ".join(f"{n} [{level}]" for n in names) + " | points |",
              "|---" * (len(names) + 2) + "|"]
    for arch, fit in r["fits"].items():
        lines.append(f"| {arch_name(arch)} | " + " | ".join(_param_cell(fit, n) for n in names) + f" | {fit['n_points']} |")
    if r["ratios"]:
        lines += ["", "## Ratios", "", (f"| candidate | at | ratio | {level} | candidate's x at equal loss | undefined | "
                  "pure power law |"), "|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(_ratio_cells(row)) + " |" for row in r["ratios"]]
    if r["per_point"]:
        lines += ["", "Per-point multipliers (a candidate's size over the baseline size with the same fitted loss):", "",
                  "| candidate | x | mean loss | multiplier |", "|---|---|---|---|"]
        lines += [f"| {arch_name(p['candidate'])} | {human(p['x'])} | {p['loss']:.4f} | {pct(p['multiplier'])} |"
                  for p in r["per_point"]]
    if r["ratios"]:
        lines += paper_lines(r)
    lines += ["", "## Diagnostics", "", ("| architecture | starts at best | on a bound | equals its start | grad norm | "
              "residual sd | max abs residual |"), "|---|---|---|---|---|---|---|"]
    for arch, fit in r["fits"].items():
        d = fit["diagnostics"]
        lines.append(f"| {arch_name(arch)} | {d['starts_at_best']}/{d['starts']} | {', '.join(d['on_bound']) or 'none'} | "
                     f"{'yes' if d['equals_start'] else 'no'} | {d['grad_norm']:.2g} | {d['residual_sd']:.3g} | "
                     f"{d['max_abs_residual']:.3g} |")
    if "holdout" in r:
        lines += ["", "## Held-out check (largest size left out of the fit)", "",
                  (f"The observed value is a mean of runs, so it is compared with a {100 * r['level']:.0f}% prediction "
                  "interval: "
                  "the curve's bootstrap band widened by the observation noise of that mean (the curve's own band "
                  "is shown beside it)."), "",
                  "| architecture | x | predicted | prediction interval | curve band | observed | error |",
                  "|---|---|---|---|---|---|---|"]
        for arch, p in r["holdout"]["predictions"].items():
            band = f"[{p['curve_lo']:.4f}, {p['curve_hi']:.4f}]" if "curve_lo" in p else "—"
            lines.append(f"| {arch_name(arch)} | {human(p['x'])} | {p['predicted']:.4f} | [{p['lo']:.4f}, {p['hi']:.4f}] | "
                         f"{band} | {p['observed']:.4f}{'' if _inside_pi(p) else ' (outside)'} | "
                         f"{100 * p['relative_error']:+.2f}% |")
    lines += tuning_markdown(r)
    if r.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in r["warnings"]]
    if "audit" in r:  # a result from before the audit has none
        lines += audit_markdown(None if r["audit"] is None else r["audit"]["lines"])
    lines += ["", "## Plots", "", "![loss vs size](plots/loss.png)", "", "![residuals](plots/residuals.png)", ""]
    if r["ratios"]:
        lines += ["![ratio vs size](plots/ratio.png)", ""]
    if (r.get("tuning") or {}).get("sensitivity"):
        lines += ["![sensitivity to the tuned setting](plots/sensitivity.png)", ""]
    lines += models_markdown(r)
    return "\n".join(lines)


def models_markdown(r: dict[str, Any]) -> list[str]:
    """The joint size-multiplier test and the Chinchilla law's compute-optimal allocation."""
    from diffsweep.config.units import human

    level = f"{100 * r['level']:.0f}% CI"
    lines: list[str] = []
    if r.get("shift_model"):
        lines += ["## One size multiplier for every size?", "",
                  ("The joint model L_cand(N) = L_base(N/ρ) shares E and α and fits one ρ for all sizes (4 parameters "
                   "against 6 for separate fits). If the test rejects it, the curves are not parallel and no single "
                   "number summarises the ladder: read the ratios at stated sizes instead. Not rejecting it is weak "
                   "evidence: with 5 sizes and noise sd 0.005 of log loss the test caught exponents 0.38 against 0.34 "
                   "in 8% (1 seed) to 25% (3 seeds) of simulated ladders (analysis/benchmarks/RESULTS.md)."), "",
                  f"| candidate | one ρ | {level} | test statistic (df) | p | AIC one ρ / separate | one ρ for all sizes |",
                  "|---|---|---|---|---|---|---|"]
        for cand, m in r["shift_model"].items():
            lines.append(f"| {arch_name(cand)} | {pct(m['rho'])} | {pct(m['lo'])}–{pct(m['hi'])} | "
                         f"{m['lr_stat']:.3g} ({m['df']}) | {m['p_value']:.3g} | {m['aic_shift']:.1f} / "
                         f"{m['aic_separate']:.1f} | {'not rejected' if m['supported'] else 'rejected (p < 0.05)'} |")
        lines.append("")
    if r.get("compute_optimal"):
        lines += ["## Compute-optimal allocation of the fitted law", "",
                  ("With C ≈ 6ND: N_opt = G·(C/6)^a and D_opt = G⁻¹·(C/6)^b, a = β/(α+β), b = α/(α+β) "
                   "(Hoffmann et al. 2022)."), "",
                  f"| architecture | a [{level}] | b [{level}] | budget | N_opt [{level}] | D_opt [{level}] |",
                  "|---|---|---|---|---|---|"]

        def cell(v: dict, fmt) -> str:
            def show(x) -> str:
                return "—" if x is None else fmt(x)

            return f"{show(v['value'])} [{show(v['lo'])}, {show(v['hi'])}]"

        for arch, c in r["compute_optimal"].items():
            for i, b in enumerate(c["budgets"]):
                exps = (cell(c["a"], lambda x: f"{x:.3f}"), cell(c["b"], lambda x: f"{x:.3f}")) if i == 0 else ("", "")
                lines.append(f"| {arch_name(arch) if i == 0 else ''} | {exps[0]} | {exps[1]} | {b['label']} | "
                             f"{cell(b['N_opt'], human)} | {cell(b['D_opt'], human)} |")
        lines.append("")
    return lines


def models_terminal(r: dict[str, Any]) -> list[str]:
    """One line per candidate for the shift model, one per architecture for the compute-optimal a."""
    level = f"{100 * r['level']:.0f}% CI"
    lines = [f"One ρ for all sizes, {arch_name(c)}: {pct(m['rho'])} ({level} {pct(m['lo'])}–{pct(m['hi'])}); "
             f"test against separate fits p = {m['p_value']:.2g}: "
             + ("not rejected (weak evidence: the test has little power at typical noise)." if m["supported"]
                else "rejected, the curves are not parallel: no single ratio describes the ladder.")
             for c, m in (r.get("shift_model") or {}).items()]
    for arch, c in (r.get("compute_optimal") or {}).items():
        a = c["a"]
        lines.append(f"Compute-optimal {arch_name(arch)}: N_opt ∝ C^{a['value']:.3f} ({level} {a['lo']:.3f}–"
                     f"{a['hi']:.3f}), D_opt ∝ C^{c['b']['value']:.3f} (report.md has N_opt, D_opt per budget).")
    return lines
