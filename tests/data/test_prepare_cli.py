"""``diffsweep data prepare`` refusing input that would make a useless dataset, and leaving the
file system as it found it when it fails (parent folders of ``--out`` included). The command runs
in this process (``tests.helpers.cli.run``): these are about what it refuses and leaves on disk."""

from __future__ import annotations

import pydoc_data.topics
from pathlib import Path

import pytest

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.prepare import Document, prepare
from tests.helpers.badinput import refused
from tests.helpers.cli import run

TEXT = pydoc_data.topics.topics["if"]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("content", ["", " \n\t\n"], ids=["empty", "whitespace"])
def test_a_file_without_text_is_refused_naming_it(tmp_path, content):
    (tmp_path / "empty.txt").write_text(content)
    before = tree(tmp_path)
    r = run("data", "prepare", "empty.txt", "--out", "new/sub/ds", "--tokenizer", "bytes", cwd=tmp_path)
    refused(r, "empty.txt", "no text")
    assert tree(tmp_path) == before  # refused up front: no dataset, no parent folders


def test_a_directory_whose_files_have_no_text_is_refused(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("")
    (tmp_path / "docs" / "b.md").write_text("\n\n")
    before = tree(tmp_path)
    r = run("data", "prepare", "docs", "--out", "ds", cwd=tmp_path)
    refused(r, "docs/a.txt", "no text")
    assert tree(tmp_path) == before


def test_one_empty_file_among_good_ones_is_refused(tmp_path):
    (tmp_path / "good.txt").write_text(TEXT)
    (tmp_path / "empty.txt").write_text("")
    r = run("data", "prepare", "good.txt", "empty.txt", "--out", "ds", "--tokenizer", "bytes", cwd=tmp_path)
    refused(r, "empty.txt", "no text")
    assert not (tmp_path / "ds").exists()


def test_a_failed_prepare_removes_the_parent_folders_it_would_have_made(tmp_path):
    """A BPE vocabulary below the 256 bytes + 1 is refused; no folder of --out is left behind."""
    (tmp_path / "t.txt").write_text(TEXT)
    r = run("data", "prepare", "t.txt", "--out", "a/b/ds", "--vocab-size", "10", cwd=tmp_path)
    refused(r, "--vocab-size")
    assert tree(tmp_path) == ["t.txt"]


def test_an_interrupted_prepare_removes_the_parent_folders_it_made(tmp_path):
    """Ctrl-C while tokenizing into a new nested --out: the folders made for it go; existing ones stay."""
    (tmp_path / "kept").mkdir()

    def progress(docs, total_chars):
        for i, doc in enumerate(docs):
            if i == 1:
                raise KeyboardInterrupt
            yield doc

    docs = [Document(name, text, Path(pydoc_data.topics.__file__))
            for name, text in sorted(pydoc_data.topics.topics.items())[:3]]
    with pytest.raises(KeyboardInterrupt):
        prepare(docs, tmp_path / "kept" / "x" / "y" / "ds", TokenizerKind.BYTES, progress=progress)
    assert tree(tmp_path) == ["kept"]


def test_a_library_call_with_an_empty_document_writes_nothing(tmp_path):
    with pytest.raises(ConfigError, match=r"^blank: no text"):
        prepare([Document("blank", "   ", tmp_path / "blank.txt")], tmp_path / "n" / "ds", TokenizerKind.BYTES)
    assert list(tmp_path.iterdir()) == []
