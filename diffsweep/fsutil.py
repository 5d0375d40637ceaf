"""File-system helpers for commands that must leave the file system as they found it when they fail."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def parents_made_for(path: Path) -> Iterator[None]:
    """Create the missing parent folders of ``path`` for the block; if the block raises (Ctrl-C
    included), remove the folders made here again, deepest first and only while they are empty.

    Raises ``OSError`` when a parent cannot be created (having removed what it made).
    """
    missing = [p for p in reversed(path.absolute().parents) if not p.exists()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield
    except BaseException:
        for folder in reversed(missing):
            try:
                folder.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # something else was put there meanwhile: keep it, and so its parents
                break
        raise
