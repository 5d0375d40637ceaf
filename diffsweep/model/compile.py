"""``torch.compile`` for training and ``bench model``: each block's ``forward`` compiled in place, as
torchtitan compiles per block, so that every layer reuses the first layer's graph (one compile per
kind, whatever the depth), parameter names stay those of the eager model (checkpoints are
interchangeable) and the hooks FSDP2 and activation checkpointing put around a block stay eager.

``train.compile`` decides (``use_compile``; the rule is ``diffsweep.config.enums.compiles``, which
``plan`` reads too): ``auto`` compiles where training uses CUDA and the attention backend is
checked under ``torch.compile`` (``COMPILED_BACKENDS``), ``true`` compiles anywhere and refuses a
backend that is not checked, ``false`` never compiles.
Evaluation and probes run the same blocks eagerly (``eager``): their batches, grad mode and hooks
would each be a new graph, and they are a sliver of a run's compute.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from diffsweep.config import Backend, Compile, ConfigError
from diffsweep.config.enums import COMPILED_BACKENDS, compiles
from diffsweep.model.transformer import LanguageModel


def use_compile(setting: Compile, backend: Backend, device: torch.device) -> tuple[bool, str | None]:
    """Whether to compile, and a line to say once when ``auto`` leaves a GPU run eager. ``true``
    with a backend not checked under ``torch.compile`` is a ``ConfigError``."""
    checked = backend in COMPILED_BACKENDS
    if setting is Compile.TRUE and not checked:
        raise ConfigError("train.compile", f"true, but attention backend {backend.value!r} is not checked under "
                          "torch.compile; use model.attention.backend=sdpa, or train.compile=false")
    if setting is Compile.AUTO and device.type == "cuda" and not checked:
        return False, (f"note: training eagerly: attention backend {backend.value!r} is not checked under "
                       "torch.compile (train.compile=auto)")
    return compiles(setting, backend, cuda=device.type == "cuda"), None


def compile_blocks(model: LanguageModel) -> None:
    """Compile each block's forward in place (``fullgraph``: a graph break is an error, not a
    silent slow path)."""
    for block in model.blocks():
        block.forward = torch.compile(block.forward, fullgraph=True)  # type: ignore[method-assign]


def eager() -> AbstractContextManager:
    """Run compiled blocks eagerly inside (no new graph: evaluation, probes)."""
    return torch.compiler.set_stance("force_eager")


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process: a count that grows after the first step is a recompile."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileWatch:
    """A compiled training's per-step metrics: ``train/compile_s`` (the first step's seconds beyond the
    second's, once per process) and ``train/recompiles`` (graphs compiled since the first step: 0 in
    a healthy run), and a warning the first time that count grows."""

    def __init__(self) -> None:
        self._first_step_s: float | None = None  # this process's first step's seconds, until the second's
        self._graphs: int | None = None  # graphs compiled by the end of that step
        self._warned = False

    def metrics(self, step: int, seconds: float) -> tuple[dict[str, float], str | None]:
        graphs = compiled_graphs()
        if self._graphs is None:  # this process's first step
            self._first_step_s, self._graphs = seconds, graphs
            return {"train/recompiles": 0.0}, None
        out = {"train/recompiles": float(graphs - self._graphs)}
        if self._first_step_s is not None:
            out["train/compile_s"] = max(0.0, self._first_step_s - seconds)
            self._first_step_s = None
        if out["train/recompiles"] > 0 and not self._warned:
            self._warned = True
            return out, (f"warning: step {step}: torch.compile compiled a graph again after the first step "
                         "(a shape or setting changed); training goes on")
        return out, None
