"""Which file system holds a store: an SQLite store on a network file system (NFS, Lustre, GPFS,
...) is unsafe for jobs on many nodes, since SQLite's locking relies on the file system's, which
these do not provide reliably; ``launch`` warns and ``diffsweep server`` is the fix."""

from __future__ import annotations

import re
from pathlib import Path

MOUNTS = Path("/proc/mounts")  # this machine's mounted file systems: device, mount point, type, ...
# File systems that several machines share over a network, by their /proc/mounts type. SQLite's
# locking is unreliable on them (https://www.sqlite.org/faq.html#q5, "useLegacyLocking" on NFS),
# and a sweep's jobs on many nodes write the store at once.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph-fuse", "glusterfs",
    "fuse.glusterfs", "fuse.sshfs", "afs", "panfs", "wekafs", "fuse.juicefs", "orangefs", "pvfs2", "quobyte",
})


def filesystem_of(path: str, mounts: str) -> str:
    """The type of the file system holding the absolute ``path`` (symlinks already resolved),
    read from ``mounts``, the text of /proc/mounts: the mount with the longest mount point that
    contains it (the last listed at equal length, as it hides the others). "" if none does.

    Pure: the caller reads the mounts and resolves the path."""
    best, kind = -1, ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1]).rstrip("/") or "/"
        inside = point == "/" or path == point or path.startswith(point + "/")
        if inside and len(point) >= best:
            best, kind = len(point), _unescape(fields[2])
    return kind


def _unescape(field: str) -> str:
    """/proc/mounts writes a space, tab, newline and backslash in a name as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def network_filesystem(path: str, mounts: str) -> str | None:
    """The network file system type (``NETWORK_FILESYSTEMS``) holding ``path``, else None (pure;
    see ``filesystem_of``)."""
    kind = filesystem_of(path, mounts)
    return kind if kind in NETWORK_FILESYSTEMS else None


def network_store_warning(uri: str, mounts: str) -> str | None:
    """The one-line warning for a launch whose jobs, on many nodes, would write the SQLite store
    of ``uri`` (its path absolute, symlinks resolved) on a network file system; None when the
    store is a server, another database, or on a local disk. Pure."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    kind = network_filesystem(path, mounts) if path.startswith("/") else None
    if kind is None:
        return None
    return (f"warning: the MLflow store {path} is on a network file system ({kind}), where SQLite's locking is "
            "unreliable and the sweep's jobs on many nodes write at once (lost metrics, a corrupt store); serve it "
            "instead: run `diffsweep server` on the login node and `export MLFLOW_TRACKING_URI=http://HOST:PORT` "
            "as it prints before launching")


def shared_store_warning(uri: str) -> str | None:
    """``network_store_warning`` for ``uri`` on this machine (its /proc/mounts; None without one)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = Path(uri.removeprefix("sqlite:///").split("?", 1)[0]).resolve()  # the real place, not a symlink's
    mounts = _mounts()
    return network_store_warning(f"sqlite:///{path}", mounts) if mounts is not None else None


def network_filesystem_here(path: Path) -> str | None:
    """``network_filesystem`` of ``path`` (symlinks resolved) on this machine; None without /proc/mounts."""
    mounts = _mounts()
    return network_filesystem(str(path.resolve()), mounts) if mounts is not None else None


def _mounts() -> str | None:
    try:
        return MOUNTS.read_text()
    except OSError:
        return None  # not Linux: nothing to tell from
