"""Zero-shot downstream tasks through lm-evaluation-harness (paper §3.1, Table 1).

The paper compares DIFF Transformer and Transformer (3B, 1T tokens) on ARC-C, ARC-E, BoolQ,
HellaSwag, OpenBookQA, PIQA and WinoGrande, zero-shot, with lm-eval's accuracy (Table 1). This probe
runs any lm-eval task on a trained run through ``diffsweep.eval.lm_eval_adapter.DiffsweepLM``:
multiple-choice tasks score each choice by its log-likelihood after the prompt, truncated from the
left to the trained context; generation tasks decode greedily (up to the task's ``max_gen_toks``;
a task that sets none gets ``min(256, train.seq_len // 2)`` tokens).

Nothing is downloaded: lm-eval runs with Hugging Face's offline mode on (``HF_HUB_OFFLINE``,
``HF_DATASETS_OFFLINE``), so a task's dataset must be in the machine's Hugging Face cache (load it
once on a machine with network access, with the same ``HF_HOME``) or in local files. A task of
one's own is a directory of lm-eval task YAMLs (``downstream.include_path``); relative
``data_files`` in them are read from that directory (lm-eval runs inside it).

Needs the ``lm-eval`` package (``pip install 'diffsweep[lm-eval]'``); without it the probe stops
before anything runs.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import logging
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from diffsweep.config import Config, ConfigError, EnvironmentUnavailable
from diffsweep.data.hf import offline
from diffsweep.eval.probe import EvalContext, Probe, ProbeResult, TableComparison

# Table 1's tasks, by their lm-eval names.
PAPER_TASKS = ("arc_challenge", "arc_easy", "boolq", "hellaswag", "openbookqa", "piqa", "winogrande")
INSTALL = "pip install 'diffsweep[lm-eval]'"


@dataclass(frozen=True)
class DownstreamSettings:
    """``tasks``: lm-eval task (or group) names, Table 1's by default; ``include_path``: a
    directory of task YAMLs of one's own (added to lm-eval's); ``limit``: items per task (0: all);
    ``batch``: requests per forward pass; ``num_fewshot``: examples in each prompt (the paper's 0)."""

    tasks: tuple[str, ...] = PAPER_TASKS
    include_path: str = ""
    limit: int = 0
    batch: int = 8
    num_fewshot: int = 0


def require_lm_eval() -> None:
    """Raise ``EnvironmentUnavailable`` if lm-eval is not installed."""
    if importlib.util.find_spec("lm_eval") is None:
        raise EnvironmentUnavailable(f"downstream: needs the lm-eval package (lm-evaluation-harness): {INSTALL}")


def _module(name: str) -> Any:
    """An lm-eval (or dependency) module, imported now: they ship no type information (no
    py.typed), so mypy sees them as ``Any``."""
    return importlib.import_module(name)


_TASK_MANAGERS: dict[str, Any] = {}  # include_path -> lm_eval TaskManager (indexing its ~15k YAMLs takes seconds)


def task_manager(include_path: str) -> Any:
    """lm-eval's ``TaskManager`` with its own tasks and those under ``include_path`` (cached)."""
    key = str(Path(include_path).resolve()) if include_path else ""
    if key not in _TASK_MANAGERS:
        with _quiet():
            _TASK_MANAGERS[key] = _module("lm_eval.tasks").TaskManager(include_path=key or None)
    return _TASK_MANAGERS[key]


class DownstreamProbe(Probe):
    name = "downstream"
    summary = "zero-shot accuracy on lm-evaluation-harness tasks (ARC, BoolQ, HellaSwag, OBQA, PIQA, WinoGrande)"
    cites = "Table 1, §3.1"
    Settings: ClassVar[type] = DownstreamSettings
    defaults_shown = {"limit": "0: all", "include_path": "none; your own task YAMLs"}
    headline = "downstream/average"
    comparisons = (TableComparison(table="downstream", title="Table 1: zero-shot accuracy by task",
                                   keys=("task",), values=("value",), where=(("metric", "acc"),)),)

    def check(self, settings: DownstreamSettings, config: Config) -> None:
        for key, value, least in (("batch", settings.batch, 1), ("limit", settings.limit, 0),
                                  ("num_fewshot", settings.num_fewshot, 0)):
            if value < least:
                raise ConfigError(f"downstream.{key}", f"expected an integer >= {least}, got {value}")
        if settings.include_path and not Path(settings.include_path).is_dir():
            raise ConfigError("downstream.include_path", f"expected a directory of lm-eval task YAMLs, "
                              f"{settings.include_path!r} is none")
        if not settings.tasks:
            raise ConfigError("downstream.tasks", f"expected at least one lm-eval task, e.g. [{', '.join(PAPER_TASKS)}]")
        require_lm_eval()
        known = task_manager(settings.include_path).all_tasks
        for task in settings.tasks:
            if task not in known:
                close = difflib.get_close_matches(task, known, n=5, cutoff=0.6)
                hint = f"; close: [{', '.join(close)}]" if close else ""
                where = f" or in {settings.include_path}" if settings.include_path else ""
                raise ConfigError("downstream.tasks", f"unknown lm-eval task {task!r} (none of lm-eval's {len(known)} "
                                  f"tasks, groups and tags{where}){hint}")

    def run(self, ctx: EvalContext, settings: DownstreamSettings) -> ProbeResult:
        return evaluate_tasks(ctx, settings)


def evaluate_tasks(ctx: EvalContext, settings: DownstreamSettings) -> ProbeResult:
    """Run the tasks on ``ctx.model`` as it is now (``quantization`` runs them with its attention
    logits quantized) and ``summarize`` them."""
    require_lm_eval()
    simple_evaluate = _module("lm_eval.evaluator").simple_evaluate
    from diffsweep.eval.lm_eval_adapter import DiffsweepLM

    ctx.model.eval()
    seq_len = ctx.config.train.seq_len
    lm = DiffsweepLM(ctx.model, ctx.tokenizer, seq_len=seq_len, device=ctx.device, batch_size=settings.batch,
                     autocast=ctx.autocast, max_gen_toks=min(256, seq_len // 2))
    manager = task_manager(settings.include_path)
    with offline(), _quiet(), _inside(settings.include_path):
        try:
            output = simple_evaluate(
                model=lm, tasks=list(settings.tasks), num_fewshot=settings.num_fewshot,
                limit=settings.limit or None, task_manager=manager, log_samples=False, batch_size=settings.batch,
                random_seed=ctx.seed, numpy_random_seed=ctx.seed, torch_random_seed=ctx.seed,
                fewshot_random_seed=ctx.seed)
        except ConnectionError as exc:  # datasets' OfflineModeIsEnabled: a dataset not in the cache
            cache = _module("datasets.config").HF_DATASETS_CACHE
            raise EnvironmentUnavailable(
                f"downstream: {exc}; nothing is downloaded while evaluating: load the task's dataset once "
                f"with network access into this machine's Hugging Face cache ({cache}; see HF_HOME)") from exc
    assert output is not None  # None only on ranks other than 0
    return summarize(output)


def summarize(output: dict[str, Any]) -> ProbeResult:
    """Metrics and the ``downstream`` table from ``simple_evaluate``'s output: per task (groups'
    own aggregates are left out; their tasks are listed), each metric under its filter
    (``acc``; ``exact_match_strict-match`` for a filter other than ``none``) with its stderr;
    ``downstream/average``: the mean accuracy over the tasks that report one."""
    result = ProbeResult()
    samples = output.get("n-samples", {})
    accuracies = []
    for task, found in sorted(output["results"].items()):
        if task not in samples:  # a group: its tasks have their own entries
            continue
        for key, value in sorted(found.items()):
            metric, _, filter_ = key.partition(",")
            if not filter_ or metric.endswith("_stderr") or not isinstance(value, int | float):
                continue
            name = metric if filter_ == "none" else f"{metric}_{filter_}"
            stderr = found.get(f"{metric}_stderr,{filter_}")
            stderr = float(stderr) if isinstance(stderr, int | float) and math.isfinite(stderr) else None
            result.metrics[f"downstream/{task}/{name}"] = float(value)
            if stderr is not None:
                result.metrics[f"downstream/{task}/{name}_stderr"] = stderr
            result.tables.setdefault("downstream", []).append(
                {"task": task, "metric": name, "value": float(value), "stderr": stderr,
                 "samples": int(samples[task].get("effective", 0))})
            if name == "acc":
                accuracies.append(float(value))
    if accuracies:
        result.metrics["downstream/average"] = sum(accuracies) / len(accuracies)
    else:
        result.notes.append("downstream: no task reports an accuracy (acc); no average")
    return result


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval's and datasets' log lines and progress bars off (errors still show)."""
    import sys
    from functools import partial

    datasets, tqdm = _module("datasets"), _module("tqdm").tqdm

    loggers = [logging.getLogger(name) for name in ("lm_eval", "datasets", "huggingface_hub")]
    levels = [logger.level for logger in loggers]
    bars = datasets.is_progress_bar_enabled()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    datasets.disable_progress_bar()
    # lm-eval's bars (one per task while it builds requests); tqdm reads TQDM_DISABLE only at import.
    silent = partial(tqdm, disable=True)
    patched: list[Any] = [module for name, module in list(sys.modules.items())
                          if name.startswith("lm_eval") and getattr(module, "tqdm", None) is tqdm]
    for module in patched:
        module.tqdm = silent
    try:
        yield
    finally:
        for module in patched:
            module.tqdm = tqdm
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        if bars:
            datasets.enable_progress_bar()


@contextlib.contextmanager
def _inside(directory: str) -> Iterator[None]:
    """Work in ``directory`` (relative data files of a task YAML there are read from it), if set."""
    if not directory:
        yield
        return
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)
