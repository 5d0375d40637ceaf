"""The prose stays small enough to keep up to date: the README is a front page (what diffsweep is,
the two set-up commands, a short tour, where to read on), each docs page says its topic once, and
measured figures live in analysis/benchmarks/RESULTS.md, not in a separate page of test timings."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README_LIMIT = 10_000
DOCS_LIMIT = 120_000


def test_readme_is_at_most_10_kb():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size:,} bytes, over {README_LIMIT:,}: move detail to the docs page that owns it"


def test_docs_pages_are_at_most_120_kb_in_all():
    sizes = {path.name: path.stat().st_size for path in sorted((ROOT / "docs").glob("*.md"))}
    total = sum(sizes.values())
    pages = ", ".join(f"docs/{name} {size:,}" for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]))
    assert total <= DOCS_LIMIT, f"docs/*.md are {total:,} bytes in all, over {DOCS_LIMIT:,} ({pages})"


def test_no_page_of_test_durations():
    path = ROOT / "analysis/benchmarks/test-durations.md"
    size = path.stat().st_size if path.exists() else 0
    assert not path.exists(), (f"{path.relative_to(ROOT)} exists ({size:,} bytes): the suite's timings belong in "
                               "analysis/benchmarks/RESULTS.md, 'The test suite'")
