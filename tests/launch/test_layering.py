"""Layering: the store (``diffsweep.store``) and the run directory (``diffsweep.rundir``) sit low, so
launch/ and scaling/ use them without importing the trainer; the launcher's modules import each
other without a cycle; ``diffsweep --help`` imports neither torch nor mlflow."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "diffsweep"


def module_imports(path: Path) -> set[str]:
    """The diffsweep modules ``path`` imports, at module level or inside functions (an import
    deferred to call time is still a dependency), but not those for type checking only."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diffsweep"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("diffsweep")}
    return found


def name_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_launch_has_no_import_cycle():
    modules = {name_of(p): p for p in (PACKAGE / "launch").rglob("*.py")}
    graph = {m: {i for i in module_imports(p) if i in modules and i != m} for m, p in modules.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph[start]:
            if nxt == goal or (nxt not in seen and (seen.add(nxt) or reaches(nxt, goal, seen))):
                return True
        return False

    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert not cycles, cycles
    assert "diffsweep.launch.submit" not in graph["diffsweep.launch.local_queue"]


def test_launch_and_scaling_import_no_trainer_module_for_storage():
    storage = ("diffsweep.train.store", "diffsweep.train.tracking", "diffsweep.train.run_record")
    for folder in ("launch", "scaling"):
        for path in (PACKAGE / folder).rglob("*.py"):
            text = path.read_text()
            assert not any(s in text for s in storage), path


def loaded(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_store_and_rundir_import_no_torch_mlflow_or_trainer():
    modules = loaded("import diffsweep.store, diffsweep.rundir, diffsweep.launch.scheduler")
    heavy = [m for m in modules if m.split(".")[0] in ("torch", "mlflow", "submitit") or m.startswith("diffsweep.train")]
    assert not heavy, heavy


def test_help_imports_no_torch_or_mlflow():
    code = ("import contextlib, io\nfrom diffsweep.cli import app\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        app(['--help'])\n    except SystemExit:\n        pass")
    modules = loaded(code)
    assert not [m for m in modules if m.split(".")[0] in ("torch", "mlflow", "submitit")]
