"""Sharded datasets: ``data prepare --workers`` writes the same shards and the same token stream for
1 and 2 workers from every format (JSONL, .gz, .zst, Parquet, a saved Hugging Face dataset), the
stream does not depend on how it is cut into shards, ``--max-tokens`` cuts it identically, a
worker killed mid-way leaves nothing and a rerun is identical, ``--val-split document`` holds whole
documents out, and a many-shard dataset reads as one array (the trainer's windows included)."""

from __future__ import annotations

import gzip
import json
import os
import pydoc_data.topics
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from diffsweep.config import ConfigError, TokenizerKind
from diffsweep.data.dataset import META_FILE, ShardedTokens, batch_starts, open_dataset, windows
from diffsweep.data.prepare import prepare
from diffsweep.data.shards import in_validation
from diffsweep.data.sources import Corpus, open_sources
from tests.helpers.cli import run

# Every pydoc topic (~190 documents, ~0.8 MB of English), in order; six files of each format.
TEXTS = [text for _, text in sorted(pydoc_data.topics.topics.items()) if text.strip()]
FILES = 6
SHARD = 50_000  # bytes of input per shard: a JSONL file (~75 kB) is a shard of its own


def _chunks(texts: list[str]) -> list[list[str]]:
    size = -(-len(texts) // FILES)
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def write_formats(root: Path) -> dict[str, list[Path]]:
    """The corpus as 6 files per format (an HF dataset: one, saved to disk), by format name."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    from datasets import Dataset

    inputs: dict[str, list[Path]] = {"jsonl": [], "jsonl.gz": [], "jsonl.zst": [], "parquet": []}
    first = 0
    for i, chunk in enumerate(_chunks(TEXTS)):
        rows = b"".join(json.dumps({"id": first + j, "text": t}).encode() + b"\n" for j, t in enumerate(chunk))
        first += len(chunk)
        for fmt, data in (("jsonl", rows), ("jsonl.gz", gzip.compress(rows)),
                          ("jsonl.zst", zstandard.ZstdCompressor().compress(rows))):
            inputs[fmt].append(root / fmt / f"part-{i}.{fmt}")
            inputs[fmt][-1].parent.mkdir(parents=True, exist_ok=True)
            inputs[fmt][-1].write_bytes(data)
        inputs["parquet"].append(root / "parquet" / f"part-{i}.parquet")
        inputs["parquet"][-1].parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"text": chunk}), inputs["parquet"][-1], row_group_size=16)
    Dataset.from_dict({"text": TEXTS}).save_to_disk(str(root / "hf"))
    inputs["hf"] = [root / "hf"]
    return inputs


@pytest.fixture(scope="module")
def formats(tmp_path_factory) -> dict[str, list[Path]]:
    return write_formats(tmp_path_factory.mktemp("shards"))


def stream(path: Path) -> dict[str, np.ndarray]:
    data = open_dataset(path)
    return {split: np.asarray(data.split(split)) for split in ("train", "val")}


def shard_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.bin"))}


def shard_size(inputs: list[Path]) -> int:
    """Each file a shard of its own; a saved dataset cut into about 4 row ranges."""
    if inputs[0].is_dir():
        return sum(p.stat().st_size for p in inputs[0].rglob("*.arrow")) // 4
    return min(p.stat().st_size for p in inputs)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "hf"])
def test_one_and_two_workers_write_the_same_shards(formats, tmp_path, fmt):
    """Same shards, same meta.json for 1 and 2 workers; the same stream as one unsharded file."""
    kwargs = {"tokenizer": TokenizerKind.BYTES, "val_fraction": 0.1, "shard_size": shard_size(formats[fmt])}
    one = prepare(Corpus(open_sources(formats[fmt])), tmp_path / "w1", workers=1, **kwargs)
    two = prepare(Corpus(open_sources(formats[fmt])), tmp_path / "w2", workers=2, **kwargs)
    whole = prepare(Corpus(open_sources(formats[fmt])), tmp_path / "whole", workers=2, **kwargs | {"shard_size": 1 << 40})
    assert one.shards is not None and len(one.shards) >= 4, one.shards
    assert whole.shards is not None and len(whole.shards) == 1
    assert one == two
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2")
    assert (tmp_path / "w1" / META_FILE).read_text() == (tmp_path / "w2" / META_FILE).read_text()
    # The stream is the corpus, however it is cut into shards (and so is the dataset's identity).
    assert one.fingerprint == whole.fingerprint and one.tokens == whole.tokens
    ours, reference = stream(tmp_path / "w1"), stream(tmp_path / "whole")
    for split in ("train", "val"):
        assert np.array_equal(ours[split], reference[split])
    assert one.num_documents == len(TEXTS) == sum(s["documents"] for s in one.sources)
    first = TEXTS[0].encode()
    assert bytes(ours["train"][: len(first) // 2].astype(np.uint8)) == first[: len(first) // 2]


@pytest.mark.parametrize("max_tokens", [150_000, 200_001])
def test_max_tokens_cuts_the_same_stream_for_any_number_of_workers(formats, tmp_path, max_tokens):
    kwargs = {"tokenizer": TokenizerKind.BPE, "vocab_size": 300, "max_tokens": max_tokens}
    metas = [prepare(Corpus(open_sources(formats["jsonl"])), tmp_path / name, workers=workers,
                     shard_size=size, **kwargs)
             for name, workers, size in (("w1", 1, SHARD), ("w2", 2, SHARD), ("whole", 1, 1 << 40))]
    assert metas[0] == metas[1] and metas[0].fingerprint == metas[2].fingerprint
    assert sum(metas[0].tokens.values()) in (max_tokens, max_tokens - 1, max_tokens - 2)
    assert metas[0].tokens == metas[2].tokens and metas[0].num_documents < len(TEXTS)
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2")
    assert sorted(shard_bytes(tmp_path / "w1")) == [f"{s}-{i:05d}.bin" for s in ("train", "val")
                                                    for i in range(len(metas[0].shards))]
    for split in ("train", "val"):
        assert np.array_equal(stream(tmp_path / "w2")[split], stream(tmp_path / "whole")[split])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_max_tokens_cuts_a_list_of_documents(tmp_path):
    """Documents given as a list (the demo corpus) are cut as they are written, as a corpus is."""
    from diffsweep.data.prepare import Document

    docs = [Document(f"topic-{i}", text, Path(pydoc_data.topics.__file__)) for i, text in enumerate(TEXTS[:30])]
    meta = prepare(docs, tmp_path / "ds", TokenizerKind.BYTES, max_tokens=40_000)
    assert sum(meta.tokens.values()) == 40_000 and 0 < meta.num_documents < 30
    data = stream(tmp_path / "ds")
    assert len(data["train"]) + len(data["val"]) == 40_000


def test_document_val_split_holds_whole_documents_out(tmp_path):
    """--val-split document: each document in exactly one split, chosen by its name only, so adding
    a file moves no document; another identity than the tail split."""
    texts = TEXTS[:60]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[60:90]))
    kwargs = {"tokenizer": TokenizerKind.BYTES, "val_fraction": 0.2, "val_split": "document"}
    meta = prepare(Corpus(open_sources([tmp_path / "a.jsonl"])), tmp_path / "doc", **kwargs)
    held = [in_validation(f"{tmp_path / 'a.jsonl'}:{row}", 0.2) for row in range(1, len(texts) + 1)]
    assert 3 < sum(held) < 25 and meta.val_split == "document"
    expected = {split: b"".join(t.encode() for t, h in zip(texts, held, strict=True) if h == (split == "val"))
                for split in ("train", "val")}
    got = stream(tmp_path / "doc")
    for split in ("train", "val"):
        assert bytes(got[split].astype(np.uint8)) == expected[split]
    grown = prepare(Corpus(open_sources([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])), tmp_path / "grown", **kwargs)
    assert bytes(stream(tmp_path / "grown")["val"][: len(expected["val"])].astype(np.uint8)) == expected["val"]
    tail = prepare(Corpus(open_sources([tmp_path / "a.jsonl"])), tmp_path / "tail", tokenizer=TokenizerKind.BYTES,
                   val_fraction=0.2)
    assert tail.fingerprint != meta.fingerprint and grown.fingerprint != meta.fingerprint
    with pytest.raises(ConfigError, match="val_split: expected one of tail, document"):
        prepare(Corpus(open_sources([tmp_path / "a.jsonl"])), tmp_path / "bad", tokenizer=TokenizerKind.BYTES,
                val_split="random")


def test_document_split_eos_per_document_with_bpe(tmp_path):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:40]))
    meta = prepare(Corpus(open_sources([tmp_path / "a.jsonl"])), tmp_path / "ds", tokenizer=TokenizerKind.BPE,
                   vocab_size=300, val_fraction=0.25, val_split="document")
    data = stream(tmp_path / "ds")
    eos = sum(int((data[s] == meta.eos_id).sum()) for s in ("train", "val"))
    assert eos == meta.num_documents == 40  # one end-of-document per document, in its one split


def test_sharded_tokens_index_like_one_array():
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 1000, size=n).astype(np.uint16) for n in (5, 0, 17, 1, 40, 3)]
    whole = np.concatenate(parts)
    tokens = ShardedTokens(parts)
    assert len(tokens) == len(whole) and tokens.dtype == np.uint16
    for start in range(len(whole) + 1):
        for stop in (start, start + 1, start + 7, start + 30, len(whole) + 5):
            assert np.array_equal(tokens[start:stop], whole[start:stop]), (start, stop)
    assert [tokens[i] for i in range(-3, 3)] == [whole[i] for i in range(-3, 3)]
    assert np.array_equal(np.asarray(tokens), whole) and np.array_equal(tokens[::3], whole[::3])
    with pytest.raises(IndexError):
        tokens[len(whole)]


def test_the_trainer_windows_of_a_sharded_dataset_are_those_of_one_file(formats, tmp_path):
    """Batches are a pure function of (seed, step) over the stream: the same for any shard layout."""
    kwargs = {"tokenizer": TokenizerKind.BYTES, "workers": 1}
    prepare(Corpus(open_sources(formats["hf"])), tmp_path / "many", shard_size=shard_size(formats["hf"]) // 6,
            **kwargs)
    prepare(Corpus(open_sources(formats["hf"])), tmp_path / "one", shard_size=1 << 40, **kwargs)
    many, one = open_dataset(tmp_path / "many"), open_dataset(tmp_path / "one")
    assert len(many.meta.shards) >= 20 and isinstance(many.split("train"), ShardedTokens)
    for step in range(50):
        starts = batch_starts(3, step, 8, len(one.split("train")), 256)
        assert np.array_equal(starts, batch_starts(3, step, 8, len(many.split("train")), 256))
        assert np.array_equal(windows(many.split("train"), starts, 256), windows(one.split("train"), starts, 256))


def test_a_dataset_from_before_shards_still_opens(tmp_path):
    """train.bin / val.bin and a meta.json without ``shards`` (as written before): one shard each."""
    (tmp_path / "t.txt").write_text(TEXTS[0])
    meta = prepare(Corpus(open_sources([tmp_path / "t.txt"])), tmp_path / "ds", tokenizer=TokenizerKind.BYTES)
    old = json.loads((tmp_path / "ds" / META_FILE).read_text())
    for key in ("shards", "val_split"):
        del old[key]
    (tmp_path / "ds" / META_FILE).write_text(json.dumps(old))
    for split in ("train", "val"):
        os.replace(tmp_path / "ds" / f"{split}-00000.bin", tmp_path / "ds" / f"{split}.bin")
    data = open_dataset(tmp_path / "ds")
    assert data.meta.shards is None and data.meta.fingerprint == meta.fingerprint
    assert bytes(np.asarray(data.split("train")).astype(np.uint8)) == TEXTS[0].encode()[: meta.tokens["train"]]


def test_a_worker_killed_midway_leaves_nothing_and_a_rerun_is_identical(formats, tmp_path):
    """SIGTERM to one tokenizing worker: exit 3 with one line, no dataset and no staging folder; the
    same command again writes the dataset a run never interrupted writes. The killed prepare runs in
    a process of its own (the process boundary is the point: its worker is signalled while it runs,
    and its exit code is read); the reference and the rerun run in this process."""
    args = ["data", "prepare", *map(str, formats["jsonl"]), "--tokenizer", "cl100k_base", "--workers", "2",
            "--shard-size", "20K"]
    reference = run(*args, "--out", "ref", cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr
    prepare_process = subprocess.Popen([sys.executable, "-m", "diffsweep", *args, "--out", "ds"], cwd=tmp_path,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 600  # a guard against a hang (generous: a loaded CI machine)
    while killed is None and prepare_process.poll() is None and time.monotonic() < deadline:
        # A worker writes its shard as .train-NNNNN.bin.<its pid>.tmp in the staging folder (fsutil.temporary_name).
        for temp in tmp_path.glob(".ds.*/.train-*.bin.*.tmp"):
            killed = int(temp.name.removesuffix(".tmp").rsplit(".", 1)[1])
            os.kill(killed, signal.SIGTERM)
            break
        time.sleep(0.01)
    if killed is None:
        prepare_process.kill()
    _, stderr = prepare_process.communicate(timeout=600)
    assert killed is not None, "no worker was seen writing a shard"
    assert prepare_process.returncode == 3, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr and "worker" in errors[0], stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref"]
    rerun = run(*args, "--out", "ds", cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert shard_bytes(tmp_path / "ds") == shard_bytes(tmp_path / "ref")
    assert (tmp_path / "ds" / META_FILE).read_text() == (tmp_path / "ref" / META_FILE).read_text()


@pytest.mark.parametrize(("args", "says"), [
    (["--workers", "0"], "--workers: expected at least 1 worker, got 0"),
    (["--shard-size", "lots"], "--shard-size: expected a size such as 256M or 1G, got 'lots'"),
    (["--shard-size", "0"], "--shard-size: expected a positive size, got '0'"),
    (["--val-split", "random"], "--val-split: expected one of tail, document, got 'random'"),
])
def test_bad_prepare_options_are_one_line(tmp_path, args, says):
    (tmp_path / "t.txt").write_text(TEXTS[0])
    r = run("data", "prepare", "t.txt", "--out", "ds", "--tokenizer", "bytes", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"error: {says}"], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]
