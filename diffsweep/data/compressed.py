"""Reading a file's lines as a stream, decompressed by its suffix (``.gz``, ``.zst``; anything else
as it is), for ``data prepare``'s JSONL inputs.

A corrupt compressed file is a ``ConfigError`` naming the file; so is one cut short (a ``.gz``, or a
``.zst`` ending inside any of its frames: "truncated"), never a shorter corpus; so is an empty one.
``.zst`` needs the ``zstandard`` package (the ``corpora`` extra).
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Generator
from pathlib import Path
from typing import Any

from diffsweep.config import ConfigError
from diffsweep.data.errors import one_line, optional_module

COMPRESSED_SUFFIXES = (".gz", ".zst")


def read_lines(path: Path) -> Generator[bytes, None, None]:
    """The lines of ``path`` (decompressed when it is ``.gz`` or ``.zst``), read lazily; errors are
    ``ConfigError``\\ s keyed by the path."""
    name = str(path)
    errors: tuple[type[BaseException], ...] = (OSError, zlib.error)
    if name.endswith(".zst"):
        errors += (optional_module("zstandard", "a .zst file").ZstdError,)
    if name.endswith(COMPRESSED_SUFFIXES) and path.stat().st_size == 0:
        raise ConfigError(name, "empty file (0 bytes): no compressed data in it")
    try:
        with _open(path) as f:
            yield from f
    except EOFError as exc:  # gzip's and ZstdFrames' "ends inside the compressed data"
        raise ConfigError(name, f"truncated: the compressed data ends before its end marker ({one_line(exc)}); "
                          "the file is cut short or still being written") from exc
    except errors as exc:
        raise ConfigError(name, f"cannot read it ({one_line(exc)})") from exc


def _open(path: Path) -> io.BufferedIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        return io.BufferedReader(ZstdFrames(path, optional_module("zstandard", "a .zst file")))
    return open(path, "rb")


class ZstdFrames(io.RawIOBase):
    """A ``.zst`` file decompressed: all its frames in order (as ``zstd -d`` reads concatenated
    frames), and ``EOFError`` when the file ends inside a frame. ``zstandard``'s own stream reader
    ends quietly there, which would make a cut-short file a shorter corpus."""

    def __init__(self, path: Path, zstd: Any) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close())
        self._zstd = zstd.ZstdDecompressor()
        self._frame: Any = None  # the decompressor of the frame being read (None: between frames)
        self._input = b""  # compressed bytes read, not yet given to a frame
        self._output = b""  # decompressed bytes not yet returned

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._output:
            if not self._input:
                self._input = self._file.read(1 << 16)
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("the file ends inside a zstd frame")
                    return 0
            if self._frame is None:
                self._frame = self._zstd.decompressobj()
            self._output = self._frame.decompress(self._input)
            self._input = b""
            if self._frame.eof:
                self._input, self._frame = self._frame.unused_data, None
        n = min(len(buffer), len(self._output))
        buffer[:n] = self._output[:n]
        self._output = self._output[n:]
        return n

    def close(self) -> None:
        self._file.close()
        super().close()
