"""The runs ``diffsweep suggest`` may propose besides a sweep's planned ones, priced in GPU-hours:
another seed of a measured point (another run of a run family), a run at a new size or token count,
a new cooldown branch of a measured run, and a run beyond the end of a tuning grid where a best
candidate sits at its edge. ``diffsweep.scaling.suggest.preposterior`` scores them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from diffsweep.config import ConfigError
from diffsweep.config.units import human
from diffsweep.scaling.suggest.preposterior import Candidate, Design

FLOPS_PER_TOKEN_PER_PARAM = 6.0  # training FLOPs ≈ 6·N·D (Kaplan et al. 2020, §2.1)


DEFAULT_COOLDOWN = 0.2  # a new cooldown branch's decay, as a fraction of its tokens, where nothing says otherwise


def extra_candidates(points: pd.DataFrame, design: Design, x_column: str, flops_per_gpu_hour: float,
                     sizes: Sequence[float] = (), seeds: bool = True,
                     cooldown: float | Callable[[float], float] = DEFAULT_COOLDOWN) -> list[Candidate]:
    """Candidates besides planned runs, for both architectures of the ratio: another seed of every
    measured point (``seeds``), and a run at each of ``sizes`` (N on a size ladder, tokens on a token
    axis). Tokens of a new size follow the ladder: the same tokens per parameter if the runs scale
    them together, else the tokens of the nearest measured size. Cost: 6·N·D FLOPs at
    ``flops_per_gpu_hour``. Where runs give several points (run families: ``_family_candidates``),
    another seed is another run of a family, and a token count of ``sizes`` is also a new cooldown
    branch of each measured run that trained past it; ``cooldown``: a branch's share that decays,
    or the tokens its cooldown trains as a function of its tokens."""
    used = points[points["used"]]
    out: list[Candidate] = []
    for name in (design.baseline, design.candidate):
        rows = used[used["arch"] == name]
        def cost(n: float, d: float) -> float:
            return FLOPS_PER_TOKEN_PER_PARAM * n * d / flops_per_gpu_hour

        families = design.families.get(name, np.array([]))
        multi = len(families) > 0 and np.unique(families, return_counts=True)[1].max() > 1
        if multi:
            trains = cooldown if callable(cooldown) else (lambda d, share=cooldown: share * d)
            out += _family_candidates(rows, families, design, name, x_column, cost, sizes, seeds, trains)
        cells = rows.drop_duplicates(subset=[x_column, "tokens"] if design.axis == "N" else ["tokens"])
        if seeds and not multi:
            for _, r in cells.iterrows():
                n, d = float(r["num_params"]), float(r["tokens"])
                x = float(r[x_column]) if design.axis == "N" else d
                other = d if design.other_ref is not None else 0.0
                out.append(Candidate(name, x, cost(n, d), n, d, other=other, origin="seed", repeatable=True))
        for size in sizes:
            if np.isclose(design.measured[name], size, rtol=1e-6).any():
                continue  # measured already: its seed candidate covers it
            if design.axis == "D":
                n, d = float(rows["num_params"].median()), float(size)
            else:
                if x_column != "num_params":
                    raise ConfigError("sizes", "new sizes need total parameter counts; refit with --count total")
                n = float(size)
                per_param = rows["tokens"] / rows["num_params"]
                if rows["tokens"].nunique() > 1 and per_param.max() / per_param.min() < 1.05:
                    d = float(per_param.median() * n)
                else:
                    nearest = (np.log(rows["num_params"].to_numpy(float)) - np.log(n)) ** 2
                    d = float(rows["tokens"].to_numpy(float)[np.argmin(nearest)])
            other = d if design.other_ref is not None else 0.0
            x = n if design.axis == "N" else d
            out.append(Candidate(name, x, cost(n, d), n, d, other=other, origin="extra", repeatable=True))
    return out


def _family_candidates(rows: pd.DataFrame, families: np.ndarray, design: Design, name: str, x_column: str,
                       cost: Callable[[float, float], float], sizes: Sequence[float], seeds: bool,
                       cooldown: Callable[[float], float]) -> list[Candidate]:
    """Where runs give several points: another seed of each measured family (one per distinct set of
    points: a new run with its own offset giving them all, at the cost of its run, its cooldown
    branches' cooldowns (``cooldown``: the tokens a branch of D tokens trains), its checkpoints
    free), and, on a token axis, a new cooldown branch at each token count of ``sizes`` of every
    family with branches whose run trained past it (the family's offset, its cooldown to pay; it needs the run's
    checkpoint at its branch point: a sweep's ``branches`` pin it before the run passes it)."""
    out: list[Candidate] = []
    parent = rows["parent"].astype(str) if "parent" in rows.columns else pd.Series("", index=rows.index)
    point = rows["point"].astype(str)
    shapes: set[tuple] = set()
    for f in dict.fromkeys(families):
        fam = rows[families == f]
        n = float(fam["num_params"].median())
        is_branch, is_final = (parent[families == f] != "").to_numpy(), (point[families == f] == "final").to_numpy()
        tokens = fam["tokens"].to_numpy(float)
        xs = (fam[x_column].to_numpy(float) if design.axis == "N" else tokens)
        others = tokens if design.other_ref is not None else np.zeros(len(fam))
        pts = tuple(sorted(zip(xs.tolist(), others.tolist(), strict=True)))
        run_tokens = float(tokens[~is_branch].max()) if (~is_branch).any() else float(tokens.max())
        if seeds and (key := tuple(np.round(np.log(np.maximum(pts, 1e-300)), 9).ravel())) not in shapes:
            shapes.add(key)
            spent = (cost(n, float(tokens[~is_branch & is_final].sum()))
                     + cost(n, float(sum(cooldown(float(d)) for d in tokens[is_branch]))))
            if not (~is_branch & is_final).any():  # the run itself not measured: it trains to its longest point
                spent += cost(n, run_tokens)
            out.append(Candidate(name, pts[0][0], spent, n, run_tokens, other=pts[0][1], origin="seed",
                                 repeatable=True, more=pts[1:], like=str(f)))
        if design.axis != "D" or not is_branch.any():
            continue
        for size in sizes:
            if size >= run_tokens or np.isclose(tokens, size, rtol=1e-6).any():
                continue
            out.append(Candidate(name, float(size), cost(n, cooldown(float(size))), n, float(size),
                                 other=float(size) if design.other_ref is not None else 0.0, origin="branch",
                                 family=str(f)))
    return out


def beyond_edges(tuning: dict | None, points: pd.DataFrame, design: Design, x_column: str,
                 flops_per_gpu_hour: float) -> list[Candidate]:
    """For a best-of-grid fit (``tuning``: ``FitResult.tuning``), a run at the next value beyond the
    end of each tuning grid where a cell of the ratio's two architectures has its best candidate:
    the fit assumes every cell's optimum inside its grid, and a best at an end makes that doubtful.
    The next value steps as the grid's last step does (by the same factor for a positive grid, the
    same difference otherwise); it is run with as many seeds as the best candidate, each priced like
    an extra run (6·N·D FLOPs at ``flops_per_gpu_hour``). Its loss cannot be simulated from the fit
    (whether it beats the best is what it finds out), so it is not ranked: ``suggest`` lists it first."""
    if not tuning:
        return []
    out = []
    for cell in tuning["cells"]:
        if cell["arch"] not in (design.baseline, design.candidate) or cell["untuned"] or not cell["edge"]:
            continue
        rows = points[(points["arch"] == cell["arch"]) & np.isclose(points[x_column].astype(float), cell["x"])
                      & (points["tuned"] == "best")]
        if design.other_ref is not None:
            rows = rows[np.isclose(rows["tokens"].astype(float), cell["tokens"])]
        if rows.empty:
            continue
        n, d, runs = float(rows["num_params"].iloc[0]), float(rows["tokens"].iloc[0]), len(rows)
        for col in tuning["columns"]:
            tried = sorted({k["value"][col] for k in cell["candidates"] if isinstance(k["value"][col], float)})
            try:
                value = float(cell["winner_values"][col])
            except (TypeError, ValueError):
                continue
            if len(tried) < 2 or value not in (tried[0], tried[-1]):
                continue
            last, inner = (tried[-1], tried[-2]) if value == tried[-1] else (tried[0], tried[1])
            beyond = last * (last / inner) if all(t > 0 for t in tried) else last + (last - inner)
            out.append(Candidate(cell["arch"], cell["x"], runs * FLOPS_PER_TOKEN_PER_PARAM * n * d / flops_per_gpu_hour,
                                 n, d, other=d if design.other_ref is not None else 0.0,
                                 name=(f"{cell['arch']} @ {human(cell['x'])}, {col}={beyond:g} "
                                       f"({runs} run{'s' if runs != 1 else ''}: beyond its best {col}={value:g})"),
                                 origin="beyond-edge"))
    return out
