"""Checks of a ledger file before it is used: :func:`check_ledger_file` (an existing, readable
specwatch ledger, opened read-only: what ``specwatch report`` reads), :func:`check_openable`
(SQLite can open or create it: the start-up check of ``specwatch run``) and
:func:`filesystem_risk` (the ledger's directory on a network, memory or container-layer
filesystem, read from ``/proc/self/mountinfo``: ``specwatch run`` warns at start, ``specwatch
doctor --config`` too)."""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Literal

from specwatch.shadow.ledger.rows import ledger_columns


class LedgerFileError(Exception):
    """A file that is not a readable specwatch ledger; the message is one line naming the file."""


#: Columns every specwatch ledger has had since its first schema: a ``pairs`` table without them
#: is some other program's table (newer columns are added on open, see
#: :func:`~specwatch.shadow.ledger.rows.add_missing_columns`).
_CORE_COLUMNS: tuple[str, ...] = ("time", "category", "status")


def check_ledger_file(path: Path) -> None:
    """Fail unless ``path`` is an SQLite file holding a specwatch ``pairs`` table (one with the
    ledger's core columns ``time``, ``category``, ``status``), opened read-only, blocking: call
    from a thread. Raises :class:`LedgerFileError` with one line naming ``path``: a directory,
    no such file, not a readable SQLite database, or not a specwatch ledger (no ``pairs``
    table, or one without the core columns, which it names)."""
    if path.is_dir():
        raise LedgerFileError(f"ledger {path}: is a directory, not a ledger file")
    if not path.exists():
        raise LedgerFileError(f"ledger {path}: no such file")
    if not path.is_file():  # a device (/dev/null), a pipe or a socket
        raise LedgerFileError(f"ledger {path}: not a regular file, not a ledger file")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'pairs'"
            ).fetchone()
            have = {str(r[1]) for r in conn.execute("PRAGMA table_info(pairs)")}
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise LedgerFileError(f"ledger {path}: not a readable SQLite database ({exc})") from None
    if found is None:
        raise LedgerFileError(f"ledger {path}: no 'pairs' table (not a specwatch ledger)")
    missing = [c for c in _CORE_COLUMNS if c not in have]
    if missing:
        raise LedgerFileError(
            f"ledger {path}: its 'pairs' table has no {', '.join(missing)} column "
            "(not a specwatch ledger)"
        )
    missing = [c for c in ledger_columns() if c not in have]
    if missing:
        raise LedgerFileError(
            f"ledger {path}: its 'pairs' table has no {', '.join(missing)} column (an older "
            "or altered ledger; it is read as it is, read-only: a `specwatch run` with this "
            "ledger adds the columns it lacks)"
        )


def path_problem(path: Path | str) -> str | None:
    """Why a ledger file cannot be created or written at ``path``, in words (its parent
    directory missing, not a directory or not writable; the file itself not writable), or
    ``None`` when none of those is the case. Blocking; for an error message."""
    file = Path(path)
    parent = file.parent
    if not parent.exists():
        return f"parent directory {str(parent)!r} does not exist"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if file.exists():
        return None if os.access(file, os.R_OK | os.W_OK) else f"{str(file)!r} is not writable"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"parent directory {str(parent)!r} is not writable"
    return None


def check_openable(path: Path | str) -> None:
    """Open (or create) ``path`` as SQLite and read its schema version (blocking, start-up only).

    Raises ``sqlite3.Error`` when the file cannot be opened or is not a database. A file this
    check created is removed again: left empty, the ledger would take it for a damaged one and
    move it aside."""
    created = not Path(path).exists()
    conn = sqlite3.connect(path, timeout=5.0)
    try:
        conn.execute("PRAGMA schema_version").fetchone()
    finally:
        conn.close()
        if created:
            Path(path).unlink(missing_ok=True)


#: Filesystem types (``mountinfo``'s type field) that are served over the network.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "afs",
        "9p",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.blobfuse",
        "fuse.blobfuse2",
        "fuse.goofys",
        "fuse.rclone",
        "fuse.juicefs",
        "fuse.glusterfs",
        "fuse.cephfs",
    }
)
#: Filesystem types held in memory.
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
#: The container runtime's layered root filesystem.
LAYER_FILESYSTEMS = frozenset({"overlay", "aufs"})

_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def filesystem_of(path: str, mountinfo: str) -> tuple[str, str, str] | None:
    """``(filesystem type, mount point, source)`` of the mount holding ``path`` (absolute,
    symlinks resolved by the caller) in ``mountinfo`` text (proc(5)): the mount whose mount
    point is the longest prefix of ``path``, the last one listed when several share it (a later
    mount hides an earlier one). ``None`` when no line parses."""
    best: tuple[str, str, str] | None = None
    best_len = -1
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 3:
            continue
        point = _unescape(fields[4])
        fstype, source = fields[sep + 1], _unescape(fields[sep + 2])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best_len:
            best, best_len = (fstype, point, source), len(point)
    return best


#: Where the kernel lists this process's mounts.
MOUNTINFO = Path("/proc/self/mountinfo")

FilesystemRisk = Literal["network", "memory", "layer"]


def filesystem_risk(
    ledger: Path | str, mountinfo: Path = MOUNTINFO
) -> tuple[FilesystemRisk, str, str, str] | None:
    """``(risk, filesystem type, mount point, source)`` when the directory of ``ledger`` is on a
    network, memory or container-layer filesystem by ``mountinfo``; ``None`` when it is on
    another one or nothing can be told (no such table: not Linux). Blocking (reads a file)."""
    try:
        text = mountinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = filesystem_of(str(Path(ledger).parent.resolve()), text)
    if found is None:
        return None
    fstype, point, source = found
    risk: FilesystemRisk | None = (
        "network"
        if fstype in NETWORK_FILESYSTEMS
        else "memory"
        if fstype in MEMORY_FILESYSTEMS
        else "layer"
        if fstype in LAYER_FILESYSTEMS
        else None
    )
    return None if risk is None else (risk, fstype, point, source)
