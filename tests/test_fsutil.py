"""``diffsweep.fsutil``'s renames: ``publish``, the way a staged folder (a dataset, a checkpoint, a
fit's outputs, a probe's copy) is put in place, in each case it meets; ``put_folder`` and
``publish_once``, which never replace what is there; ``written_atomically``'s files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diffsweep.fsutil import publish, publish_once, put_folder, written_atomically


def staged(parent: Path, text: str) -> Path:
    folder = parent / ".staged"
    folder.mkdir()
    (folder / "a.txt").write_text(text)
    (folder / "sub").mkdir()
    (folder / "sub" / "b.txt").write_text(text)
    return folder


def contents(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_target_is_the_staged_folder_renamed(tmp_path):
    publish(staged(tmp_path, "new"), tmp_path / "out")
    assert contents(tmp_path / "out") == {"a.txt": "new", "sub/b.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_earlier_folder_is_replaced_whole_and_removed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")  # a file the new folder does not have: gone with the old one
    publish(staged(tmp_path, "new"), out)
    assert contents(out) == {"a.txt": "new", "sub/b.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left aside


def test_an_empty_folder_is_kept_with_its_permissions_and_filled_when_asked(tmp_path):
    """``fill_empty`` (a fit's --out folder the user made); otherwise an empty folder is swapped
    like any other (a checkpoint: a half-filled step folder must never be seen)."""
    out = tmp_path / "out"
    out.mkdir(mode=0o750)
    os.chmod(out, 0o750)
    inode = out.stat().st_ino
    publish(staged(tmp_path, "new"), out, fill_empty=True)
    assert out.stat().st_ino == inode and out.stat().st_mode & 0o777 == 0o750
    assert contents(out) == {"a.txt": "new", "sub/b.txt": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

    swapped = tmp_path / "swapped"
    swapped.mkdir()
    inode = swapped.stat().st_ino
    (tmp_path / ".staged").mkdir()
    (tmp_path / ".staged" / "c.txt").write_text("c")
    publish(tmp_path / ".staged", swapped)
    assert swapped.stat().st_ino != inode and contents(swapped) == {"c.txt": "c"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "swapped"]


def test_a_link_is_replaced_and_its_target_left_alone(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("theirs")
    out = tmp_path / "out"
    out.symlink_to(elsewhere)
    publish(staged(tmp_path, "new"), out)
    assert not out.is_symlink() and contents(out) == {"a.txt": "new", "sub/b.txt": "new"}
    assert contents(elsewhere) == {"keep.txt": "theirs"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "out"]


def test_a_temporary_file_of_an_atomic_write_is_known_by_its_name(tmp_path):
    from diffsweep.fsutil import is_temporary, temporary_name, write_atomically

    write_atomically(tmp_path / "ledger.json", "{}\n", sync=True)
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]  # the temporary file was renamed
    assert is_temporary(temporary_name("ledger.json"), "ledger.json")
    assert not any(is_temporary(n, "ledger.json") for n in (".ledger.json.tmp", ".ledger.json.x1.tmp",
                                                            "ledger.json", ".other.json.12.tmp", ".ledger.json.12"))


def test_put_folder_fills_a_missing_or_empty_target_and_never_replaces_content(tmp_path):
    put_folder(staged(tmp_path, "one"), tmp_path / "out")
    assert (tmp_path / "out" / "a.txt").read_text() == "one"
    (tmp_path / "empty").mkdir()
    put_folder(staged(tmp_path, "two"), tmp_path / "empty")
    assert (tmp_path / "empty" / "sub" / "b.txt").read_text() == "two"
    third = staged(tmp_path, "three")
    with pytest.raises(OSError):
        put_folder(third, tmp_path / "out")
    assert (tmp_path / "out" / "a.txt").read_text() == "one" and third.is_dir()


def test_publish_once_keeps_the_first_writers_folder_and_removes_the_second(tmp_path):
    assert publish_once(staged(tmp_path, "first"), tmp_path / "snap")
    second = staged(tmp_path, "second")
    assert not publish_once(second, tmp_path / "snap")
    assert (tmp_path / "snap" / "a.txt").read_text() == "first" and not second.exists()


def test_written_atomically_renames_every_file_at_the_end_or_none(tmp_path):
    paths = [tmp_path / "train.bin", tmp_path / "val.bin"]
    paths[0].write_bytes(b"old")
    with written_atomically(paths) as files:
        files[0].write(b"new train")
        files[1].write(b"new val")
        assert paths[0].read_bytes() == b"old" and not paths[1].exists()  # nothing renamed before the end
    assert [p.read_bytes() for p in paths] == [b"new train", b"new val"]
    with pytest.raises(KeyboardInterrupt), written_atomically(paths) as files:
        files[0].write(b"half")
        raise KeyboardInterrupt
    assert [p.read_bytes() for p in paths] == [b"new train", b"new val"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.bin", "val.bin"]  # no temporary file left

