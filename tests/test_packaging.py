"""Packaging: every package is installed, kernels import under their namespaced name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "diffsweep").rglob("__init__.py")
    } | {"diffsweep_kernels"}
    assert found == listed


def test_required_top_level():
    for name in ("pyproject.toml", "diffsweep", "sweeps", "kernels", "slurm", "tests", "analysis"):
        assert (ROOT / name).exists(), name


def test_kernels_import_under_namespaced_name():
    import diffsweep_kernels.reference as reference

    assert Path(reference.__file__).resolve().parent == ROOT / "kernels"


LICENSE_FIRST_LINE = {"MIT": "MIT License"}  # pyproject's license -> how its text starts


def test_license_file_is_the_declared_license():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    name = declared["text"] if isinstance(declared, dict) else declared
    assert (ROOT / "LICENSE").read_text().splitlines()[0] == LICENSE_FIRST_LINE[name]


# Imported somewhere but not installed by the test extra: CUDA-only, each import is guarded.
NOT_FOR_TESTS = {"flash_attn"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return _normal(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def _with_requirements(names: set[str]) -> set[str]:
    """``names`` and, for the installed ones, everything they require (not their extras)."""
    from importlib import metadata

    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_requirement_name(r) for r in requires if "extra ==" not in r.replace('"', "").replace("'", "")]
    return found


def _third_party_imports() -> dict[str, str]:
    """Top-level modules imported by the package, the kernels and the tests -> one file that does."""
    import ast
    import sys

    first_party = {"diffsweep", "diffsweep_kernels", "tests", "__future__"}
    found: dict[str, str] = {}
    for folder in ("diffsweep", "kernels", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in first_party:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_test_extra_installs_every_imported_package():
    """What the code and the tests import comes with ``pip install -e '.[test]'`` (directly or as a
    dependency of what it lists); flash-attn, CUDA only, is the one exception."""
    from importlib import metadata

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = {_requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    installed = _with_requirements(listed)
    distributions = metadata.packages_distributions()
    missing = []
    for module, where in sorted(_third_party_imports().items()):
        if module in NOT_FOR_TESTS:
            continue
        dists = {_normal(d) for d in distributions.get(module, [])}
        if not dists & installed:
            missing.append(f"{module} (imported in {where}; distribution {sorted(dists) or 'not installed'})")
    assert not missing, "imported but installed by neither dependencies nor the test extra: " + ", ".join(missing)
