"""The identity of an evaluation: what its result depends on, hashed into the key that lets a later
``diffsweep eval`` reuse it (docs/eval.md, "When a result is reused").

A result depends on the checkpoint (its weights), the validation data, the probe and its settings,
where it ran (device type, autocast dtype, attention backend) and the code that computed it. The
code is the source of the probe's module and of every module of the ``diffsweep`` and
``diffsweep_kernels`` packages it reaches (``code_modules``): each ``import`` in it, at the top or
inside a function, each module named by a string (``"diffsweep.model.attention.standard:Class"``,
as registries name their entries lazily), the packages' ``__init__``s on the way, and so on
transitively, from the probe and from the runner and loader that run it. An edit to any of them
(``eval/tap.py``, ``eval/needles.py``, the validation windows, the token-loss helpers, the model)
evaluates anew; an edit to a module none of them reaches (a plot of ``compare``) does not.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffsweep.eval.probe import Probe, settings_dict

if TYPE_CHECKING:
    from diffsweep.eval.loading import Trained

PACKAGES = ("diffsweep", "diffsweep_kernels")  # the code an evaluation runs (the model may call the kernels)


def _package_roots() -> dict[str, Path]:
    """The folder of each of ``PACKAGES`` as installed (found without importing it: the kernels
    import triton)."""
    roots: dict[str, Path] = {}
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            roots.setdefault(name, Path(location).resolve())
    return roots


RUNNERS = ("diffsweep.eval.runner", "diffsweep.eval.loading")  # what loads the model and runs every probe
_NAMED = re.compile(r"^((?:diffsweep|diffsweep_kernels)(?:\.\w+)*)(?::\w+)?$")  # "pkg.module" or "pkg.module:Attr"


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` of ``PACKAGES`` (None: not one of theirs, or no such module)."""
    top, _, rest = name.partition(".")
    root = _package_roots().get(top)
    if root is None:
        return None
    base = root.joinpath(*rest.split(".")) if rest else root
    for path in ((base.with_suffix(".py"),) if rest else ()) + (base / "__init__.py",):
        if path.is_file():
            return path
    return None


def _reached(name: str, source: str, is_package: bool) -> set[str]:
    """The modules of ``PACKAGES`` that module ``name``'s ``source`` imports or names, with the
    packages above each (their ``__init__`` runs on import)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # kept only where it is a module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (hit := _NAMED.match(node.value)):
            found.add(hit.group(1))
    with_parents: set[str] = set()
    for module in found:
        parts = module.split(".")
        with_parents.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {m for m in with_parents if m.partition(".")[0] in PACKAGES}


@functools.cache
def code_modules(start: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``PACKAGES`` that the modules ``start`` reach (see the module docstring),
    by name, with its file; computed once per process (the code does not change under a running
    evaluation)."""
    seen: dict[str, Path] = {}
    todo = [m for m in start if m.partition(".")[0] in PACKAGES]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:  # a name imported from a module (a class, a function), not a module
            continue
        seen[name] = path
        todo += sorted(_reached(name, path.read_text(), path.name == "__init__.py") - set(seen))
    return dict(sorted(seen.items()))


def package_code(start: tuple[str, ...] = RUNNERS) -> str:
    """A digest (16 hex digits) of the source of ``code_modules(start)``, by module name."""
    h = hashlib.sha256()
    for name, path in code_modules(start).items():
        h.update(f"{name}\0".encode())
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def code_digest(probe: Probe) -> str:
    """The code a probe's result depends on: ``package_code`` from the probe's module and the
    runners, and the probe's own module's source when it lies outside the packages (a probe from
    the user's package; its imports of ``diffsweep`` are followed too)."""
    module = sys.modules[type(probe).__module__]
    source = inspect.getsource(module)
    reached = tuple(sorted(_reached(module.__name__, source, hasattr(module, "__path__")) | {module.__name__}))
    digest = package_code(tuple(sorted({*RUNNERS, *reached})))
    if _module_file(module.__name__) is not None:
        return digest
    outside = hashlib.sha256(source.encode()).hexdigest()[:16]
    return hashlib.sha256(f"{digest}+{outside}".encode()).hexdigest()[:16]


def checkpoint_identity(trained: Trained) -> str:
    """What names the checkpoint's weights without reading them: its ``checksums.json`` (size and
    CRC-32 of every file, written with it) or, for a checkpoint without one, its files' names and
    sizes; with the training run's MLflow id (a run retrained from scratch has a new one)."""
    path = trained.checkpoint
    sums = path / "checksums.json"
    if sums.is_file():
        files = sums.read_text()
    elif path.is_dir():
        files = json.dumps(sorted((p.name, p.stat().st_size) for p in path.iterdir() if p.is_file()))
    else:
        files = json.dumps([path.name, path.stat().st_size])
    return hashlib.sha256(f"{files}\0{trained.mlflow_run_id}".encode()).hexdigest()[:16]


def eval_key(trained: Trained, probe: Probe, settings: Any, code: str | None = None) -> str:
    """The identity of an evaluation (32 hex digits): the training config's key, the step, the
    checkpoint, the validation data, where it runs, the probe, its settings and ``code``
    (``code_digest(probe)`` unless given)."""
    h = hashlib.sha256()
    h.update(json.dumps({
        "run_key": trained.run_key, "step": trained.step, "checkpoint": checkpoint_identity(trained),
        "data": trained.dataset.meta.fingerprint, "device": trained.device.type,
        "autocast": str(trained.autocast_dtype), "backend": trained.config.model.attention.backend.value,
        "probe": probe.name, "settings": settings_dict(settings),
        "code": code if code is not None else code_digest(probe),
    }, sort_keys=True).encode())
    return h.hexdigest()[:32]
