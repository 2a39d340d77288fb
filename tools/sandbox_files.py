"""The call's folder: what is placed in it before the program runs, how much it holds while it
runs, and what comes back from it after. Nothing in it is trusted: names placed are checked,
links are never followed, and only regular files are read back."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ..engine.errors import ToolError

SCRIPT = "main.py"
MAX_DISK_ENTRIES = 10_000
MAX_COLLECT_BYTES = 32 * 1024 * 1024  # what may come back from the call's ``out/`` folder


def place_files(root: Path, files: Mapping[str, str | bytes]) -> None:
    """Write ``files`` (relative name -> content) under ``root``; a name that is empty,
    absolute, climbs with ``..`` or lands on the program itself is refused before anything of
    the call is written."""
    checked: list[tuple[Path, str | bytes]] = []
    for name, content in files.items():
        parts = Path(name).parts if name else ()
        if not parts or name in (".", SCRIPT) or "\x00" in name:
            raise ToolError(f"file name {name!r} is empty or reserved",
                            hint="name files relative to the program's folder, e.g. data/x.txt")
        target = (root / name).resolve()
        if Path(name).is_absolute() or ".." in parts or not target.is_relative_to(root.resolve()):
            raise ToolError(f"file name {name!r} is outside its folder",
                            hint="name files relative to the program's folder, without '..'")
        checked.append((target, content))
    for target, content in checked:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise ToolError(f"cannot place {target.relative_to(root.resolve())}: "
                            f"{exc.strerror or exc}", hint="use short, plain file names") from exc


def disk_use(root: Path) -> tuple[int, int]:
    """(bytes, entries) under ``root``, links not followed; stops counting past the cap."""
    total, entries = 0, 0
    todo = [root]
    while todo and entries <= MAX_DISK_ENTRIES:
        with contextlib.suppress(OSError), os.scandir(todo.pop()) as it:
            for entry in it:
                entries += 1
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(Path(entry.path))
    return total, entries


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
# Non-blocking: opening a FIFO waits for a writer, which a finished call never brings; no
# controlling terminal; no link followed. Only a regular file is then read.
_COLLECT_FLAGS = (os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                  | getattr(os, "O_CLOEXEC", 0))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _read_regular(path: Path, budget: int) -> bytes | str:
    """The bytes of ``path`` (at most ``budget + 1``), or why it is not read: what it is
    instead of a regular file. The check is on the opened descriptor, so a file swapped for a
    FIFO or a link after the walk saw it is not read either."""
    try:
        fd = os.open(path, _COLLECT_FLAGS)
    except OSError as exc:  # ELOOP: a link; ENXIO: a socket; or gone
        with contextlib.suppress(OSError):
            return _kind(os.lstat(path).st_mode)
        return f"unreadable ({exc.strerror or exc})"
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return _kind(mode)
        return fh.read(budget + 1)


def collect_outputs(folder: Path) -> tuple[dict[str, bytes], list[str]]:
    """Regular files under ``folder`` (relative name -> bytes), bounded, and what was left
    out ("out/x (a FIFO)"). Links (to files or folders), FIFOs, sockets and devices are never
    opened for reading: a call can neither make the caller read a host file for it nor block
    it on a pipe that no one writes."""
    out: dict[str, bytes] = {}
    skipped: list[str] = []
    if folder.is_symlink() or not folder.is_dir():
        return out, skipped
    budget = MAX_COLLECT_BYTES
    for here, dirs, names in os.walk(folder):  # does not descend into linked folders
        dirs.sort()
        for name in sorted(names):
            path = Path(here) / name
            rel = path.relative_to(folder)
            data = _read_regular(path, budget)
            if isinstance(data, str):
                skipped.append(f"{folder.name}/{rel} ({data})")
                continue
            if len(data) > budget:
                skipped.append(f"{folder.name}/{rel} (over {MAX_COLLECT_BYTES} bytes in all)")
                return out, skipped
            budget -= len(data)
            out[str(rel)] = data
    return out, skipped


