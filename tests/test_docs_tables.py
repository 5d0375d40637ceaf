"""The docs' tables of the attention kinds, the law forms and the probes are generated from their
registries: each sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->`` and must
equal what ``TABLES[NAME]`` renders from the definitions, so the two cannot drift apart. To write
them again after changing a definition: ``python tests/test_docs_tables.py``."""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)  # the table, then a newline


def kinds_table() -> str:
    from diffsweep.config.kinds import BUILTIN, kind_spec

    return _table(["`model.attention.kind`", "in reports", "what it is"],
                  [[f"`{name}`", (spec := kind_spec(name)).display_name, spec.description] for name in BUILTIN])


def law_forms_table() -> str:
    from diffsweep.scaling.laws import BUILTIN, DEFAULT, law_form

    return _table(["`--form`", "law", "in words"],
                  [[f"`{name}`" + (" (default)" if name == DEFAULT else ""), (form := law_form(name)).formula.format(x="x"),
                    form.words] for name in BUILTIN])


def probes_table() -> str:
    from diffsweep.eval.probe import PROBES, get_probe

    rows = []
    for name in PROBES:
        probe = get_probe(name)
        settings = [f"`{f.name}` ({probe.defaults_shown.get(f.name) or _value(f.default)})"
                    for f in dataclasses.fields(probe.Settings)] if dataclasses.is_dataclass(probe.Settings) else []
        rows.append([f"`{name}`", probe.cites, probe.summary, ", ".join(settings) or "none"])
    return _table(["probe", "paper", "what it measures", "settings (default)"], rows)


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (a cell's ``|`` escaped)."""
    lines = [header, ["---"] * len(header), *([cell.replace("|", "\\|") for cell in row] for row in rows)]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def _value(v: Any) -> str:
    """A setting's default as the table shows it."""
    if isinstance(v, enum.Enum):
        return f"`{v.value}`: {', '.join(f'`{m.value}`' for m in type(v))}"
    if isinstance(v, bool):
        return str(v).lower()
    if v is None or v in ((), ""):
        return "none"
    if isinstance(v, tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "kinds": ("docs/training.md", kinds_table),
    "law_forms": ("docs/fits.md", law_forms_table),
    "probes": ("docs/eval.md", probes_table),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_the_docs_table_is_the_registrys(name):
    page, render = TABLES[name]
    blocks = {m.group(2): m.group(3) for m in BLOCK.finditer((ROOT / page).read_text(encoding="utf-8"))}
    assert name in blocks, f"{page} has no <!-- generated: {name} --> ... <!-- end generated --> block"
    assert blocks[name] == render() + "\n", (f"{page}'s {name} table differs from the registry's; write it again with "
                                      f"`python tests/test_docs_tables.py`. It is:\n{render()}")


def write() -> None:
    """Write every generated table into its page again."""
    def table(m: re.Match) -> str:
        name = m.group(2)
        return m.group(1) + (TABLES[name][1]() + "\n" if name in TABLES else m.group(3)) + m.group(4)

    for page in dict.fromkeys(page for page, _ in TABLES.values()):
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        if (new := BLOCK.sub(table, text)) != text:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {page}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write()
