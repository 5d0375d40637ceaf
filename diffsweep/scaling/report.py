"""Rendering a fit result: the paper's sentence, a terminal table (rich) and a markdown report."""

from __future__ import annotations

from typing import Any

ARCH_NAMES = {"transformer": "Transformer", "diff_v1": "DIFF V1", "diff_v2": "DIFF V2"}
_NOUN = {"N": "parameters", "D": "training tokens"}


def arch_name(arch: str) -> str:
    return ARCH_NAMES.get(arch, arch)


def pct(v: float | None) -> str:
    if v is None:
        return "∞"
    return f"{100 * v:.2g}%" if v < 1 else f"{100 * v:.3g}%" if v < 10 else f"{100 * v:,.0f}%"


def sentence(r: dict[str, Any], row: dict[str, Any]) -> str:
    """'DIFF V1 needs 62% (95% CI 53%–74%) of the Transformer's parameters to match its loss at 13.1B.'"""
    level = f"{100 * r['level']:.0f}% CI"
    if row["ratio"] is None:
        return (f"{arch_name(row['candidate'])}'s fitted curve never reaches the {arch_name(r['baseline'])}'s loss "
                f"at {row['at_label']} (its floor E is above it): no finite ratio ({level} {pct(row['lo'])}–"
                f"{pct(row['hi'])}).")
    text = (f"{arch_name(row['candidate'])} needs {pct(row['ratio'])} ({level} {pct(row['lo'])}–{pct(row['hi'])}) "
            f"of the {arch_name(r['baseline'])}'s {_NOUN[row['axis']]} to match its loss at {row['at_label']}")
    notes = []
    if row["extrapolated"]:
        notes.append("extrapolated")
    if row["undefined_share"] > 0:
        notes.append(f"undefined in {row['undefined_share']:.1%} of draws")
    return text + (f" [{'; '.join(notes)}]." if notes else ".")


def _param_cell(fit: dict, name: str) -> str:
    v, (lo, hi) = fit["params"][name], fit["ci"][name]
    fmt = (lambda x: f"{x:.4g}") if name in ("alpha", "beta", "E") else (lambda x: f"{x:.3g}")
    return f"{fmt(v)} [{fmt(lo)}, {fmt(hi)}]"


def law_text(r: dict[str, Any]) -> str:
    x = "N" if r["axis"] == "N" else "D"
    return {"offset": f"L = E + A·{x}^-α", "pure": f"L = A·{x}^-α",
            "chinchilla": "L = E + A/N^α + B/D^β"}[r["form"]]


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
    ratios = Table(title=f"Efficiency vs the {arch_name(r['baseline'])} (ratio of {_NOUN.get(r['axis'], 'parameters')} "
                   f"at equal loss)")
    for col in ("candidate", "at", "ratio", level, "undefined", "pure power law (Kaplan)"):
        ratios.add_column(col, justify="right" if col != "candidate" else "left")
    for row in r["ratios"]:
        pure = row.get("pure_law")
        ratios.add_row(arch_name(row["candidate"]), row["at_label"] + (" *" if row["extrapolated"] else ""),
                       pct(row["ratio"]), f"{pct(row['lo'])}–{pct(row['hi'])}", f"{row['undefined_share']:.1%}",
                       f"{pct(pure['ratio'])} ({pct(pure['lo'])}–{pct(pure['hi'])})" if pure else "—")
    console.print(ratios)
    for row in r["ratios"]:
        console.print(sentence(r, row), markup=False)
    for line in models_terminal(r):
        console.print(line, markup=False)
    if "holdout" in r:
        for arch, p in r["holdout"]["predictions"].items():
            console.print(f"held out {arch_name(arch)} at {p['x']:.3g}: predicted {p['predicted']:.4f} "
                          f"[{p['lo']:.4f}, {p['hi']:.4f}], observed {p['observed']:.4f} "
                          f"({100 * p['relative_error']:+.2f}%{'' if p['inside_ci'] else ', outside the CI'})")
    for w in r.get("warnings", []):
        console.print(f"warning: {w}", style="yellow")
    for what, where in (outputs or {}).items():
        console.print(f"{what}: {where}")


def markdown(r: dict[str, Any], source: str) -> str:
    """The report: question, answer with CIs, fitted laws, diagnostics, held-out check, caveats."""
    level = f"{100 * r['level']:.0f}% CI"
    lines = [f"# Scaling fit: {source}", "",
             f"{law_text(r)} per architecture, {r['objective']} loss on log L (summed), multi-start fits; "
             f"{r['n_boot']} paired parametric bootstrap draws (noise: {r['noise']['source']}, "
             f"sd {r['noise']['sd']:.3g} of log loss"
             + (f", size-level sd {r['noise']['between_sd']:.3g}" if r['noise']['between_sd'] else "") + "). "
             f"N counts {'all' if r['count'] == 'total' else 'non-embedding'} parameters. "
             f"{r['points_used']} points used (see `points.csv`).", "", "## Answer", ""]
    lines += [f"- {sentence(r, row)}" for row in r["ratios"]]
    names = list(next(iter(r["fits"].values()))["params"])
    lines += ["", "## Fitted laws", "", "| architecture | " + " | ".join(f"{n} [{level}]" for n in names) + " | points |",
              "|---" * (len(names) + 2) + "|"]
    for arch, fit in r["fits"].items():
        lines.append(f"| {arch_name(arch)} | " + " | ".join(_param_cell(fit, n) for n in names) + f" | {fit['n_points']} |")
    lines += ["", "## Ratios", "", f"| candidate | at | ratio | {level} | undefined | pure power law |", "|---|---|---|---|---|---|"]
    for row in r["ratios"]:
        pure = row.get("pure_law")
        lines.append(f"| {arch_name(row['candidate'])} | {row['at_label']}{' (extrapolated)' if row['extrapolated'] else ''} | "
                     f"{pct(row['ratio'])} | {pct(row['lo'])}–{pct(row['hi'])} | {row['undefined_share']:.1%} | "
                     + (f"{pct(pure['ratio'])} ({pct(pure['lo'])}–{pct(pure['hi'])})" if pure else "—") + " |")
    lines += ["", "Per-point multipliers (a candidate's size over the baseline size with the same fitted loss):", "",
              "| candidate | x | mean loss | multiplier |", "|---|---|---|---|"]
    lines += [f"| {arch_name(p['candidate'])} | {p['x']:.4g} | {p['loss']:.4f} | {pct(p['multiplier'])} |" for p in r["per_point"]]
    lines += ["", "## Diagnostics", "", "| architecture | starts at best | on a bound | equals its start | grad norm | "
              "residual sd | max abs residual |", "|---|---|---|---|---|---|---|"]
    for arch, fit in r["fits"].items():
        d = fit["diagnostics"]
        lines.append(f"| {arch_name(arch)} | {d['starts_at_best']}/{d['starts']} | {', '.join(d['on_bound']) or 'none'} | "
                     f"{'yes' if d['equals_start'] else 'no'} | {d['grad_norm']:.2g} | {d['residual_sd']:.3g} | "
                     f"{d['max_abs_residual']:.3g} |")
    if "holdout" in r:
        lines += ["", "## Held-out check (largest size left out of the fit)", "",
                  "| architecture | x | predicted | CI | observed | error |", "|---|---|---|---|---|---|"]
        for arch, p in r["holdout"]["predictions"].items():
            lines.append(f"| {arch_name(arch)} | {p['x']:.4g} | {p['predicted']:.4f} | [{p['lo']:.4f}, {p['hi']:.4f}] | "
                         f"{p['observed']:.4f} | {100 * p['relative_error']:+.2f}% |")
    if r.get("warnings"):
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in r["warnings"]]
    lines += ["", "## Plots", "", "![loss vs size](plots/loss.png)", "", "![residuals](plots/residuals.png)", "",
              "![ratio vs size](plots/ratio.png)", ""]
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
            show = (lambda x: "—" if x is None else fmt(x))
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
