"""``diffsweep data verify`` and ``data info --shards`` through the CLI, on small real datasets of
several shards (CPython's pydoc topics as JSONL, one topic per line), sound and damaged. The CLI
runs in this process (``tests.helpers.cli.run``): these are about what it reports."""

from __future__ import annotations

import json
import pydoc_data.topics
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from diffsweep.config import TokenizerKind
from diffsweep.data.prepare import prepare
from diffsweep.data.sources import Corpus, open_sources
from diffsweep.data.verify import verify_dataset
from tests.helpers.cli import run

VOCAB = 512
NUM_FILES = 6
NUM_SHARDS = 4  # the six files grouped up to 120 kB: 50+87, 168, 100+48, 36 kB


def _make(root: Path, name: str, tokenizer: TokenizerKind, *, shard_size: int, **kw) -> Path:
    topics = sorted(pydoc_data.topics.topics.items())
    inputs = []
    for i in range(NUM_FILES):
        file = root / f"topics-{i}.jsonl"
        if not file.exists():
            file.write_text("".join(json.dumps({"text": text}) + "\n" for _, text in topics[i::NUM_FILES]))
        inputs.append(str(file))
    prepare(Corpus(open_sources(inputs)), root / name, tokenizer, vocab_size=VOCAB, shard_size=shard_size,
            workers=1, **kw)
    return root / name


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verify")
    return {
        "tail": _make(root, "tail", TokenizerKind.BPE, shard_size=120_000),
        "document": _make(root, "document", TokenizerKind.BPE, shard_size=120_000, val_split="document",
                          val_fraction=0.2),
        "one-shard": _make(root, "one-shard", TokenizerKind.BYTES, shard_size=2**30),
    }


@pytest.fixture
def tail(datasets, tmp_path) -> Path:
    """A copy of the tail-split BPE dataset to damage."""
    return Path(shutil.copytree(datasets["tail"], tmp_path / "ds"))


def tokens(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype=np.uint16)


def write(path: Path, array: np.ndarray) -> None:
    array.astype(np.uint16).tofile(path)


def shard_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("✓ shard", "✗ shard"))]


def problem_lines(stdout: str) -> list[str]:
    """The problems: under their shard's line (indented), or of the whole dataset (the tokenizer)."""
    return [line.strip()[2:] for line in stdout.splitlines()
            if line.strip().startswith("✗ ") and not line.startswith("✗ shard ")]


@pytest.mark.parametrize("kind", ["tail", "document", "one-shard"])
def test_a_sound_dataset_verifies_shard_by_shard(datasets, kind):
    path = datasets[kind]
    meta = json.loads((path / "meta.json").read_text())
    assert len(meta["shards"]) == (1 if kind == "one-shard" else NUM_SHARDS)
    r = run("data", "verify", str(path), cwd=path.parent)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = shard_lines(r.stdout)
    assert len(lines) == len(meta["shards"]) and all(line.startswith("✓") for line in lines), r.stdout
    assert f"train-{len(lines) - 1:05d}.bin" in lines[-1]
    assert r.stdout.splitlines()[-1].startswith(f"{path}: OK, {len(lines)} shard"), r.stdout
    if kind == "one-shard":  # bytes: no end-of-document token
        assert "note: the bytes tokenizer has no end-of-document token" in r.stdout
    report = json.loads(run("data", "verify", str(path), "--json", cwd=path.parent).stdout)
    assert report["ok"] and report["num_shards"] == len(meta["shards"]) and not report["problems"]
    if kind != "one-shard":  # one end-of-document token per document: in both splits, or in one
        eos = [(s["files"]["train"]["eos"], s["files"]["val"]["eos"], s["documents"]) for s in report["shards"]]
        assert all((t == v == d) if kind == "tail" else (t + v == d) for t, v, d in eos), eos


def _swap_two_tokens(ds: Path) -> str:
    file = ds / "train-00001.bin"
    ids = tokens(file)
    i = next(i for i in range(100, len(ids)) if ids[i] != ids[i + 1] and 0 not in ids[i : i + 2])
    ids[i], ids[i + 1] = ids[i + 1], ids[i]  # still valid ids, same end-of-document tokens: only the bytes differ
    write(file, ids)
    return file.name


def _truncate(ds: Path) -> str:
    file = ds / "val-00002.bin"
    file.write_bytes(file.read_bytes()[:-2])
    return file.name


def _replace_last_eos(ds: Path) -> str:
    file = ds / "train-00000.bin"
    ids = tokens(file)
    ids[-1] = 5
    write(file, ids)
    return file.name


def _replace_a_middle_eos(ds: Path) -> str:
    file = ds / "val-00001.bin"
    ids = tokens(file)
    ids[int(np.flatnonzero(ids == 0)[0])] = 5  # the file still ends with eos: only the count tells
    write(file, ids)
    return file.name


def _token_beyond_vocab(ds: Path) -> str:
    file = ds / "train-00002.bin"
    ids = tokens(file)
    ids[1234] = VOCAB + 7
    write(file, ids)
    return file.name


def _delete(ds: Path) -> str:
    (ds / "val-00000.bin").unlink()
    return "val-00000.bin"


def _delete_tokenizer(ds: Path) -> str:
    (ds / "tokenizer.json").unlink()
    return "tokenizer.json"


@pytest.mark.parametrize(("damage", "says"), [
    (_swap_two_tokens, ["sha256"]),
    (_truncate, ["bytes, expected", "truncated"]),
    (_replace_last_eos, ["does not end with the end-of-document token 0 (last token: 5)",
                         "end-of-document tokens, expected"]),
    (_replace_a_middle_eos, ["end-of-document tokens, expected"]),
    (_token_beyond_vocab, [f"1 token id >= vocab_size {VOCAB} (first: {VOCAB + 7} at token 1,234)"]),
    (_delete, ["missing"]),
    (_delete_tokenizer, ["missing"]),
], ids=lambda v: v.__name__.strip("_") if callable(v) else "")
def test_damage_is_exit_1_naming_the_file(tail, damage: Callable[[Path], str], says):
    name = damage(tail)
    r = run("data", "verify", "ds", cwd=tail.parent)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    problems = problem_lines(r.stdout)
    assert problems and all(p.startswith(f"{name}: ") for p in problems), r.stdout
    for needle in says:
        assert any(needle in p for p in problems), (needle, r.stdout)
    lines = shard_lines(r.stdout)
    assert sum(line.startswith("✗") for line in lines) == (0 if name == "tokenizer.json" else 1), r.stdout
    assert len(lines) == NUM_SHARDS and r.stdout.splitlines()[-1].startswith("ds: DAMAGED"), r.stdout
    report = json.loads(run("data", "verify", "ds", "--json", cwd=tail.parent).stdout)
    assert not report["ok"] and {p["file"] for p in report["problems"]} == {name}


def test_verify_reads_in_chunks_and_finds_the_same(tail):
    """Chunks of a few tokens (every file read in hundreds of pieces) give the same report."""
    _token_beyond_vocab(tail)
    whole, chunked = verify_dataset(tail), verify_dataset(tail, chunk_tokens=7)
    assert whole.to_json() == chunked.to_json() and len(whole.problems) == 2  # sha256 and the id


def test_a_dataset_from_before_shards_verifies_without_checksums(datasets, tmp_path):
    old = Path(shutil.copytree(datasets["one-shard"], tmp_path / "old"))
    for split in ("train", "val"):
        (old / f"{split}-00000.bin").rename(old / f"{split}.bin")
    meta = json.loads((old / "meta.json").read_text())
    del meta["shards"], meta["val_split"]
    (old / "meta.json").write_text(json.dumps(meta))
    r = run("data", "verify", "old", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no checksum recorded" in r.stdout and "train.bin" in shard_lines(r.stdout)[0]
    info = json.loads(run("data", "info", "old", cwd=tmp_path).stdout)
    assert info["num_shards"] == 1 and "shards" not in info
    ids = tokens(old / "train.bin")
    ids[3] = 300  # above the 256 bytes: found without a checksum
    write(old / "train.bin", ids)
    r = run("data", "verify", "old", cwd=tmp_path)
    assert r.returncode == 1 and problem_lines(r.stdout) == [
        "train.bin: 1 token id >= vocab_size 256 (first: 300 at token 3)"], r.stdout


@pytest.mark.parametrize("make", ["missing", "no-meta"])
def test_a_path_that_is_not_a_dataset_is_one_line_exit_2(tmp_path, make):
    if make == "no-meta":
        (tmp_path / "ds").mkdir()
    r = run("data", "verify", "ds", cwd=tmp_path)
    assert r.returncode == 2 and not r.stdout, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ds"), r.stderr


def test_info_lists_the_shards_only_when_asked(datasets):
    path = datasets["tail"]
    short = json.loads(run("data", "info", str(path), cwd=path.parent).stdout)
    full = json.loads(run("data", "info", str(path), "--shards", cwd=path.parent).stdout)
    assert "shards" not in short and short["num_shards"] == NUM_SHARDS
    assert full["shards"] == json.loads((path / "meta.json").read_text())["shards"]
    assert len(full["shards"]) == NUM_SHARDS and all(len(s["sha256"]["train"]) == 64 for s in full["shards"])
    assert {k: v for k, v in full.items() if k != "shards"} == {k: v for k, v in short.items() if k != "num_shards"}
