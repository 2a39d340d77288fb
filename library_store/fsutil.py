"""Small file-system helpers for crash-safe writes: write aside, fsync, then one rename.

A process killed at any point leaves either the old file or the new one at the target path,
never a torn mix; what it leaves behind is a temp file in ``tmp_dir``, which the next writer
removes (see ``clean_dir``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

_T = TypeVar("_T")


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``: the content address of a file in the library."""
    return hashlib.sha256(data).hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(target: Path, data: bytes, *, tmp_dir: Path, durable: bool = True) -> None:
    """Write ``data`` to ``target`` through a temp file in ``tmp_dir`` and one ``os.replace``.

    ``tmp_dir`` must be on the same file system as ``target`` (it is inside the library).
    With ``durable`` the data is fsynced before the rename, so a power cut cannot leave an
    empty file behind a completed rename, and ``target``'s folder is fsynced after it, so the
    rename itself is on disk before anything (``CURRENT``) can point at the file.
    """
    tmp_dir.mkdir(parents=True, exist_ok=True)
    # Only a prefix of the name: the temp name must fit wherever the target's name fits.
    tmp = tmp_dir / f"{target.name[:32]}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(target.parent)


def make_dirs(path: Path, *, durable: bool = True) -> None:
    """``mkdir -p path``; with ``durable`` each folder it creates is fsynced into its parent,
    so files renamed into it later cannot vanish with the folder after a power cut."""
    if path.is_dir():
        return
    if not path.parent.is_dir():
        make_dirs(path.parent, durable=durable)
    try:
        path.mkdir()
    except FileExistsError:
        return  # another writer made it; its own sync covers the entry
    if durable:
        fsync_dir(path.parent)


def clean_dir(path: Path) -> int:
    """Remove everything inside ``path`` (stale temp files of a killed writer); returns a count.

    Call it only while holding the writers' lock, so no live writer's temp file is removed.
    """
    if not path.exists():
        return 0
    n = 0
    for entry in path.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        n += 1
    return n


def remove_empty_parents(path: Path, stop: Path) -> None:
    """Remove ``path``'s parent folders while they are empty, up to (not including) ``stop``."""
    parent = path.parent
    while parent != stop and stop in parent.parents:
        try:
            parent.rmdir()
        except OSError:
            return
        parent = parent.parent


class FileMemo(Generic[_T]):
    """One small file's parsed content, read again only when its stat signature (inode, times,
    size) changes. Files written with ``atomic_write`` are replaced, so every write changes the
    signature; a stat costs a fraction of an open, a read and a parse, which matters for files
    a server consults on every request (the library's ``CURRENT``, the index state).
    ``get`` raises ``FileNotFoundError`` like ``open``."""

    def __init__(self, path: Path | str, parse: Callable[[str], _T]) -> None:
        self.path = str(path)
        self.parse = parse
        self._seen: tuple[tuple[int, int, int, int], _T] | None = None
        self._lock = threading.Lock()

    def get(self) -> _T:
        st = os.stat(self.path)
        sig = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        seen = self._seen
        if seen is not None and seen[0] == sig:
            return seen[1]
        with open(self.path, encoding="utf-8") as f:
            value = self.parse(f.read())
        with self._lock:  # stat before read: a file replaced in between is read again next time
            self._seen = (sig, value)
        return value
