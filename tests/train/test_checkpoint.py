"""Checkpoints: a real training state round trips through ``weights_only`` loading; files are
named by step, written atomically and pruned to the newest k; every unreadable file is a one-line
ConfigError naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from diffsweep.config import ConfigError, load_config, to_dict
from diffsweep.model.transformer import build_model
from diffsweep.train.checkpoint import (
    FORMAT,
    REQUIRED,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from diffsweep.train.optim import build_optimizer


def _state(step: int = 3) -> dict:
    """A state shaped like the trainer's: tiny DIFF V1 model and AdamW after one real step."""
    config = load_config(None, ["model.size=tiny-xs", "model.vocab_size=512", "model.attention.kind=diff_v1"])
    torch.manual_seed(0)
    model = build_model(config.model)
    optimizer = build_optimizer(model, config.train)
    model(torch.randint(0, 512, (2, 16))).float().logsumexp(-1).mean().backward()
    optimizer.step()
    return {
        "step": step,
        "tokens_seen": step * 128,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": {"schedule": "linear", "step": step, "total_steps": 12},
        "data": {"seed": 0, "next_step": step + 1, "fingerprint": "ab" * 32},
        "rng": {"torch": torch.get_rng_state(), "cuda": []},
        "run_key": "0123456789ab",
        "mlflow_run_id": None,
        "metrics_state": {"spikes": {"history": [2.5, 2.4], "count": 0}},
        "config": to_dict(config),
    }


def _assert_same(a, b, where: str = "state") -> None:
    assert type(a) is type(b) or (isinstance(a, tuple | list) and isinstance(b, tuple | list)), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def state() -> dict:
    return _state()


def test_round_trip(tmp_path, state):
    """Everything saved comes back equal (tensors bitwise, same dtypes) with the format tag, and
    the model and optimizer states load into fresh objects."""
    path = save_checkpoint(tmp_path, state, keep=3)
    assert path == tmp_path / "step_00000003.pt" == checkpoint_path(tmp_path, 3)
    loaded = load_checkpoint(path)
    assert loaded["format"] == FORMAT
    _assert_same({k: v for k, v in loaded.items() if k != "format"}, state)
    config = load_config(None, ["model.size=tiny-xs", "model.vocab_size=512", "model.attention.kind=diff_v1"])
    model = build_model(config.model)
    model.load_state_dict(loaded["model"])
    build_optimizer(model, config.train).load_state_dict(loaded["optimizer"])


def test_loading_is_weights_only(tmp_path, state):
    """A file holding an arbitrary Python object (loadable only by unpickling code) is refused."""
    path = save_checkpoint(tmp_path, state | {"config": Path("/etc/passwd")}, keep=3)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "corrupt or truncated checkpoint (weights-only load: Unsupported global")
    assert "pathlib.PosixPath" in str(err.value)


def test_names_atomicity_and_listing(tmp_path, state):
    """Files are step_XXXXXXXX.pt; no temporary file remains; listing is by step and ignores
    anything else in the directory."""
    directory = tmp_path / "run" / "checkpoints"  # created on first save
    for step in (10, 2, 100_000):
        save_checkpoint(directory, state | {"step": step}, keep=10)
    (directory / "notes.txt").write_text("x")
    (directory / "step_5.pt").write_text("x")
    (directory / ".step_00000007.pt.tmp").write_text("torn")
    assert [p.name for p in list_checkpoints(directory)] == ["step_00000002.pt", "step_00000010.pt",
                                                               "step_00100000.pt"]
    assert sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp")) == [".step_00000007.pt.tmp"]
    assert list_checkpoints(tmp_path / "nowhere") == []


def test_keep_prunes_oldest(tmp_path, state):
    """Only the newest ``keep`` checkpoints survive a save."""
    for step in range(1, 6):
        save_checkpoint(tmp_path, state | {"step": step}, keep=2)
        assert len(list_checkpoints(tmp_path)) == min(step, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004.pt", "step_00000005.pt"]
    save_checkpoint(tmp_path, state | {"step": 6}, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000006.pt"]
    assert load_checkpoint(tmp_path / "step_00000006.pt")["step"] == 6


def test_keep_never_deletes_the_checkpoint_just_written(tmp_path, state):
    """Resumed from an older checkpoint and preempted at an odd step: that save survives pruning."""
    for step in (10, 20):
        save_checkpoint(tmp_path, state | {"step": step}, keep=2)
    save_checkpoint(tmp_path, state | {"step": 13}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000013.pt", "step_00000020.pt"]


def test_same_step_overwrites(tmp_path, state):
    save_checkpoint(tmp_path, state | {"tokens_seen": 1}, keep=3)
    save_checkpoint(tmp_path, state | {"tokens_seen": 2}, keep=3)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000003.pt"]
    assert load_checkpoint(tmp_path / "step_00000003.pt")["tokens_seen"] == 2


def test_failed_save_leaves_no_file(tmp_path, state):
    """A save that fails while writing (an unpicklable value) leaves neither a temporary file nor
    a checkpoint, and the existing checkpoints untouched."""
    good = save_checkpoint(tmp_path, state, keep=3)
    before = good.read_bytes()
    with pytest.raises(Exception):
        save_checkpoint(tmp_path, state | {"step": 4, "metrics_state": {"f": lambda: 0}}, keep=3)
    assert [p.name for p in tmp_path.iterdir()] == [good.name]
    assert good.read_bytes() == before


# --- unreadable files -----------------------------------------------------------------------------


def _one_line_naming(err: pytest.ExceptionInfo, path: Path, words: str) -> None:
    message = str(err.value)
    assert err.value.key == str(path)
    assert message.startswith(f"{path}: ") and words in message
    assert "\n" not in message and len(message) < len(str(path)) + 300
    # torch's weights-only errors carry ANSI escapes and advice to load unsafely: kept out.
    reason = message.removeprefix(f"{path}: ")
    assert "\x1b" not in reason and "weights_only" not in reason


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_checkpoint(tmp_path / "step_00000001.pt")
    _one_line_naming(err, tmp_path / "step_00000001.pt", "not found")


@pytest.mark.parametrize("keep_fraction", [0.5, 0.99, 0.0])
def test_truncated_file(tmp_path, state, keep_fraction):
    """A checkpoint cut short (as by a crash of a non-atomic writer, or a full disk) is refused."""
    path = save_checkpoint(tmp_path, state, keep=3)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "corrupt or truncated")


def test_garbage_file(tmp_path):
    path = tmp_path / "step_00000001.pt"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "corrupt or truncated")
    path.write_text("step: 1\nmodel: {}\n")
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "corrupt or truncated")


@pytest.mark.parametrize(
    "content",
    [{"format": "other/1", "step": 1}, {"step": 1}, [1, 2], torch.zeros(3)],
    ids=["format", "no-format", "list", "tensor"],
)
def test_foreign_file(tmp_path, content):
    """A readable torch file that is not one of ours names the expected format."""
    path = tmp_path / "step_00000001.pt"
    torch.save(content, path)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, f"not a diffsweep checkpoint (expected format {FORMAT!r})")


def test_missing_keys(tmp_path, state):
    """A checkpoint of our format that lacks required entries lists them, in order."""
    path = save_checkpoint(tmp_path, {k: v for k, v in state.items() if k not in ("optimizer", "rng")}, keep=3)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "checkpoint lacks optimizer, rng")
    assert set(REQUIRED) - {"format"} <= set(state)
