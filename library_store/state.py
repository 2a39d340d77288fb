"""Evolvers' resume state: one folder per method under ``<library>/state/<method>/``.

An evolver that saves its progress (after every phase or step, to resume) keeps
it here, outside every version: the files are its own, keyed by a hash of what the fit was
started with, so an interrupted evolve started again resumes where it stopped. Each file is
JSON, written atomically (a temp file in the method's folder, then one ``os.replace``), so a
process killed mid-save leaves the old file or the new one. A damaged file reads as missing:
the fit starts over rather than fails.

Libraries made before this layout kept such state elsewhere (``work/<method>``,
``.state/<method>``); the method names those folders and they are moved here on first use.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engine.errors import ConfigError
from .fsutil import atomic_write, make_dirs
from .paths import STATE_DIR

log = logging.getLogger("whetstone.library")

_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_TMP = ".tmp"  # temp files of saves in flight, inside the method's own folder


def _check_name(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise ConfigError(f"bad state {kind} {value!r}: lower-case letters, digits, '_', '-' "
                          "and '.', at most 64 characters",
                          hint="use the method's registered name and a hash as the key")
    return value


class MethodState:
    """The resume state of one method: JSON documents by key in ``<library>/state/<method>/``.

    ``folder`` may also hold the method's own files (e.g. images its tools made)."""

    def __init__(self, folder: Path, *, durable: bool = True) -> None:
        self.folder = folder
        self.durable = durable

    def path(self, key: str) -> Path:
        """Where the document ``key`` lives (whether or not it exists)."""
        return self.folder / f"{_check_name('key', key)}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        """The document ``key``; None when absent or damaged (a torn or foreign file)."""
        path = self.path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            log.warning("ignoring damaged resume state %s: %s", path, exc)
            return None
        return data if isinstance(data, dict) else None

    def save(self, key: str, data: Mapping[str, Any]) -> Path:
        """Write the document ``key`` atomically; returns its path."""
        path = self.path(key)
        make_dirs(self.folder, durable=self.durable)
        body = json.dumps(data, ensure_ascii=False).encode("utf-8")
        atomic_write(path, body, tmp_dir=self.folder / _TMP, durable=self.durable)
        return path

    def remove(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def stored_keys(self) -> list[str]:
        """The keys of the documents saved, sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(p.stem for p in self.folder.glob("*.json") if p.is_file())


def method_state(root: Path, method: str, *, legacy: Sequence[str] = (),
                 durable: bool = True) -> MethodState:
    """``<root>/state/<method>/``, after moving the ``legacy`` folders (paths relative to the
    library root, where older versions kept this method's state) into it."""
    folder = root / STATE_DIR / _check_name("method", method)
    for rel in legacy:
        old = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts or old == root:
            raise ConfigError(f"legacy state folder {rel!r} is not a folder inside the library",
                              hint="name it relative to the library root, e.g. work/<method>")
        if old.is_dir() and not old.is_symlink():
            _move(old, folder, durable=durable)
    return MethodState(folder, durable=durable)


def _move(old: Path, new: Path, *, durable: bool) -> None:
    """Move a legacy folder's entries into ``new``: the whole folder in one rename when
    ``new`` does not exist yet, else entry by entry, never over a newer file of the same name.
    Lock-free: two processes racing both end with everything in ``new`` (the loser's rename
    finds the source gone)."""
    make_dirs(new.parent, durable=durable)
    try:
        os.rename(old, new)
        log.info("moved resume state %s to %s", old, new)
        return
    except FileNotFoundError:
        return  # another process moved it first
    except OSError:
        pass  # ``new`` exists (and is not empty): merge below
    for entry in sorted(old.iterdir()):
        target = new / entry.name
        if target.exists():
            continue  # the state saved in the new place is the newer one
        try:
            os.rename(entry, target)
        except FileNotFoundError:
            continue
    # an entry whose name the new folder already had stays, for a person to see
    with contextlib.suppress(OSError):
        old.rmdir()
    log.info("moved resume state %s to %s", old, new)
