"""Checkpoints: a real model and optimizer state round trips through DCP shards and a
``weights_only`` training state; directories are named by step, written atomically and pruned to
the newest k; every file's checksum is recorded and a damaged file is found, naming it; loading
never runs code from the files; every unreadable checkpoint is a one-line ConfigError naming it.
(Resharding across process counts: tests/train/test_distributed.py.)"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from diffsweep.config import ConfigError, load_config, to_dict
from diffsweep.model.transformer import build_model
from diffsweep.train.checkpoint import (
    CHECKSUMS_FILE,
    FORMAT,
    REQUIRED,
    SINGLE_FILE_FORMAT,
    STATE_FILE,
    UNVERIFIED_FORMAT,
    CorruptCheckpoint,
    checkpoint_path,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    load_tensors,
    save_checkpoint,
    verify_shards,
)
from diffsweep.train.distributed import load_sharded_state, sharded_state
from diffsweep.train.optim import build_optimizer

OVERRIDES = ["model.size=tiny-xs", "model.vocab_size=512", "model.attention.kind=diff_v1"]


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Tiny DIFF V1 model and AdamW after one real step."""
    config = load_config(None, OVERRIDES)
    torch.manual_seed(0)
    model = build_model(config.model)
    optimizer = build_optimizer(model, config.train)
    model(torch.randint(0, 512, (2, 16))).float().logsumexp(-1).mean().backward()
    optimizer.step()
    return model, optimizer


def _fresh() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    config = load_config(None, OVERRIDES)
    torch.manual_seed(1)
    model = build_model(config.model)
    return model, build_optimizer(model, config.train)


def _state(step: int, groups: list) -> dict:
    """A training state shaped like the trainer's."""
    return {
        "step": step,
        "tokens_seen": step * 128,
        "optimizer_groups": groups,
        "scheduler": {"schedule": "linear", "step": step, "total_steps": 12},
        "data": {"seed": 0, "next_step": step + 1, "fingerprint": "ab" * 32},
        "rng": {"torch": torch.get_rng_state(), "cuda": []},
        "run_key": "0123456789ab",
        "mlflow_run_id": None,
        "metrics_state": {"spikes": {"history": [2.5, 2.4], "count": 0}},
        "config": to_dict(load_config(None, OVERRIDES)),
    }


@pytest.fixture(scope="module")
def trained():
    model, optimizer = _trained()
    tensors, groups = sharded_state(model, optimizer)
    return tensors, _state(3, groups)


def _save(directory: Path, trained, keep: int = 3, **changes) -> Path:
    tensors, state = trained
    return save_checkpoint(directory, state | changes, tensors, keep=keep)


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


def test_round_trip(tmp_path, trained):
    """The training state comes back equal; the shards fill a fresh model and optimizer with
    bitwise the saved tensors (same dtypes)."""
    path = _save(tmp_path, trained)
    assert path == tmp_path / "step_00000003" == checkpoint_path(tmp_path, 3) and checkpoint_step(path) == 3
    assert sorted(p.name for p in path.iterdir()) == [".metadata", "__0_0.distcp", CHECKSUMS_FILE, STATE_FILE]
    loaded = load_checkpoint(path)
    assert loaded["format"] == FORMAT
    _assert_same({k: v for k, v in loaded.items() if k != "format"}, trained[1])
    model, optimizer = _fresh()
    tensors, _ = sharded_state(model, optimizer)
    assert not all(torch.equal(tensors["model"][k], v) for k, v in trained[0]["model"].items())
    load_tensors(path, tensors)
    _assert_same(tensors, trained[0])


def test_names_atomicity_and_listing(tmp_path, trained):
    """Checkpoints are step_XXXXXXXX directories (and single files from before sharding); no
    temporary directory remains; listing is by step and ignores anything else."""
    directory = tmp_path / "run" / "checkpoints"  # created on first save
    for step in (10, 2, 100_000):
        _save(directory, trained, keep=10, step=step)
    torch.save({}, directory / "step_00000007.pt")
    (directory / "notes.txt").write_text("x")
    (directory / "step_5").mkdir()
    (directory / "step_00000004.pt").mkdir()  # neither a file nor a checkpoint directory
    (directory / ".step_00000008.tmp").mkdir()  # a save that crashed
    assert [p.name for p in list_checkpoints(directory)] == ["step_00000002", "step_00000007.pt", "step_00000010",
                                                               "step_00100000"]
    assert sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp")) == [".step_00000008.tmp"]
    assert list_checkpoints(tmp_path / "nowhere") == []


def test_a_save_replaces_its_own_crashed_temporary(tmp_path, trained):
    (tmp_path / ".step_00000003.tmp").mkdir()
    (tmp_path / ".step_00000003.tmp" / "__0_0.distcp").write_text("torn")
    path = _save(tmp_path, trained)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]
    load_tensors(path, sharded_state(*_fresh())[0])


def test_keep_prunes_oldest(tmp_path, trained):
    """Only the newest ``keep`` checkpoints survive a save, single files from before sharding too."""
    torch.save({}, tmp_path / "step_00000001.pt")
    for step in range(2, 6):
        _save(tmp_path, trained, keep=2, step=step)
        assert len(list_checkpoints(tmp_path)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000005"]
    _save(tmp_path, trained, keep=1, step=6)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000006"]
    assert load_checkpoint(tmp_path / "step_00000006")["step"] == 6


def test_keep_never_deletes_the_checkpoint_just_written(tmp_path, trained):
    """Resumed from an older checkpoint and preempted at an odd step: that save survives pruning."""
    for step in (10, 20):
        _save(tmp_path, trained, keep=2, step=step)
    _save(tmp_path, trained, keep=2, step=13)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000013", "step_00000020"]


def test_same_step_overwrites(tmp_path, trained):
    _save(tmp_path, trained, tokens_seen=1)
    _save(tmp_path, trained, tokens_seen=2)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000003"]
    assert load_checkpoint(tmp_path / "step_00000003")["tokens_seen"] == 2


def test_failed_save_leaves_no_torn_checkpoint(tmp_path, trained):
    """A save that fails while writing (an unpicklable value) leaves neither a temporary directory
    nor a checkpoint, and the existing checkpoints untouched."""
    good = _save(tmp_path, trained)
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    with pytest.raises(Exception):  # noqa: B017 (what pickling a lambda raises differs across Python versions)
        _save(tmp_path, trained, step=4, metrics_state={"f": lambda: 0})
    assert [p.name for p in tmp_path.iterdir()] == [good.name]
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before


# --- checksums ----------------------------------------------------------------------------------


def _flip(file: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of ``file`` (its size unchanged), as a bad disk might."""
    data = bytearray(file.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    file.write_bytes(bytes(data))


def _unverified(path: Path) -> Path:
    """The checkpoint as written before checksums (format /2, no checksums.json), which still
    loads: only its own structure guards it."""
    (path / CHECKSUMS_FILE).unlink()
    state = torch.load(path / STATE_FILE, weights_only=True)
    torch.save(state | {"format": UNVERIFIED_FORMAT}, path / STATE_FILE)
    return path


def test_checksums_record_every_file(tmp_path, trained):
    import json
    import zlib

    path = _save(tmp_path, trained)
    recorded = json.loads((path / CHECKSUMS_FILE).read_text())
    assert recorded["algorithm"] == "crc32"
    assert recorded["files"] == {p.name: {"size": p.stat().st_size, "crc32": zlib.crc32(p.read_bytes())}
                                 for p in path.iterdir() if p.name != CHECKSUMS_FILE}
    load_checkpoint(path)
    verify_shards(path)


@pytest.mark.parametrize("name", ["__0_0.distcp", STATE_FILE, ".metadata"])
def test_flipped_bytes_are_found_and_named(tmp_path, trained, name):
    """64 inverted bytes in any file (same size, so only the checksum can tell): the training
    state and the shards' index are checked before they are read, the shards by
    ``verify_shards``; each names the file."""
    path = _save(tmp_path, trained)
    _flip(path / name)
    check = load_checkpoint
    if name.endswith(".distcp"):
        load_checkpoint(path)  # the sizes match: the shards' checksums are verify_shards' to check
        check = verify_shards
    with pytest.raises(CorruptCheckpoint) as err:
        check(path)
    _one_line_naming(err, path / name, "corrupt (CRC-32 ")


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_truncated_or_missing_file_is_found_before_anything_is_read(tmp_path, trained, damage):
    path = _save(tmp_path, trained)
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000]) if damage == "truncate" else shard.unlink()
    with pytest.raises(CorruptCheckpoint) as err:
        load_checkpoint(path)
    _one_line_naming(err, shard, "truncated or overwritten (1000 bytes" if damage == "truncate" else "missing")


@pytest.mark.parametrize(("content", "words"), [
    (b"", "not a readable checksums file (Expecting value"),
    (b'{"files": {"__0_0.dis', "not a readable checksums file (Unterminated string"),
    (b"[1]", "expected a checksums file (a JSON object), got [1]"),
    (b'{"files": {"__0_0.distcp": {"size": -1, "crc32": 1}}}', ("files.__0_0.distcp.size: expected an integer >= 0, "
                                                              "got -1")),
    (b'{"files": {"../../x": {"size": 1, "crc32": 1}}}', "names a file outside the checkpoint (../../x)"),
], ids=["empty", "truncated", "foreign", "negative", "outside"])
def test_damaged_checksums_are_a_corrupt_checkpoint(tmp_path, trained, content, words):
    path = _save(tmp_path, trained)
    (path / CHECKSUMS_FILE).write_bytes(content)
    with pytest.raises(CorruptCheckpoint) as err:
        load_checkpoint(path)
    _one_line_naming(err, path / CHECKSUMS_FILE, words)


def test_a_checkpoint_that_lost_its_checksums_is_corrupt(tmp_path, trained):
    path = _save(tmp_path, trained)
    (path / CHECKSUMS_FILE).unlink()
    with pytest.raises(CorruptCheckpoint) as err:
        load_checkpoint(path)
    _one_line_naming(err, path / CHECKSUMS_FILE, "missing")


def test_a_checkpoint_from_before_checksums_loads_unverified(tmp_path, trained):
    path = _unverified(_save(tmp_path, trained))
    state = load_checkpoint(path)
    assert state["format"] == UNVERIFIED_FORMAT
    _assert_same({k: v for k, v in state.items() if k != "format"}, trained[1])
    verify_shards(path)  # nothing to check
    tensors = sharded_state(*_fresh())[0]
    load_tensors(path, tensors)
    _assert_same(tensors, trained[0])


# --- unreadable checkpoints -----------------------------------------------------------------------


def _one_line_naming(err: pytest.ExceptionInfo, path: Path, words: str) -> None:
    message = str(err.value)
    assert err.value.key == str(path)
    assert message.startswith(f"{path}: ") and words in message, message
    assert "\n" not in message and len(message) < len(str(path)) + 300
    # torch's weights-only errors carry ANSI escapes and advice to load unsafely: kept out.
    reason = message.removeprefix(f"{path}: ")
    assert "\x1b" not in reason and "weights_only" not in reason


def test_missing(tmp_path):
    for path in (tmp_path / "step_00000001", tmp_path / "step_00000001.pt"):
        with pytest.raises(ConfigError) as err:
            load_checkpoint(path)
        _one_line_naming(err, path, "not found")


def test_the_training_state_is_loaded_weights_only(tmp_path, trained):
    """A training state holding an arbitrary Python object (loadable only by unpickling code)
    is refused."""
    path = _save(tmp_path, trained, config=Path("/etc/passwd"))
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path / STATE_FILE, "corrupt or truncated checkpoint (weights-only load: Unsupported global")
    assert "pathlib.PosixPath" in str(err.value)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_shard_metadata_that_would_run_code_is_refused(tmp_path, trained, monkeypatch):
    """DCP unpickles its ``.metadata`` with plain pickle: ours refuses any global outside DCP's
    metadata classes before DCP sees the file, so nothing runs."""
    monkeypatch.chdir(tmp_path)
    path = _unverified(_save(tmp_path, trained))  # or whoever wrote the file rewrote its checksum too
    (path / ".metadata").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "corrupt checkpoint .metadata (UnpicklingError: unsupported global posix.system")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_shards_holding_non_tensors_are_refused(tmp_path):
    """DCP reads non-tensor entries with unsafe pickle; a checkpoint with one is refused."""
    path = tmp_path / "step_00000001"
    dcp.save({"model": {"w": torch.ones(2)}, "extra": {"note": "x"}}, checkpoint_id=path, no_dist=True)
    torch.save(_state(1, []) | {"format": UNVERIFIED_FORMAT}, path / STATE_FILE)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "checkpoint shards hold a non-tensor entry (extra.note)")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_damaged_shard_metadata(tmp_path, trained, damage):
    path = _unverified(_save(tmp_path, trained))
    metadata = path / ".metadata"
    if damage == "truncate":
        metadata.write_bytes(metadata.read_bytes()[:100])
    elif damage == "garbage":
        metadata.write_bytes(os.urandom(512))
    else:
        metadata.unlink()
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path, "checkpoint lacks .metadata" if damage == "delete" else "corrupt checkpoint .metadata")


@pytest.mark.parametrize("keep_fraction", [0.5, 0.0])
def test_truncated_shard(tmp_path, trained, keep_fraction):
    """A shard cut short (a full disk, a copy gone wrong) in a checkpoint without checksums is
    found when the tensors are read."""
    path = _unverified(_save(tmp_path, trained))
    shard = path / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: int(shard.stat().st_size * keep_fraction)])
    load_checkpoint(path)  # the index is intact
    with pytest.raises(ConfigError) as err:
        load_tensors(path, sharded_state(*_fresh())[0])
    _one_line_naming(err, path, "corrupt or truncated checkpoint shards (")


@pytest.mark.parametrize("keep_fraction", [0.5, 0.99, 0.0])
def test_truncated_training_state(tmp_path, trained, keep_fraction):
    """A training state cut short (as by a crash of a non-atomic writer, or a full disk) is refused."""
    path = _unverified(_save(tmp_path, trained)) / STATE_FILE
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep_fraction)])
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path.parent)
    _one_line_naming(err, path, "corrupt or truncated")


def test_garbage_files(tmp_path, trained):
    for path in (_unverified(_save(tmp_path, trained)) / STATE_FILE, tmp_path / "step_00000001.pt"):
        checkpoint = path.parent if path.name == STATE_FILE else path
        for content in (os.urandom(4096), b"step: 1\nmodel: {}\n"):
            path.write_bytes(content)
            with pytest.raises(ConfigError) as err:
                load_checkpoint(checkpoint)
            _one_line_naming(err, path, "corrupt or truncated")


@pytest.mark.parametrize(
    "content",
    [{"format": "other/1", "step": 1}, {"step": 1}, [1, 2], torch.zeros(3)],
    ids=["format", "no-format", "list", "tensor"],
)
def test_foreign_files(tmp_path, trained, content):
    """A readable torch file that is not one of ours names the expected format."""
    path = _unverified(_save(tmp_path, trained)) / STATE_FILE
    torch.save(content, path)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path.parent)
    _one_line_naming(err, path, f"not a diffsweep checkpoint (expected format {FORMAT!r})")
    single = tmp_path / "step_00000001.pt"
    torch.save(content, single)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(single)
    _one_line_naming(err, single, f"not a diffsweep checkpoint (expected format {SINGLE_FILE_FORMAT!r})")


def test_missing_keys(tmp_path, trained):
    """A training state of our format that lacks required entries lists them, in order."""
    tensors, state = trained
    path = save_checkpoint(tmp_path, {k: v for k, v in state.items() if k not in ("optimizer_groups", "rng")},
                           tensors, keep=3)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(path)
    _one_line_naming(err, path / STATE_FILE, "checkpoint lacks optimizer_groups, rng")
    assert set(REQUIRED) - {"format"} <= set(state)
    single = tmp_path / "step_00000001.pt"
    torch.save({"format": SINGLE_FILE_FORMAT, "step": 1, "tokens_seen": 0}, single)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(single)
    _one_line_naming(err, single, "checkpoint lacks model, optimizer, scheduler")


@pytest.mark.parametrize(("written_fused", "read_fused"), [(False, True), (True, False)],
                         ids=["foreach-then-fused", "fused-then-foreach"])
def test_a_checkpoint_of_one_adamw_update_resumes_with_the_other(tmp_path, written_fused, read_fused):
    """The fused AdamW (the default) and the foreach one keep the same state: a checkpoint written
    with one resumes with the other, whose next step is the writer's next step to fp32 rounding
    (on this CPU, bit for bit)."""
    config = load_config(None, OVERRIDES)
    batch = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))

    def step(model, optimizer):
        optimizer.zero_grad(set_to_none=True)
        model(batch).float().logsumexp(-1).mean().backward()
        optimizer.step()

    torch.manual_seed(0)
    writer = build_model(config.model)
    writer_opt = build_optimizer(writer, config.train, fused=written_fused)
    assert writer_opt.defaults["fused"] is (True if written_fused else None)
    step(writer, writer_opt)
    tensors, groups = sharded_state(writer, writer_opt)
    path = save_checkpoint(tmp_path, _state(1, groups), tensors, keep=1)

    torch.manual_seed(1)
    reader = build_model(config.model)
    reader_opt = build_optimizer(reader, config.train, fused=read_fused)
    loaded, _ = sharded_state(reader, reader_opt)
    load_tensors(path, loaded)
    load_sharded_state(reader, reader_opt, loaded, load_checkpoint(path)["optimizer_groups"])
    step(writer, writer_opt)
    step(reader, reader_opt)
    for (name, a), b in zip(writer.named_parameters(), reader.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), name
    assert {float(s["step"]) for s in reader_opt.state.values()} == {2.0}  # the written step, then its own
