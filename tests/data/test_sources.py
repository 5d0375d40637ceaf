"""``data prepare``'s sources: the same English corpus as text files, JSONL (plain, .gz, .zst),
Parquet and a Hugging Face dataset saved to disk gives the same token files; ``--max-tokens`` and
``--sample``; and every bad input as one ``error:`` line naming the file (and row), exit 2 or 3,
nothing left behind. Everything is made here: nothing is downloaded. The CLI runs in this process
(``tests.helpers.cli.run``) but for the Hugging Face cache lookup (see its docstring)."""

from __future__ import annotations

import gzip
import json
import pydoc_data.topics
from pathlib import Path

import numpy as np
import pytest

from diffsweep.config import ConfigError, EnvironmentUnavailable, TokenizerKind
from diffsweep.data.dataset import open_dataset
from diffsweep.data.errors import optional_module
from diffsweep.data.prepare import prepare
from diffsweep.data.sources import Corpus, keep, open_sources
from tests.helpers.badinput import refused
from tests.helpers.cli import run, run_process

# Twelve pydoc topics (~60 kB of English): one document each, in this order.
TEXTS = [text for _, text in sorted(pydoc_data.topics.topics.items())[:12]]
BPE = {"tokenizer": TokenizerKind.BPE, "vocab_size": 300, "val_fraction": 0.1}


def write_corpus(root: Path, texts=TEXTS) -> dict[str, Path]:
    """The corpus in every format, by format name."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard
    from datasets import Dataset

    root.mkdir(parents=True, exist_ok=True)
    (root / "txt").mkdir()
    for i, text in enumerate(texts):
        (root / "txt" / f"{i:02d}.txt").write_text(text, encoding="utf-8")
    lines = b"".join(json.dumps({"id": i, "text": t}).encode() + b"\n" for i, t in enumerate(texts))
    (root / "c.jsonl").write_bytes(lines)
    (root / "c.jsonl.gz").write_bytes(gzip.compress(lines))
    (root / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), root / "c.parquet", row_group_size=5)
    Dataset.from_dict({"id": list(range(len(texts))), "text": texts}).save_to_disk(str(root / "hf"))
    return {"txt": root / "txt", "jsonl": root / "c.jsonl", "jsonl.gz": root / "c.jsonl.gz",
            "jsonl.zst": root / "c.jsonl.zst", "parquet": root / "c.parquet", "hf": root / "hf"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_corpus(tmp_path_factory.mktemp("sources") / "corpus")


def token_files(out: Path) -> tuple[bytes, ...]:
    return tuple((out / name).read_bytes() for name in ("train-00000.bin", "val-00000.bin", "tokenizer.json"))


def test_every_format_gives_the_same_tokens(corpus, tmp_path):
    """Same documents, same order: the same BPE and the same train.bin / val.bin, whatever the format;
    meta.json names each source with its format and document count."""
    reference = prepare(Corpus(open_sources([corpus["txt"]])), tmp_path / "ref", **BPE)
    expected = token_files(tmp_path / "ref")
    for name, path in corpus.items():
        meta = prepare(Corpus(open_sources([path])), tmp_path / name, **BPE)
        assert token_files(tmp_path / name) == expected, name
        assert meta.tokens == reference.tokens and meta.num_documents == len(TEXTS)
        assert sum(s["documents"] for s in meta.sources) == len(TEXTS)
        assert {s["format"] for s in meta.sources} == {"txt": {"text"}, "hf": {"hf-dataset"}}.get(
            name, {name.split(".")[0]})
    # Text files read as sources keep the fingerprint they had when read into a list.
    assert open_dataset(tmp_path / "txt").meta.fingerprint == reference.fingerprint
    hf = open_dataset(tmp_path / "hf").meta.sources[0]
    assert hf["dataset"] == str(corpus["hf"]) and hf["split"] == "train" and len(hf["fingerprint"]) > 0


def test_a_saved_dataset_dict_takes_split(tmp_path):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_dict({"text": TEXTS[:3]}),
                 "test": Dataset.from_dict({"text": TEXTS[3:5]})}).save_to_disk(str(tmp_path / "dd"))
    meta = prepare(Corpus(open_sources([tmp_path / "dd"], split="test")), tmp_path / "ds", TokenizerKind.BYTES)
    assert meta.num_documents == 2 and meta.sources[0]["split"] == "test"
    with pytest.raises(ConfigError, match=r"dd: no split 'dev' \(it has: train, test\)"):
        prepare(Corpus(open_sources([tmp_path / "dd"], split="dev")), tmp_path / "ds2", TokenizerKind.BYTES)


@pytest.mark.parametrize("max_tokens", [1, 1000, 7777])
def test_max_tokens_writes_exactly_that_many(corpus, tmp_path, max_tokens):
    """bytes (no eos): exactly N tokens, the document that crosses N cut to its first bytes."""
    meta = prepare(Corpus(open_sources([corpus["jsonl"]])), tmp_path / "ds", TokenizerKind.BYTES,
                   max_tokens=max_tokens)
    assert sum(meta.tokens.values()) == max_tokens and meta.max_tokens == max_tokens
    lengths = np.cumsum([len(t.encode()) for t in TEXTS])
    assert meta.num_documents == int(np.searchsorted(lengths, max_tokens)) + 1
    ds = open_dataset(tmp_path / "ds")
    whole = b"".join(t.encode() for t in TEXTS)
    assert sorted(ds.split("train").tolist() + ds.split("val").tolist()) == sorted(whole[:max_tokens])


def test_max_tokens_with_eos_and_the_fingerprint(corpus, tmp_path):
    """bpe: both parts of the cut document end with eos and the total is exactly N; a budget is part
    of the dataset's identity."""
    full = prepare(Corpus(open_sources([corpus["jsonl"]])), tmp_path / "full", **BPE)
    cut = prepare(Corpus(open_sources([corpus["jsonl"]])), tmp_path / "cut", **BPE, max_tokens=2001)
    assert sum(cut.tokens.values()) == 2001 and cut.fingerprint != full.fingerprint
    ds = open_dataset(tmp_path / "cut")
    assert ds.split("train")[-1] == ds.split("val")[-1] == cut.eos_id


def test_sample_is_deterministic_and_about_the_fraction(tmp_path):
    names = [f"c.jsonl:{row}" for row in range(1, 20001)]
    kept = [n for n in names if keep(n, 0.3, seed=1)]
    assert kept == [n for n in names if keep(n, 0.3, seed=1)]
    assert abs(len(kept) / len(names) - 0.3) < 0.02
    assert kept != [n for n in names if keep(n, 0.3, seed=2)]
    # Through prepare: the same documents twice, others with another seed; recorded in meta.json.
    texts = [f"document {i}: " + TEXTS[i % len(TEXTS)][:200] for i in range(200)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    metas = [prepare(Corpus(open_sources([tmp_path / "c.jsonl"]), sample=0.25, seed=seed), tmp_path / f"ds{i}",
                     TokenizerKind.BYTES) for i, seed in enumerate((7, 7, 8))]
    assert metas[0].tokens == metas[1].tokens and metas[0].fingerprint == metas[1].fingerprint
    assert metas[0].fingerprint != metas[2].fingerprint
    assert 30 < metas[0].num_documents < 70 and (metas[0].sample, metas[0].seed) == (0.25, 7)
    assert token_files_bins(tmp_path / "ds0") == token_files_bins(tmp_path / "ds1") != token_files_bins(tmp_path / "ds2")


def token_files_bins(out: Path) -> tuple[bytes, ...]:
    return tuple((out / name).read_bytes() for name in ("train-00000.bin", "val-00000.bin"))


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_sources_are_read_lazily(tmp_path, suffix):
    """A source yields its first documents before it reads the rest (nothing holds the corpus):
    a bad last row is only met when the pass gets there."""
    rows = [{"text": "first"}, {"text": "second"}] + [{"text": f"row {i}"} for i in range(3000)] + [{"body": "x"}]
    path = tmp_path / f"c{suffix}"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [r.get("text") for r in rows], "body": [r.get("body") for r in rows]}),
                       path, row_group_size=100)
        bad = f"{path}:{len(rows)}: 'text' is not a string (it is null)"
    else:
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
        bad = f"{path}:{len(rows)}: no 'text' field (it has: body)"
    documents = Corpus(open_sources([path])).documents()
    assert [next(documents).text, next(documents).text] == ["first", "second"]
    with pytest.raises(ConfigError) as err:
        list(documents)
    assert str(err.value) == bad


def test_a_missing_optional_package_names_the_extra():
    with pytest.raises(EnvironmentUnavailable, match=r"needs the no_such_package package: .*diffsweep\[corpora\]"):
        optional_module("no_such_package", "a test file")


# --- through the CLI ------------------------------------------------------------------------------


def test_cli_prepares_a_compressed_jsonl_and_info_shows_its_sources(corpus, tmp_path):
    r = run("data", "prepare", str(corpus["jsonl.gz"]), str(corpus["txt"] / "00.txt"), "--out", "ds",
            "--tokenizer", "bytes", "--max-tokens", "5000", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("ds: 4,750 train + 250 val tokens, bytes vocab 256, 2 documents"), r.stdout
    info = json.loads(run("data", "info", "ds", cwd=tmp_path).stdout)
    assert [(s["format"], s["documents"]) for s in info["sources"]] == [("jsonl", 2), ("text", 0)]
    assert sum(info["tokens"].values()) == 5000 and info["max_tokens"] == 5000


def _rows(*rows: bytes) -> bytes:
    return b"".join(row + b"\n" for row in rows)


def _parquet(**columns) -> bytes:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    return buffer.getvalue()


GOOD = json.dumps({"text": "good text"}).encode()
# case -> (a file, its bytes, the arguments before --out, exit code, how the error line starts)
BAD = {
    "no-field": ("c.jsonl", _rows(GOOD, b'{"body": "x", "id": 3}'), ["c.jsonl"], 2, "c.jsonl:2: no 'text' field (it has: body, id)"),
    "other-field": ("c.jsonl", _rows(GOOD), ["c.jsonl", "--text-field", "content"], 2, "c.jsonl:1: no 'content' field (it has: text)"),
    "not-a-string": ("c.jsonl", _rows(GOOD, GOOD, b'{"text": 12}'), ["c.jsonl"], 2, "c.jsonl:3: 'text' is not a string (it is a number)"),
    "null": ("c.jsonl", _rows(b'{"text": null}'), ["c.jsonl"], 2, "c.jsonl:1: 'text' is not a string (it is null)"),
    "not-json": ("c.jsonl", _rows(GOOD, b'{"text": "unterminated'), ["c.jsonl"], 2, "c.jsonl:2: not a JSON object"),
    "not-an-object": ("c.ndjson", _rows(b'["text"]'), ["c.ndjson"], 2, "c.ndjson:1: not a JSON object (it is an array)"),
    "not-utf8": ("c.jsonl", _rows(GOOD, b'{"text": "caf\xe9"}'), ["c.jsonl"], 2, "c.jsonl:2: not UTF-8 text"),
    "only-empty-texts": ("c.jsonl", _rows(b'{"text": ""}', b'{"text": "  \\n"}', b""), ["c.jsonl"], 2,
                         "c.jsonl: no documents with text"),
    "empty-file": ("c.jsonl", b"", ["c.jsonl"], 2, "c.jsonl: no documents with text"),
    "corrupt-gz": ("c.jsonl.gz", gzip.compress(_rows(GOOD) * 50)[:30], ["c.jsonl.gz"], 2, "c.jsonl.gz: truncated"),
    "not-gz": ("c.jsonl.gz", _rows(GOOD), ["c.jsonl.gz"], 2, "c.jsonl.gz: cannot read it"),
    "corrupt-zst": ("c.jsonl.zst", b"\x28\xb5\x2f\xfd garbage", ["c.jsonl.zst"], 2, "c.jsonl.zst: cannot read it"),
    "corrupt-parquet": ("c.parquet", b"PAR1 not really", ["c.parquet"], 2, "c.parquet: not a readable Parquet file"),
    "parquet-no-column": ("c.parquet", _parquet(body=["x"], id=[1]), ["c.parquet"], 2,
                          "c.parquet: no 'text' column (it has: body, id)"),
    "parquet-not-strings": ("c.parquet", _parquet(text=[1, 2]), ["c.parquet"], 2,
                            "c.parquet:1: 'text' is not a string (it is a number)"),
    "missing-file": ("other.txt", b"x", ["c.jsonl"], 2, "c.jsonl: no such file or directory"),
    "missing-dir": ("other.txt", b"x", ["corpus/"], 2, "corpus/: no such file or directory"),
    "missing-nested": ("other.txt", b"x", ["my/own/corpus"], 2, "my/own/corpus: no such file or directory"),
    "bad-max-tokens": ("c.jsonl", _rows(GOOD), ["c.jsonl", "--max-tokens", "0"], 2, "--max-tokens: expected at least 1 token "),
    "bad-sample": ("c.jsonl", _rows(GOOD), ["c.jsonl", "--sample", "1.5"], 2, "--sample: expected a fraction in (0, 1]"),
    "sample-keeps-none": ("c.jsonl", _rows(GOOD), ["c.jsonl", "--sample", "1e-9"], 2, "--sample: kept none of the documents"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, case):
    name, data, args, code, says = BAD[case]
    (tmp_path / name).write_bytes(data)
    r = run("data", "prepare", *args, "--out", "new/ds", "--tokenizer", "bytes", cwd=tmp_path)
    line = refused(r, code=code)
    assert line.startswith(f"error: {says}"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no --out, no parent, no staging


def test_a_dataset_name_not_in_the_cache_is_exit_3_and_downloads_nothing(tmp_path):
    """A Hugging Face name is looked up in the local cache only (an empty HF_HOME here). A fresh
    process: ``datasets`` and ``huggingface_hub`` read HF_HOME when they are imported, so only a new
    interpreter is sure to look in the empty cache and not in this machine's."""
    r = run_process("data", "prepare", "no-such-org/no-such-corpus", "--config", "sample-10BT", "--out", "ds",
                    "--tokenizer", "bytes", cwd=tmp_path, env={"HF_HOME": str(tmp_path / "hf-home")})
    line = refused(r, code=3)
    assert line.startswith("error: no-such-org/no-such-corpus: not in the local Hugging Face cache "
                           "(config sample-10BT, split train); nothing is downloaded at run time"), line
    assert not (tmp_path / "ds").exists()
