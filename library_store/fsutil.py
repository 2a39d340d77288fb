"""Small file-system helpers for crash-safe writes: write aside, fsync, then one rename.

A process killed at any point leaves either the old file or the new one at the target path,
never a torn mix; what it leaves behind is a temp file in ``tmp_dir``, which the next writer
removes (see ``clean_dir``).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
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


# -- reading what a user names, without following links -------------------------------------

# Folders of kernel files: they stat as regular files, yet read the running process's
# environment (/proc/self/environ) or the machine's state. Never a source of documents.
_PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotRegular(Exception):
    """A path that ``read_regular`` will not read: ``kind`` says what it is."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@functools.cache
def _pseudo_devices() -> frozenset[int]:
    out = set()
    for root in _PSEUDO_ROOTS:
        try:
            out.add(os.stat(root).st_dev)
        except OSError:
            continue
    return frozenset(out)


def is_kernel_file(st: os.stat_result) -> bool:
    """Whether ``st`` (a stat) is of /proc, /sys or /dev: such files look regular, yet are
    the kernel's (the running process's environment, devices)."""
    return st.st_dev in _pseudo_devices()


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words, for a refusal."""
    if stat.S_ISLNK(mode):
        return "a symbolic link (links are not followed)"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a special file"


def linked_part(path: Path) -> Path | None:
    """The first part of ``path``, as written, that is a symbolic link (None: no part is).
    ``evil/up/secret.txt`` through a linked ``evil/up`` reads a file outside the folder the
    user named, though its last part is a plain file; ``O_NOFOLLOW`` guards only that last
    part. A part that does not exist ends the walk (the read reports it)."""
    here = Path(path.anchor)
    for part in path.parts[1:] if path.anchor else path.parts:
        here = here / part
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return here
        except OSError:
            return None
    return None


def read_regular(name: str | Path, limit: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``name`` (relative to ``dir_fd`` when given), at most
    ``limit + 1`` of them, so a caller sees it is over ``limit``.

    Opened with ``O_NOFOLLOW`` and checked by ``fstat`` on the descriptor it then reads, so a
    file swapped for a link, a FIFO or a device after any earlier check is refused, not read
    (``O_NONBLOCK``: opening a FIFO cannot hang). Files of /proc, /sys and /dev are refused.
    Raises ``NotRegular`` for such a path, ``OSError`` when it cannot be read.
    """
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link in the last part
            raise NotRegular(kind_of(stat.S_IFLNK)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(kind_of(st.st_mode))
        if is_kernel_file(st):
            raise NotRegular("a kernel file (/proc, /sys or /dev)")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def walk_entries(root: Path, skip: Callable[[str], bool] = lambda name: False
                 ) -> Iterator[tuple[str, str, int, os.stat_result]]:
    """``(relative path, name, dir_fd, lstat)`` for every entry under the folder ``root``,
    folders included, never descending through a link (``os.fwalk``: each folder is opened
    by descriptor, so one swapped for a link mid-walk is not entered). Names for which
    ``skip`` is true are neither listed nor entered. Read a file with
    ``read_regular(name, limit, dir_fd=dir_fd)`` while the walk is on its folder."""
    for top, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        dirs[:] = sorted(d for d in dirs if not skip(d))
        files = [f for f in files if not skip(f)]
        rel_top = os.path.relpath(top, root)
        prefix = "" if rel_top == "." else rel_top.replace(os.sep, "/") + "/"
        for name in sorted([*dirs, *files]):
            try:
                st = os.lstat(name, dir_fd=dir_fd)
            except OSError:
                continue  # gone since the folder was listed
            yield prefix + name, name, dir_fd, st


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
