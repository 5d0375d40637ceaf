"""In-context learning (paper §3.5): many-shot classification accuracy (Fig. 6) and its robustness
to the order of the demonstrations (Fig. 7).

The data is a local labelled file (``data``): JSON lines ``{"text": ..., "label": ...}`` (both
non-empty strings). A prompt is ``DEMONSTRATION`` per shot, then ``QUERY``; the prediction is
constrained decoding over the file's sorted label set (the paper's protocol, after Ratner et al.,
2023): the label whose ``CONTINUATION`` has the largest total log-likelihood. ``IclProbe``'s
docstring defines the scoring, the many-shot curve and the robustness test exactly. Everything
random is ``random.Random`` seeded by a string (SHA-512: the same draws everywhere).

See docs/eval.md, 'The probes'.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from diffsweep.config import Config, ConfigError
from diffsweep.config.kinds import display_color, display_name
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, TableComparison, save_figure

DEMONSTRATION = "Input: {text}\nLabel: {label}\n\n"
QUERY = "Input: {text}\nLabel:"
CONTINUATION = " {label}"


@dataclass(frozen=True)
class IclSettings:
    """``data``: the labelled JSONL file; ``shots``: demonstration counts of the many-shot curve;
    ``permutations``: random orders of the robustness set; ``robust_shots``: its size (0: the largest
    fitting shot count); ``queries``: held-out test examples; ``seeds``: demonstration sets per shot
    count; ``batch``: sequences (query x label) per forward pass."""

    data: str = ""
    shots: tuple[int, ...] = (1, 2, 4, 8, 16)
    permutations: int = 10
    robust_shots: int = 0
    queries: int = 100
    seeds: int = 3
    batch: int = 8


@dataclass(frozen=True)
class Example:
    """One labelled text of the data file."""

    text: str
    label: str


def load_examples(path: str | Path) -> list[Example]:
    """The examples of a JSONL file; a missing or malformed file is a ``ConfigError`` on ``icl.data``
    naming the file (and line)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("icl.data", f"{path}: not found; expected a JSONL file of {{\"text\": ..., \"label\": ...}}")
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError("icl.data", f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or set(row) != {"text", "label"}:
            raise ConfigError("icl.data", f"{path}:{number}: expected an object with keys text and label, got {line[:80]!r}")
        if not all(isinstance(row[k], str) and row[k].strip() for k in ("text", "label")):
            raise ConfigError("icl.data", f"{path}:{number}: text and label must be non-empty strings")
        out.append(Example(row["text"], row["label"]))
    if len({e.label for e in out}) < 2:
        raise ConfigError("icl.data", f"{path}: expected at least 2 distinct labels, got {sorted({e.label for e in out})}")
    return out


def labels_of(examples: Sequence[Example]) -> list[str]:
    """The label set, sorted (the order of scores, and of ties)."""
    return sorted({e.label for e in examples})


def prompt(demonstrations: Sequence[Example], query: Example) -> str:
    """The prompt text (see ``IclProbe``): the demonstrations in order, then the query."""
    shots = "".join(DEMONSTRATION.format(text=d.text, label=d.label) for d in demonstrations)
    return shots + QUERY.format(text=query.text)


def split(examples: Sequence[Example], queries: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(queries, pool): ``queries`` held-out examples (in file order) and the rest."""
    rng = random.Random(f"diffsweep.icl/{seed}/queries/{queries}")
    held = set(rng.sample(range(len(examples)), queries))
    return ([e for i, e in enumerate(examples) if i in held], [e for i, e in enumerate(examples) if i not in held])


def pool_order(pool: Sequence[Example], seed: int, draw: int) -> list[Example]:
    """Draw ``draw``'s random order of the pool: its k-shot set is the first k."""
    rng = random.Random(f"diffsweep.icl/{seed}/demonstrations/{draw}")
    return rng.sample(list(pool), len(pool))


def balanced(pool: Sequence[Example], shots: int, seed: int) -> list[Example]:
    """``shots`` demonstrations with the classes as even as the pool allows: classes take turns
    (in a random order), each giving its next random example."""
    rng = random.Random(f"diffsweep.icl/{seed}/robust/{shots}")
    classes = labels_of(pool)
    rng.shuffle(classes)
    members = {c: rng.sample([e for e in pool if e.label == c], sum(e.label == c for e in pool)) for c in classes}
    return alternate([e for c in classes for e in members[c]], classes)[:shots]


def alternate(demonstrations: Sequence[Example], classes: Sequence[str]) -> list[Example]:
    """Classes take turns (in the order ``classes``), each class's examples in their given order;
    when a class runs out the others go on."""
    queues = [[d for d in demonstrations if d.label == c] for c in classes]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def grouped(demonstrations: Sequence[Example], classes: Sequence[str]) -> list[Example]:
    """All of one class, then the next (in the order ``classes``), each class's in its given order."""
    return [d for c in classes for d in demonstrations if d.label == c]


def orders(size: int, count: int, seed: int) -> list[tuple[int, ...]]:
    """``min(count, size!)`` distinct random permutations of ``range(size)``."""
    rng = random.Random(f"diffsweep.icl/{seed}/permutations/{size}/{count}")
    if math.factorial(size) <= count:
        every = list(itertools.permutations(range(size)))
        rng.shuffle(every)
        return every
    out: dict[tuple[int, ...], None] = {}
    while len(out) < count:
        out[tuple(rng.sample(range(size), size))] = None
    return list(out)


@torch.no_grad()
def label_log_likelihoods(ctx: EvalContext, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                          batch: int) -> np.ndarray:
    """``(len(prompts), len(continuations))``: the total log-likelihood (float64 sum of fp32
    log-probabilities) of each continuation's tokens after each prompt. Sequences of one forward pass
    are right-padded (causal attention: padding after a sequence does not change its logits)."""
    rows = [(q, c) for q in range(len(prompts)) for c in range(len(continuations))]
    out = np.zeros((len(prompts), len(continuations)))
    ctx.model.eval()
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        seqs = [list(prompts[q]) + list(continuations[c]) for q, c in chunk]
        width = max(len(s) for s in seqs) - 1
        inputs = torch.zeros(len(chunk), width, dtype=torch.long)
        targets = torch.full((len(chunk), width), -1, dtype=torch.long)  # -1: not a continuation token
        for r, ((q, c), seq) in enumerate(zip(chunk, seqs, strict=True)):
            inputs[r, : len(seq) - 1] = torch.tensor(seq[:-1])
            start = len(prompts[q]) - 1  # the logits at position t predict token t + 1
            targets[r, start : start + len(continuations[c])] = torch.tensor(continuations[c])
        with ctx.autocast():
            logits = ctx.model(inputs.to(ctx.device))
        logp = torch.log_softmax(logits.float(), dim=-1).cpu()
        picked = logp.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1).double()
        sums = (picked * (targets >= 0)).sum(-1)
        for r, (q, c) in enumerate(chunk):
            out[q, c] = float(sums[r])
    return out


@dataclass
class Task:
    """What every evaluation of a run shares: the queries, their labels' token ids, the fit limit."""

    ctx: EvalContext
    queries: list[Example]
    pool: list[Example]
    labels: list[str]
    continuations: list[list[int]]
    batch: int

    def prompts(self, demonstrations: Sequence[Example]) -> list[list[int]]:
        return [self.ctx.tokenizer.encode(prompt(demonstrations, q)) for q in self.queries]

    def longest(self, prompts: Sequence[Sequence[int]]) -> int:
        """The longest model input of these prompts (prompt + longest continuation - 1)."""
        return max(len(p) for p in prompts) + max(len(c) for c in self.continuations) - 1

    def fits(self, prompts: Sequence[Sequence[int]]) -> bool:
        return self.longest(prompts) <= self.ctx.config.train.seq_len

    def predict(self, prompts: Sequence[Sequence[int]]) -> list[str]:
        scores = label_log_likelihoods(self.ctx, prompts, self.continuations, self.batch)
        return [self.labels[int(i)] for i in scores.argmax(1)]

    def accuracy(self, prompts: Sequence[Sequence[int]]) -> float:
        predicted = self.predict(prompts)
        return sum(p == q.label for p, q in zip(predicted, self.queries, strict=True)) / len(self.queries)


class IclProbe(Probe):
    """Many-shot accuracy (Fig. 6) and its robustness to demonstration order (Fig. 7).

    Prompt (``DEMONSTRATION`` per shot, then ``QUERY``), encoded as one string::

        Input: {text}\\nLabel: {label}\\n\\n      (each demonstration)
        Input: {text}\\nLabel:                  (the query)

    Each label's continuation ``" {label}"`` is encoded on its own and appended to the prompt's
    tokens; the prediction is the label whose continuation tokens have the largest total
    log-likelihood (the exact sum of the model's log-probabilities of those tokens, fp32 log-softmax;
    the first label in sorted order on a tie). The model's input is prompt + continuation without its
    last token; it must be at most ``train.seq_len`` tokens for the longest label ("fits").

    - Queries: ``queries`` examples of the file, drawn once (keyed by the context's seed); the
      demonstrations are drawn from the rest (the pool).
    - Many-shot curve (Fig. 6): for each of ``seeds`` demonstration sets, seed s orders the pool at
      random and its k-shot set is the first k of that order (sets grow by adding demonstrations), in
      that order. ``icl/shots_XX/accuracy`` is the mean accuracy over the seeds. A shot count for which
      some prompt does not fit is skipped with a note.
    - Robustness (Fig. 7): one class-balanced set of ``robust_shots`` demonstrations (0: the largest
      shot count of the curve that fits; a balanced set that does not fit steps down, with a note),
      evaluated in ``permutations`` distinct random orders (``icl/robust/mean``, ``std`` (population),
      ``best``, ``worst``, ``margin`` = best − worst, the paper's dashed lines), and in two fixed
      arrangements: ``alternate`` (classes take turns, Fig. 7b's "alternately arranged by class") and
      ``grouped`` (sorted by class, all of one class before the next).
    """

    name = "icl"
    summary = "many-shot in-context classification accuracy and its spread under demonstration order permutations"
    cites = "Fig. 6, Fig. 7, §3.5"
    Settings: ClassVar[type] = IclSettings
    defaults_shown = {"data": "required: JSON lines {\"text\", \"label\"}", "robust_shots": "0: the largest that fits"}
    headline = "icl/robust/mean"
    comparisons = (
        TableComparison(table="icl_curve", title="Fig. 6: in-context classification accuracy by demonstrations "
                        "(mean over demonstration sets)", keys=("shots",), values=("accuracy",), x="shots", log_x=True),
        TableComparison(table="icl_robust", title="Fig. 7: accuracy over permutations of one demonstration set "
                        "(margin: best - worst)", keys=("shots",), values=("mean", "best", "worst", "margin")),
    )

    def check(self, settings: IclSettings, config: Config) -> None:
        if not settings.data:
            raise ConfigError("icl.data", "expected the path of a JSONL file of {\"text\": ..., \"label\": ...}")
        for key in ("permutations", "queries", "seeds", "batch"):
            if getattr(settings, key) < 1:
                raise ConfigError(f"icl.{key}", f"expected a positive integer, got {getattr(settings, key)}")
        if not settings.shots or min(settings.shots) < 1:
            raise ConfigError("icl.shots", f"expected positive demonstration counts, got {list(settings.shots)}")
        if settings.robust_shots < 0:
            raise ConfigError("icl.robust_shots", f"expected a demonstration count (0: the largest fitting shot "
                              f"count), got {settings.robust_shots}")
        examples = load_examples(settings.data)
        if settings.queries >= len(examples):
            raise ConfigError("icl.queries", f"{settings.data} has {len(examples)} examples; {settings.queries} "
                              "queries leave no demonstrations")
        pool = len(examples) - settings.queries
        for key, value in (("shots", max(settings.shots)), ("robust_shots", settings.robust_shots)):
            if value > pool:
                raise ConfigError(f"icl.{key}", f"{value} demonstrations, more than the {pool} examples of "
                                  f"{settings.data} left after {settings.queries} queries")

    def run(self, ctx: EvalContext, settings: IclSettings) -> ProbeResult:
        self.check(settings, ctx.config)
        examples = load_examples(settings.data)
        queries, pool = split(examples, settings.queries, ctx.seed)
        labels = labels_of(examples)
        task = Task(ctx, queries, pool, labels, [ctx.tokenizer.encode(CONTINUATION.format(label=a)) for a in labels],
                    settings.batch)
        result = ProbeResult()
        curve = many_shot(task, settings, result)
        robust = robustness(task, settings, sorted(curve, reverse=True), result)
        accs = [r["accuracy"] for r in robust if r["arrangement"] == "random"]
        result.metrics |= {
            "icl/robust/shots": float(robust[0]["shots"]),
            "icl/robust/mean": float(np.mean(accs)), "icl/robust/std": float(np.std(accs)),
            "icl/robust/best": max(accs), "icl/robust/worst": min(accs), "icl/robust/margin": max(accs) - min(accs),
        }
        for r in robust:
            if r["arrangement"] != "random":
                result.metrics[f"icl/robust/{r['arrangement']}"] = r["accuracy"]
        result.tables["icl_permutations"] = robust
        # one row per shot count and one for the robustness summary: what ``compare --probes`` sets side by side
        result.tables["icl_curve"] = [{"shots": k, "accuracy": v} for k, v in sorted(curve.items())]
        result.tables["icl_robust"] = [{"shots": robust[0]["shots"], **{k.removeprefix("icl/robust/"): v for k, v in
                                                                       result.metrics.items()
                                                                       if k.startswith("icl/robust/")
                                                                       and k != "icl/robust/shots"}}]
        kind = ctx.config.model.attention.kind
        result.files.append(plot(result.tables["icl_shots"], robust, len(labels), ctx.out_dir / "icl.png",
                                 display_name(kind), display_color(kind)))
        return result


def many_shot(task: Task, settings: IclSettings, result: ProbeResult) -> dict[int, float]:
    """Fig. 6: mean accuracy by shot count (those that fit); rows, metrics, series and notes into ``result``."""
    rows: list[dict[str, Any]] = []
    curve: dict[int, float] = {}
    orders_ = [pool_order(task.pool, task.ctx.seed, s) for s in range(settings.seeds)]
    for shots in sorted(set(settings.shots)):
        prompts = [task.prompts(order[:shots]) for order in orders_]
        longest = max(task.longest(p) for p in prompts)
        if longest > task.ctx.config.train.seq_len:
            result.notes.append(f"{shots} shots skipped: the longest prompt with its label is {longest} tokens, more "
                                f"than train.seq_len = {task.ctx.config.train.seq_len}")
            continue
        accs = [task.accuracy(p) for p in prompts]
        rows += [{"shots": shots, "seed": s, "accuracy": a, "longest": longest} for s, a in enumerate(accs)]
        curve[shots] = float(np.mean(accs))
        result.metrics[f"icl/shots_{shots:02d}/accuracy"] = curve[shots]
    if not curve:
        raise ConfigError("icl.shots", f"no shot count of {list(settings.shots)} fits train.seq_len = "
                          f"{task.ctx.config.train.seq_len} ({'; '.join(result.notes)})")
    result.series["icl/accuracy_by_shots"] = curve
    result.tables["icl_shots"] = rows
    return curve


def robustness(task: Task, settings: IclSettings, fitting: list[int], result: ProbeResult) -> list[dict[str, Any]]:
    """Fig. 7: accuracy of one balanced demonstration set in random orders and in the alternate and
    grouped arrangements; one row per arrangement."""
    seq_len = task.ctx.config.train.seq_len
    for shots in [settings.robust_shots] if settings.robust_shots else fitting:
        demos = balanced(task.pool, shots, task.ctx.seed)
        arrangements = [("random", i, [demos[j] for j in order])
                        for i, order in enumerate(orders(shots, settings.permutations, task.ctx.seed))]
        arrangements += [("alternate", 0, alternate(demos, labels_of(demos))),
                         ("grouped", 0, grouped(demos, labels_of(demos)))]
        prompts = [task.prompts(arranged) for _, _, arranged in arrangements]
        longest = max(task.longest(p) for p in prompts)
        if longest <= seq_len:
            break
        result.notes.append(f"robustness: {shots} balanced demonstrations do not fit ({longest} tokens > "
                            f"train.seq_len = {seq_len})")
    else:
        key = "icl.robust_shots" if settings.robust_shots else "icl.shots"
        raise ConfigError(key, f"no demonstration set for the robustness test fits train.seq_len = {seq_len}")
    if len(arrangements) - 2 < settings.permutations:
        result.notes.append(f"robustness: {shots} demonstrations have only {len(arrangements) - 2} orders "
                            f"(permutations = {settings.permutations})")
    return [{"arrangement": name, "index": i, "shots": shots, "labels": [d.label for d in arranged],
             "accuracy": task.accuracy(p)} for (name, i, arranged), p in zip(arrangements, prompts, strict=True)]


def plot(shot_rows: list[dict[str, Any]], robust: list[dict[str, Any]], num_labels: int, path: Path, name: str,
         color: str | None) -> Path:
    """Fig. 6's curve (accuracy against shots, log x; a dot per seed) beside Fig. 7's spread
    (a dot per random order, dashed best and worst, the alternate and grouped arrangements)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    color = color or "C0"
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 4.0), gridspec_kw={"width_ratios": [2, 1]},
                                   sharey=True)
    shots = sorted({r["shots"] for r in shot_rows})
    means = [float(np.mean([r["accuracy"] for r in shot_rows if r["shots"] == k])) for k in shots]
    left.scatter([r["shots"] for r in shot_rows], [r["accuracy"] for r in shot_rows], color=color, alpha=0.35, s=14)
    left.plot(shots, means, "o-", color=color, label=name)
    left.axhline(1 / num_labels, color="gray", ls=":", label="chance")
    left.set_xscale("log", base=2)
    left.set_xticks(shots, [str(k) for k in shots])
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("demonstrations (shots)")
    left.set_ylabel("accuracy")
    left.set_title("many-shot ICL (Fig. 6)", fontsize="medium")
    left.legend()
    left.grid(True, which="both", alpha=0.3)
    accs = [r["accuracy"] for r in robust if r["arrangement"] == "random"]
    jitter = np.random.default_rng(0).uniform(-0.12, 0.12, len(accs))
    right.scatter(jitter, accs, color=color, s=18, label="random orders")
    for y in (max(accs), min(accs)):
        right.axhline(y, color=color, ls="--", lw=1)
    for x, (arrangement, marker) in enumerate((("alternate", "s"), ("grouped", "^")), 1):
        right.scatter([x], [r["accuracy"] for r in robust if r["arrangement"] == arrangement], color="k",
                      marker=marker)
    right.set_xticks([0, 1, 2], ["random", "alternate", "grouped"])
    right.set_title(f"{robust[0]['shots']} shots: margin {max(accs) - min(accs):.3f} (Fig. 7)", fontsize="medium")
    right.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, path)
