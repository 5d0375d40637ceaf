"""How ``compare --probes`` lays a ladder out and draws it, on synthetic probe tables (no store, no
training): each size's arms against that size's arm of the first kind, one table per size; an
explicit baseline puts every arm in one table; plot styles stay distinct for 15 arms; the legend
sits outside the data; a column without spread is drawn on its natural range; every panel has a
y label."""

from __future__ import annotations

import itertools

import matplotlib
import pytest

from diffsweep.compare.probe_report import arm_styles, figure, markdown, sections
from diffsweep.compare.probe_tables import EvalRecord, ProbeComparison, arm_groups, build_table
from diffsweep.eval.probe import TableComparison

matplotlib.use("Agg")

SIZES = ("tiny-3xs", "tiny-2xs", "tiny-xs", "tiny-s", "tiny-m")  # the demo ladder's
KINDS = ("transformer", "diff_v1", "diff_v2")
ARMS = [f"{k}-{s}" for s in SIZES for k in KINDS]  # grid order: size, then kind
KIND = {f"{k}-{s}": k for s in SIZES for k in KINDS}
SIZE = {f"{k}-{s}": s for s in SIZES for k in KINDS}
NLL = TableComparison(table="nll_position", title="Fig. 4", keys=("position",), values=("cumulative",), x="position",
                      log_x=True)
NEEDLE = TableComparison(table="needle", title="Table 2", keys=("context", "depth"), values=("accuracy",),
                         mean_over="depth")


def _record(arm: str, seed: int, table: str, rows: list[dict]) -> EvalRecord:
    return EvalRecord(run_id=f"{arm}-{seed}", probe=table, step=600, run_key=f"{arm}-s{seed}",
                      run_name=f"{arm}-s{seed}", settings="{}", end_time=0, seed=seed, tables={table: rows})


def _nll(arm: str, seed: int) -> list[dict]:
    shift = 0.3 * SIZES.index(SIZE[arm]) + 0.1 * KINDS.index(KIND[arm]) + 0.01 * seed
    return [{"position": p, "cumulative": 6.0 - shift - 0.2 * i} for i, p in enumerate((1, 2, 4, 8, 16))]


def _needle(arm: str, seed: int) -> list[dict]:
    return [{"context": c, "depth": d, "accuracy": 0.0} for c in (64, 128) for d in (0.0, 50.0, 100.0)]


def _comparison(baseline: str | None = None, seeds: int = 2) -> ProbeComparison:
    """The demo ladder's 15 arms x ``seeds``, both tables built as compare_probes builds them."""
    from dataclasses import replace

    groups, notes = arm_groups(ARMS, KIND, SIZE, ARMS, baseline)
    tables = []
    for spec, rows in ((NEEDLE, _needle), (NLL, _nll)):
        records = [(a, _record(a, s, spec.table, rows(a, s))) for a in ARMS for s in range(seeds)]
        for g in groups:
            t = build_table(spec.table, spec, [(a, r) for a, r in records if a in g.arms], g.arms, g.baseline)
            tables.append(replace(t, size=g.size, baseline=g.baseline))
    return ProbeComparison(sweep="demo-ladder", experiment="demo-ladder", level=0.95, step=None, arms=tuple(ARMS),
                           tables=tables, notes=notes, groups=tuple(groups), kinds=KIND, sizes=SIZE,
                           baseline=groups[0].baseline if len(groups) == 1 else None)


def test_a_ladder_compares_each_size_with_its_own_transformer():
    groups, notes = arm_groups(ARMS, KIND, SIZE, ARMS)
    assert [(g.size, g.baseline) for g in groups] == [(s, f"transformer-{s}") for s in SIZES] and notes == []
    assert [g.arms for g in groups] == [tuple(f"{k}-{s}" for k in KINDS) for s in SIZES]
    # kind-major grid order: the same groups (the baseline kind is the first evaluated arm's)
    kind_major = [f"{k}-{s}" for k in KINDS for s in SIZES]
    assert [(g.size, g.baseline) for g in arm_groups(kind_major, KIND, SIZE, kind_major)[0]] == [
        (s, f"transformer-{s}") for s in SIZES]
    # the smallest Transformer not evaluated: its size's Transformer stays the baseline (the differences
    # are left out), and the other sizes keep theirs
    evaluated = [a for a in ARMS if a != "transformer-tiny-3xs"]
    assert arm_groups(ARMS, KIND, SIZE, evaluated)[0][0].baseline == "transformer-tiny-3xs"
    # a size without an arm of the baseline kind: its first evaluated arm, said in a note
    no_t = [a for a in ARMS if a != "transformer-tiny-m"]
    groups, notes = arm_groups(no_t, KIND, SIZE, no_t)
    assert groups[-1].baseline == "diff_v1-tiny-m" and notes == [
        "size tiny-m has no transformer arm; its arms are compared with diff_v1-tiny-m"]


def test_an_explicit_baseline_or_one_size_gives_one_table_of_every_arm():
    groups, _ = arm_groups(ARMS, KIND, SIZE, ARMS, baseline="transformer-tiny-3xs")
    assert [(g.size, g.arms, g.baseline) for g in groups] == [(None, tuple(ARMS), "transformer-tiny-3xs")]
    one = [a for a in ARMS if SIZE[a] == "tiny-m"]  # --only tiny-m
    assert [(g.size, g.baseline) for g in arm_groups(one, KIND, SIZE, one)[0]] == [(None, "transformer-tiny-m")]


def test_the_ladder_report_has_one_table_per_size_with_three_arms_and_two_differences():
    result = _comparison()
    (needle, nll) = sections(result.tables)
    assert [t.size for t in nll] == list(SIZES) and all(len(t.cells) == 5 for t in nll)
    text = markdown(result, ["needle.png", "nll_position.png"])
    for s in SIZES:
        assert f"### size {s}: its arms against transformer-{s}" in text
        header = (f"| position | value | transformer-{s} | diff_v1-{s} | diff_v2-{s} | diff_v1-{s} − transformer-{s} "
                  f"(95% CI) | diff_v2-{s} − transformer-{s} (95% CI) |")
        assert header in text
    widths = {line.count("|") - 1 for line in text.splitlines() if line.startswith("| position")}
    assert widths == {7}  # 1 key + value + 3 arms + 2 differences (the old layout: 33)
    # each difference is against its own size's Transformer: the shifts above make it -0.1 / -0.2 at every size
    for t in nll:
        for c in t.cells:
            assert sorted(round(d.delta, 9) for d in c.differences) == [-0.2, -0.1]
            assert all(d.pairs == 2 for d in c.differences)
    # the old layout on request: one table of all 15 arms against the smallest Transformer
    old = markdown(_comparison(baseline="transformer-tiny-3xs"), ["needle.png", "nll_position.png"])
    assert "### size" not in old
    assert {line.count("|") - 1 for line in old.splitlines() if line.startswith("| position")} == {2 + 15 + 14}


def test_fifteen_arms_have_distinct_colour_and_style_by_kind_and_size():
    styles = arm_styles(ARMS, KIND, SIZE)
    assert len({(s.color, s.linestyle, s.marker) for s in styles.values()}) == 15
    assert len({(s.color, s.hatch) for s in styles.values()}) == 15
    assert len({s.color for s in styles.values()}) == 3  # one colour per kind ...
    for k, s in itertools.product(KINDS, SIZES):  # ... and one marker per size, the same in every kind
        assert styles[f"{k}-{s}"].color == styles[f"{k}-tiny-3xs"].color
        assert styles[f"{k}-{s}"].marker == styles[f"transformer-{s}"].marker
    # many arms of one kind and size (an ablation) and more kinds than a palette: still distinct
    arms = [f"k{i}-a{j}" for i in range(25) for j in range(3)]
    styles = arm_styles(arms, {a: a.split("-")[0] for a in arms}, dict.fromkeys(arms, "one"))
    assert len({(s.color, s.linestyle, s.marker) for s in styles.values()}) == len(arms)


def _drawn_points(fig) -> list[tuple[float, float]]:
    """Every plotted point, bar top and bar base in display coordinates."""
    points = []
    for ax in fig.axes:
        for line in ax.get_lines():
            points += [tuple(p) for p in ax.transData.transform(line.get_xydata())]
        for patch in ax.patches:
            box = patch.get_window_extent()
            points += [(box.x0, box.y0), (box.x1, box.y1)]
    return points


@pytest.mark.parametrize("table", ["needle", "nll_position"])
def test_the_legend_is_outside_every_panel_and_covers_no_point(table):
    result = _comparison()
    tables = next(s for s in sections(result.tables) if s[0].probe == table)
    fig = figure(tables, result)
    fig.canvas.draw()
    (legend,) = [lg for ax in fig.axes if (lg := ax.get_legend()) is not None]
    assert [t.get_text() for t in legend.get_texts()] == ARMS
    box = legend.get_window_extent()
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent())
    assert not any(box.x0 <= x <= box.x1 and box.y0 <= y <= box.y1 for x, y in _drawn_points(fig))
    for ax in fig.axes:  # every panel says what its y axis is (nll_position's had none)
        assert ax.get_ylabel() == ax.get_title() != ""


def test_a_needle_plot_of_all_zeros_spans_zero_to_one_not_plus_minus_a_few_hundredths():
    result = _comparison()
    (needle,) = [s for s in sections(result.tables) if s[0].probe == "needle"]
    fig = figure(needle, result)
    lo, hi = fig.axes[0].get_ylim()
    assert lo <= 0 and hi >= 1 and lo > -0.1 and hi < 1.1


def test_a_declared_natural_range_is_kept_and_data_with_spread_keeps_its_own():
    from types import SimpleNamespace

    result = _comparison(seeds=1)
    (nll,) = [s for s in sections(result.tables) if s[0].probe == "nll_position"]
    lo, hi = figure(nll, result).axes[0].get_ylim()
    assert 3.5 < lo < hi < 6.5  # spread: matplotlib's range around the curves (5.96 down to 4.0)
    ranged = SimpleNamespace(**{f: getattr(NLL, f) for f in ("table", "title", "keys", "values", "where",
                                                           "mean_over", "x", "log_x")},
                             ranges=(("cumulative", (0.0, 10.0)),))
    from dataclasses import replace

    lo, hi = figure([replace(t, spec=ranged) for t in nll], result).axes[0].get_ylim()
    assert lo <= 0 and hi >= 10
