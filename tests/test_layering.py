"""The package's layering (HOUSE_RULES, "The shape of the code"), read from the source with ``ast``.

Data flows one way: ``config -> model -> train -> launch -> fit``; the CLI sits on top and the
kernels are a leaf. Nothing here imports diffsweep, so the rules are checked in well under a
second and cannot be fooled by what an earlier test happened to import.

What is checked, for every module of ``diffsweep/`` and ``kernels/``:

- one direction: each part of the package imports only the parts below it (``ALLOWED``);
  ``diffsweep.cli`` is imported by no library module, only by ``__main__``;
- some imports only inside functions and only of some modules: ``launch`` runs the trainer in
  the job callable, but planning and submitting never load it (``ONLY_IN_FUNCTIONS``);
- what importing a module loads (its module-level imports, followed through diffsweep and the
  packages whose ``__init__`` runs on the way): no torch for ``config``, ``model.counting``,
  ``sweep``, ``launch`` and ``scaling``; for the CLI none of torch, mlflow, numpy, scipy, pandas,
  matplotlib or submitit (HOUSE_RULES 12) (``NOT_AT_IMPORT``); and ``config`` imports no torch
  even inside a function;
- no import cycles between modules (module-level imports);
- and, by running them in one fresh interpreter, that importing the config layer loads none of
  those, and that ``diffsweep <command> --help`` loads none of them for any command.

Where main breaks a rule today, ``ALLOWED_TODAY`` names the one import, with the change that
removes it; an entry that no longer matches an import fails, so that it is deleted.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"diffsweep": ROOT / "diffsweep", "diffsweep_kernels": ROOT / "kernels"}

# Each part of the package (a subpackage or a top-level module; the kernels are
# ``diffsweep_kernels``) and the parts it may import, anywhere in it. Lowest first.
# ``tracking`` owns MLflow (the store, the trainer's logger, the UI and server); ``rundir`` the run
# directory's files.
BASE = {"diffsweep", "fsutil", "lockfile", "slurm", "config", "startup"}  # ``diffsweep`` is the root __init__ (__version__)
ALLOWED: dict[str, set[str]] = {
    "diffsweep": set(),
    "diffsweep_kernels": set(),  # a leaf: imports nothing of diffsweep
    "fsutil": set(),
    "startup": set(),  # heavy imports with the garbage collector paused
    "config": set(),  # typed configs, enums, the registry of named plug-ins (kinds, schedulers, probes, law forms)
    "slurm": {"config"},  # the one Slurm client: every Slurm command and job-state word
    "lockfile": {"config", "slurm"},  # asks Slurm whether a holder's job still runs
    "tracking": BASE | {"rundir"},  # the only part that constructs an MLflow client
    "rundir": BASE,
    "data": BASE,
    "model": BASE | {"diffsweep_kernels"},
    "sweep": BASE | {"model"},  # model.counting: sizes without building a model; pure: no tracking
    "train": BASE | {"data", "model", "tracking", "rundir"},
    "bench": BASE | {"data", "model", "train", "diffsweep_kernels"},
    "eval": BASE | {"data", "model", "train", "tracking", "rundir"},  # probes of trained checkpoints
    "launch": BASE | {"data", "model", "sweep", "train", "eval", "tracking", "rundir", "diffsweep_kernels"},
    "scaling": BASE | {"sweep", "launch", "tracking", "rundir"},  # fit: reads runs, never trains
    # a sweep's finished runs and evaluations, read from the store; a tuned sweep's best candidates
    # with fit's statistics of the selection (scaling.tuning)
    "compare": BASE | {"sweep", "tracking", "scaling"},
}
LIBRARY = set(ALLOWED)
ALLOWED["cli"] = LIBRARY  # the top: parses, calls one library function, renders
ALLOWED["__main__"] = {"cli"}

# Allowed imports of a part that must sit inside a function (not run when the module is imported),
# and may reach only these modules of it.
ONLY_IN_FUNCTIONS: dict[tuple[str, str], set[str]] = {
    # The job callable trains; planning and submission load no torch, and runs are stored
    # through the store, not through the trainer's modules.
    ("launch", "train"): {"diffsweep.train.trainer", "diffsweep.train.optim", "diffsweep.train.preemption"},
}

# What importing a module must not load, through every module-level import it makes; by module
# (a key names a module and everything under it).
HEAVY = ("torch", "mlflow", "numpy", "scipy", "pandas", "matplotlib", "submitit")
NOT_AT_IMPORT: dict[str, tuple[str, ...]] = {
    "diffsweep.config": ("torch", "mlflow", "numpy"),  # pure Python
    "diffsweep.model.counting": ("torch",),  # a config knows its size without a model (rule 6)
    "diffsweep.model.summary": ("torch",),
    "diffsweep.sweep": ("torch", "mlflow", "numpy", "scipy", "matplotlib"),  # pure spec and expansion: `plan` shows it before anything runs
    "diffsweep.compare": ("torch", "mlflow", "matplotlib"),  # reads the store and plots only when asked
    "diffsweep.launch": ("torch", "mlflow"),  # planning and submitting; the job imports the trainer
    "diffsweep.scaling": ("torch", "mlflow", "matplotlib"),  # fit reads runs; plots and logging import theirs
    "diffsweep.eval.probe": HEAVY,  # the probe registry: `diffsweep eval --help` lists probes without torch
    "diffsweep.cli": HEAVY,  # `diffsweep --help` stays fast (rule 12)
}
NOWHERE = {"config": ("torch",)}  # not even inside a function

# Where main breaks a rule today: (importing module, imported module) -> why it is allowed for now.
ALLOWED_TODAY: dict[tuple[str, str], str] = {}  # none: keep it that way


@dataclass(frozen=True)
class Import:
    """One imported module: ``importer`` (a module) imports ``target`` at ``line``."""

    importer: str
    target: str  # absolute, and the submodule itself for ``from package import submodule``
    line: int
    in_function: bool  # inside a def (or a lambda): runs when called, not on import
    type_checking: bool  # under ``if TYPE_CHECKING:``: never runs

    @property
    def at_import(self) -> bool:
        return not (self.in_function or self.type_checking)


def _module_name(top: str, path: Path) -> str:
    parts = path.relative_to(SOURCES[top]).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((top, *parts))


@cache
def modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name."""
    found = {}
    for top, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            found[_module_name(top, path)] = path
    return found


def _absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_of(name: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    known = modules()
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend(Import(name, alias.name, child.lineno, in_function, type_checking) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(name, path.name == "__init__.py", child)
                targets = {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names}
                found.extend(Import(name, t, child.lineno, in_function, type_checking) for t in sorted(targets))
            visit(child,
                  in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                  type_checking or (isinstance(child, ast.If) and _is_type_checking(child)))

    visit(tree, False, False)
    return found


@cache
def imports() -> tuple[Import, ...]:
    return tuple(i for name, path in modules().items() for i in _imports_of(name, path))


def part(module: str) -> str | None:
    """The layer a diffsweep module belongs to (``config`` for ``diffsweep.config.enums``), or
    None for a third-party module."""
    top, _, rest = module.partition(".")
    if top == "diffsweep_kernels":
        return top
    if top != "diffsweep":
        return None
    return rest.split(".")[0] if rest else "diffsweep"


def _where(i: Import) -> str:
    return f"{modules()[i.importer].relative_to(ROOT)}:{i.line}: {i.importer} imports {i.target}"


def _allowed_today(i: Import) -> bool:
    return any(i.importer == importer and (i.target == target or i.target.startswith(f"{target}."))
               for importer, target in ALLOWED_TODAY)


def test_every_part_has_a_layer():
    unknown = sorted({part(name) for name in modules()} - set(ALLOWED))
    assert not unknown, f"new parts of the package: {unknown}; add each to ALLOWED with what it may import"


def test_imports_go_one_way():
    bad = []
    for i in imports():
        source, target = part(i.importer), part(i.target)
        if target is None or target == source or source not in ALLOWED or _allowed_today(i):
            continue  # a part in no layer: test_every_part_has_a_layer says so
        if target not in ALLOWED[source]:
            bad.append(f"{_where(i)} ({source} may import only {sorted(ALLOWED[source]) or 'nothing of diffsweep'})")
        elif (source, target) in ONLY_IN_FUNCTIONS:
            modules_allowed = ONLY_IN_FUNCTIONS[source, target]
            if i.at_import or i.target not in modules_allowed:
                bad.append(f"{_where(i)} ({source} imports from {target} only {sorted(modules_allowed)}, "
                           "inside functions)")
    assert not bad, "imports against the one-way layering (config -> model -> train -> launch -> fit):\n" + \
        "\n".join(bad)


def test_no_library_module_imports_the_cli():
    bad = [_where(i) for i in imports() if part(i.target) == "cli" and part(i.importer) not in ("cli", "__main__")]
    assert not bad, "\n".join(bad)


def test_allowed_today_entries_still_match_an_import():
    """An exception whose import is gone must go too (the change that removes it has landed)."""
    stale = [f"{importer} -> {target}" for importer, target in ALLOWED_TODAY
             if not any(i.importer == importer and (i.target == target or i.target.startswith(f"{target}."))
                        for i in imports())]
    assert not stale, f"delete these entries of ALLOWED_TODAY, their imports are gone: {stale}"


def test_config_imports_no_torch_anywhere():
    bad = [_where(i) for i in imports() if part(i.importer) in NOWHERE
           and i.target.split(".")[0] in NOWHERE[part(i.importer)]]
    assert not bad, "\n".join(bad)


def loaded_at_import(module: str) -> dict[str, list[str]]:
    """Third-party top-level modules that importing ``module`` loads, each with the chain of
    diffsweep modules that leads to it: module-level imports, followed through diffsweep, plus
    the ``__init__`` of every package on the way (Python runs those first)."""
    known = modules()
    by_importer: dict[str, list[Import]] = {}
    for i in imports():
        by_importer.setdefault(i.importer, []).append(i)

    def with_parents(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]

    chains: dict[str, list[str]] = {}
    seen: dict[str, list[str]] = {}
    todo = [(m, [m]) for m in with_parents(module) if m in known]
    while todo:
        name, chain = todo.pop()
        if name in seen:
            continue
        seen[name] = chain
        for i in by_importer.get(name, []):
            if not i.at_import:
                continue
            for target in with_parents(i.target):
                if target in known:
                    todo.append((target, [*chain, target]))
                elif part(target) is None and "." not in target:
                    chains.setdefault(target, chain)
    return chains


@pytest.mark.parametrize("prefix", sorted(NOT_AT_IMPORT))
def test_what_importing_a_module_loads(prefix):
    bad = []
    for name in modules():
        if name != prefix and not name.startswith(f"{prefix}."):
            continue
        loaded = loaded_at_import(name)
        bad += [f"{name} loads {heavy} on import, through {' -> '.join(loaded[heavy])}"
                for heavy in NOT_AT_IMPORT[prefix] if heavy in loaded]
    more = f"\n... and {len(bad) - 12} more" if len(bad) > 12 else ""
    assert not bad, "\n".join(bad[:12]) + more


def test_no_import_cycles_even_through_lazy_imports():
    """Counting imports inside functions and under TYPE_CHECKING too, the modules form no cycle (a
    lazy import hides a cycle; it does not remove it): each module sits above the ones it uses."""
    graph = _graph(lambda i: True)
    cycles = [_cycle_in(component, graph) for component in _components(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def _graph(counted) -> dict[str, set[str]]:
    """Which diffsweep modules each module imports, through the imports ``counted`` accepts."""
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for i in imports():
        if counted(i) and i.target in graph and i.target != i.importer:
            graph[i.importer].add(i.target)
    return graph


def _cycle_in(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through the first module of a strongly connected component (breadth first)."""
    start, inside = component[0], set(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return paths[v]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"not a cycle: {component}")


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


@pytest.fixture(scope="module")
def fresh_interpreter() -> dict[str, str]:
    """What one fresh interpreter loads: first on importing the config layer (``diffsweep.config``,
    ``diffsweep.model.counting``, ``diffsweep.model.summary``), then on ``diffsweep ... --help``
    for every command and group. A fresh interpreter because what an earlier test imported would
    hide it (the process boundary is the point); one for both checks, in that order."""
    code = (
        "import sys\n"
        "import diffsweep.config, diffsweep.model.counting, diffsweep.model.summary\n"
        f"print('CONFIG', sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "import typer.main\n"
        "from diffsweep.cli import app\n"
        "def walk(command, path):\n"
        "    yield path\n"
        "    for name, sub in sorted(getattr(command, 'commands', {}).items()):\n"
        "        yield from walk(sub, [*path, name])\n"
        "paths = list(walk(typer.main.get_command(app), []))\n"
        "for argv in paths:\n"
        "    try:\n"
        "        app([*argv, '--help'])\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)\n"
        "print('COMMANDS', len(paths), 'HEAVY', heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    config = next(line for line in lines if line.startswith("CONFIG "))
    return {"config": config.removeprefix("CONFIG "), "help": lines[-1]}


def test_config_layer_imports_no_torch(fresh_interpreter):
    """Importing the config layer (configs, sizes, summaries) loads no torch, through any package,
    third-party ones included (what the ``ast`` reading above does not follow)."""
    loaded = fresh_interpreter["config"]
    assert "'torch'" not in loaded, f"importing the config layer loaded torch (and {loaded})"


def test_help_of_every_command_loads_no_heavy_module(fresh_interpreter):
    """``diffsweep ... --help`` for every command and group: the CLI imports its heavy modules
    inside the commands (HOUSE_RULES 12)."""
    counted, heavy = fresh_interpreter["help"].split(" HEAVY ")
    assert int(counted.split()[1]) > 10, counted  # the walk found the commands
    assert heavy == "[]", f"diffsweep --help loaded {heavy}"


# Slurm's commands and its job-state words (a few distinctive ones), spelled only in diffsweep.slurm.
SLURM_COMMANDS = {"sbatch", "squeue", "sacct", "scancel", "sinfo", "sacctmgr", "scontrol", "srun", "salloc"}
SLURM_STATE_WORDS = {"REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "CONFIGURING", "COMPLETING", "STAGE_OUT"}


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _nodes(but: str = "") -> Iterator[tuple[str, Path, ast.AST]]:
    """Every syntax node of every module of the package but ``but``: (module, file, node)."""
    for name, path in modules().items():
        if name != but:
            yield from ((name, path, node) for node in ast.walk(_tree(path)))


def _at(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"


def test_slurm_is_spoken_in_one_module():
    """Every Slurm command diffsweep runs is an argv in ``diffsweep/slurm.py`` and nowhere else (a
    list or tuple whose first item is the command, or an f-string starting with it), and only it
    lists Slurm's job states."""
    bad = []
    for _, path, node in _nodes(but="diffsweep.slurm"):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts and isinstance(node.elts[0], ast.Constant) \
                and node.elts[0].value in SLURM_COMMANDS:
            bad.append(f"{_at(path, node)}: runs {node.elts[0].value}")
        elif isinstance(node, ast.Constant) and node.value in SLURM_STATE_WORDS:
            bad.append(f"{_at(path, node)}: spells the Slurm state {node.value}")
    assert not bad, "use diffsweep.slurm:\n" + "\n".join(bad)


def test_mlflow_clients_are_constructed_in_one_place():
    """``MlflowClient`` is named only in ``diffsweep.tracking.store`` (``mlflow_client``): every other
    module opens the store through it."""
    bad = [_at(path, node) for _, path, node in _nodes(but="diffsweep.tracking.store")
           if (isinstance(node, ast.Name) and node.id == "MlflowClient")
           or (isinstance(node, ast.Attribute) and node.attr == "MlflowClient")
           or (isinstance(node, ast.alias) and node.name.split(".")[-1] == "MlflowClient")]
    assert not bad, "use diffsweep.tracking.store.mlflow_client:\n" + "\n".join(bad)


def test_mlflow_is_imported_only_in_tracking():
    """MLflow is ``diffsweep.tracking``'s: no other module imports it, not inside a function and not
    for type hints (a result run is ``tracking.results``; a run's type is ``tracking.results.Run``)."""
    bad = [_where(i) for i in imports() if i.target.split(".")[0] == "mlflow"
           and not i.importer.startswith("diffsweep.tracking")]
    assert not bad, "go through diffsweep.tracking:\n" + "\n".join(bad)


def test_tag_names_are_spelled_in_one_module():
    """The tags diffsweep writes and reads are named in ``diffsweep.tracking.tags`` alone: no other
    module spells one as a string (nor in a search filter's backquotes)."""
    names = {node.value.value for node in ast.walk(_tree(modules()["diffsweep.tracking.tags"]))
             if isinstance(node, ast.Assign)
             and isinstance(node.value, ast.Constant) and str(node.value.value).startswith(("diffsweep.", "mlflow."))}
    assert len(names) > 50 and "diffsweep.kind" in names
    docs = {id(n.body[0].value) for _, _, n in _nodes()
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    bad = [f"{_at(path, node)}: {node.value[:60]!r}" for _, path, node in _nodes(but="diffsweep.tracking.tags")
           if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
           and (node.value in names or any(f"`{n}`" in node.value for n in names))]
    assert not bad, "use diffsweep.tracking.tags:\n" + "\n".join(bad)


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: what another module needs is made
    public where it belongs (a command's input resolution in the library, not in another command)."""
    bad = [f"{_at(path, node)}: {name} imports {node.module}.{a.name}" for name, path, node in _nodes()
           if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("diffsweep"))
           for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    assert not bad, "\n".join(bad)


RENAMES = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move")}


def test_files_and_folders_are_renamed_only_in_fsutil():
    """Every rename is one of ``diffsweep.fsutil``'s, whose docstrings say what a reader can see
    meanwhile and what is never replaced."""
    bad = [f"{_at(path, node)}: {node.value.id}.{node.attr}" for _, path, node in _nodes(but="diffsweep.fsutil")
           if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) in RENAMES]
    assert not bad, "use diffsweep.fsutil:\n" + "\n".join(bad)


MAX_MODULE_LINES = 500  # a module a reader holds in their head; split one that grows past it


def test_every_module_is_at_most_500_lines():
    long = [f"{path.relative_to(ROOT)}: {n} lines" for path in modules().values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, f"split these (at most {MAX_MODULE_LINES} lines a module):\n" + "\n".join(long)


MAX_FOLDER_MODULES = 16  # a folder a newcomer can find their way in (issue #51)
LARGE_FOLDERS: dict[str, int] = {}  # none: launch/ was split into rooms (jobs/, doctor/, prepare/)


def test_no_folder_of_the_package_has_more_than_16_modules():
    counts = {str(folder.relative_to(ROOT)): len(list(folder.glob("*.py")))
              for folder in [ROOT / "diffsweep", *(ROOT / "diffsweep").rglob("*/")] if folder.is_dir()
              and "__pycache__" not in folder.parts}
    big = {name: n for name, n in counts.items() if n > LARGE_FOLDERS.get(name, MAX_FOLDER_MODULES)}
    assert not big, f"folders over {MAX_FOLDER_MODULES} modules (split them into rooms): {big}"


MAX_COMMAND_LINES = 60  # a command parses its options, calls the library and renders (issue #51)
# Longer today, as their option declarations are: not to grow (issue #51 tracks them).
LONG_COMMANDS = {"diffsweep/cli/data.py:prepare": 79, "diffsweep/cli/fit.py:fit": 78}


def test_every_command_function_is_at_most_60_lines():
    """A command function (one ``handle_errors`` wraps) is at most 60 lines, its option declarations
    included: input resolution and sweep targets are the library's."""
    sizes = {}
    for path in sorted((ROOT / "diffsweep" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            wrapped = isinstance(node, ast.FunctionDef) and any(
                "handle_errors" in ast.unparse(d) for d in node.decorator_list)
            if wrapped:
                sizes[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    assert len(sizes) > 20, sizes  # every command is found
    long = {name: n for name, n in sizes.items() if n > LONG_COMMANDS.get(name, MAX_COMMAND_LINES)}
    assert not long, f"commands over {MAX_COMMAND_LINES} lines (move their logic into the library): {long}"


def test_module_docstrings_say_what_the_module_is_for_in_a_few_lines():
    """A module's docstring is a few lines and a pointer to docs/, which says the rest (issue #31: long ones
    repeated docs/ and drifted from it). The kernels keep their derivation beside the code (kernels/)."""
    long = {name: n for name, path in modules().items() if name.startswith("diffsweep.")
            and (n := len((ast.get_docstring(ast.parse(path.read_text()), clean=False) or "").splitlines())) > 20}
    assert not long, f"module docstrings over 20 lines (move the detail to docs/ or to the function it explains): {long}"
