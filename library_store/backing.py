"""Where a library's shared state lives: its folder (the embedded default) or PostgreSQL.

``Library`` (store.py) keeps the rules: ids, trees, validation, the view, candidates' checks.
A backing keeps the state those rules write, behind one contract (``Backing``):

    blobs                  content-addressed file contents and tree objects
    current / manifest     the current version's id, and each version's manifest
    transaction / publish  a writers' critical section, and the one step that makes a version
                           current (a manifest written and the pointer switched, atomically)
    settings               ``library.json``'s keys (the trace caps)
    candidates             the gate's kept changes, as records by name
    trace_store            the traces, their index, feedback and caps

``FileBacking`` is the folder as it always was (``versions/``, ``blobs/``, ``CURRENT``,
``candidates/``, ``library.json``, ``traces/``). ``pg_library.PgBacking`` keeps the same
things in tables, so replicas on several machines share a library with no shared folder.
The view (``skills/`` and the method folders), ``state/``, ``work/`` and ``.tmp`` stay in
the local folder either way: they belong to one machine.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from ..engine.errors import LibraryError
from .blobs import BlobStore
from .fsutil import FileMemo, atomic_write, make_dirs
from .manifest import Manifest
from .traces import TraceStore, trace_store


class Backing(Protocol):
    """What a library's shared state is kept in (the module's docstring)."""

    kind: str  # "file" | "postgresql"

    @property
    def blobs(self) -> BlobStore:
        """The content-addressed blobs (file contents and tree objects)."""

    @property
    def where(self) -> str:
        """The store as messages name it (a folder, or a URL without its password)."""

    def initialized(self) -> bool: ...

    def local_folders(self) -> tuple[str, ...]:
        """Folders ``Library.init`` makes under the library's root for this backing."""

    def current(self) -> str | None:
        """The current version's id; None when there is no library yet."""

    def manifest(self, vid: str) -> bytes:
        """A version's manifest (JSON); ``FileNotFoundError`` when there is none."""

    def transaction(self, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        """The writers' critical section across processes and machines; what is written in
        it lands together (PostgreSQL) or in the order the rules need (files)."""

    def publish(self, m: Manifest) -> None: ...

    def unpublish(self, m: Manifest, parent: Manifest) -> None: ...

    def landed(self, m: Manifest) -> bool:
        """Whether ``m`` is stored as written (a commit whose answer was lost)."""

    def settings(self) -> dict[str, Any]: ...

    def write_settings(self, data: Mapping[str, Any]) -> None: ...

    def save_candidate(self, name: str, record: bytes, created: float) -> None: ...

    def candidate(self, name: str) -> bytes:
        """A candidate's record; ``FileNotFoundError`` when there is none."""

    def candidates(self) -> list[bytes]: ...

    def drop_candidate(self, name: str) -> None: ...

    def trace_store(self, settings: Mapping[str, Any]) -> TraceStore: ...

    def ready(self) -> str | None:
        """None when the store answers now, else why not (for ``/readyz``)."""


class FileBacking:
    """A library's state in its own folder (the default; see store.py for the layout)."""

    kind = "file"

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable
        self.tmp = root / ".tmp"
        self.blobs = BlobStore(root / "blobs", self.tmp, durable=durable)
        self._current = FileMemo(root / "CURRENT", str.strip)  # asked on every request
        self._settings = FileMemo(root / "library.json", self._parse_settings)

    @property
    def where(self) -> str:
        return str(self.root)

    def initialized(self) -> bool:
        return (self.root / "CURRENT").exists()

    def local_folders(self) -> tuple[str, ...]:
        return ("versions", "blobs", "candidates", "traces")

    def current(self) -> str | None:
        """``CURRENT``, read again whenever the file changed (every write replaces it: a new
        inode and new times)."""
        try:
            return self._current.get()
        except FileNotFoundError:
            return None

    def manifest(self, vid: str) -> bytes:
        return (self.root / "versions" / f"{vid}.json").read_bytes()

    def transaction(self, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the library's file lock is the critical section

    def publish(self, m: Manifest) -> None:
        """Write the manifest, then switch ``CURRENT`` to it: the one atomic step of a commit.
        With ``durable`` each write also fsyncs its folder: the manifest's entry in versions/
        is on disk before CURRENT names it, and CURRENT's own rename before we return."""
        atomic_write(self.root / "versions" / f"{m.id}.json", m.to_json(), tmp_dir=self.tmp,
                     durable=self.durable)
        atomic_write(self.root / "CURRENT", (m.id + "\n").encode(), tmp_dir=self.tmp,
                     durable=self.durable)

    def unpublish(self, m: Manifest, parent: Manifest) -> None:
        atomic_write(self.root / "CURRENT", (parent.id + "\n").encode(), tmp_dir=self.tmp,
                     durable=self.durable)
        (self.root / "versions" / f"{m.id}.json").unlink(missing_ok=True)  # unreachable now

    def landed(self, m: Manifest) -> bool:
        return self.current() == m.id

    def settings(self) -> dict[str, Any]:
        try:
            return dict(self._settings.get())  # a copy: callers may change it
        except FileNotFoundError:
            return {}

    def _parse_settings(self, text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LibraryError(f"{self.root / 'library.json'} is not valid JSON: {exc}",
                               hint="fix or delete the file") from exc
        return data if isinstance(data, dict) else {}

    def write_settings(self, data: Mapping[str, Any]) -> None:
        atomic_write(self.root / "library.json", json.dumps(dict(data), indent=1).encode(),
                     tmp_dir=self.tmp, durable=self.durable)

    def _candidate_path(self, name: str) -> Path:
        return self.root / "candidates" / f"{name}.json"

    def save_candidate(self, name: str, record: bytes, created: float) -> None:
        make_dirs(self.root / "candidates", durable=self.durable)
        atomic_write(self._candidate_path(name), record, tmp_dir=self.tmp,
                     durable=self.durable)

    def candidate(self, name: str) -> bytes:
        return self._candidate_path(name).read_bytes()

    def candidates(self) -> list[bytes]:
        folder = self.root / "candidates"
        out = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            with contextlib.suppress(OSError):
                out.append(path.read_bytes())
        return out

    def drop_candidate(self, name: str) -> None:
        self._candidate_path(name).unlink(missing_ok=True)

    def trace_store(self, settings: Mapping[str, Any]) -> TraceStore:
        return trace_store(self.root / "traces", settings)

    def ready(self) -> str | None:
        return None


def open_backing(store: str | None, root: Path, *, durable: bool = True) -> Backing:
    """The folder's own backing for ``store`` None, else PostgreSQL's (``pg_library.py``;
    psycopg is imported only then)."""
    if store is None:
        return FileBacking(root, durable=durable)
    # lazy: psycopg, the scale extra, only for a postgresql:// store
    from .pg_library import PgBacking

    return PgBacking(store, root)
