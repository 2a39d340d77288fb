"""One chromadb client per folder per process, shared by every thread and every holder.

chromadb keeps one ``System`` per persist path in a class-level cache and creates it without a
lock, so threads opening the same path at once race: ``Could not connect to tenant
default_tenant``, ``'RustBindingsAPI' object has no attribute 'bindings'``, ``KeyError`` on the
path (8 threads opening a 4-skill index failed 32 of 40 queries in 5 fresh homes). And
closing one client stops the System every other client of that path reads through.

So every holder of a chromadb folder (the skills index, a pinned index, an evidence corpus)
takes the folder's ``SharedChroma`` from ``acquire``: the client is opened once, under a lock,
and closed when the last holder ``release``s it. Calls run under a shared lock (many at once);
closing, re-opening (another process re-synced the folder, so the vector graph this process
holds in memory is stale) and wiping wait for the calls in flight and run alone.

The registry below is process state on purpose: it mirrors chromadb's own per-path cache,
which is process-wide whatever we do.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CollectionFactory = Callable[[Any], Any]  # client -> chromadb Collection


class SharedChroma:
    """The one chromadb ``PersistentClient`` of a folder in this process.

    ``token`` is the index state the open client reflects (see ``refresh``): holders compare
    it with their state file to notice that another process re-synced the folder.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.token: str | None = None
        self.refs = 0  # holders, counted by acquire/release under the registry lock
        self._client: Any = None
        self._collections: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._made = threading.Lock()  # one get_or_create_collection at a time
        self._readers = 0
        self._writing = False
        self._waiting = 0  # exclusive sections waiting: new calls hold back for them
        self._local = threading.local()  # this thread's depth of nested ``use``

    @property
    def is_open(self) -> bool:
        return self._client is not None

    # -- calls (shared) ---------------------------------------------------------------------

    @contextmanager
    def use(self) -> Iterator[Any]:
        """The client, opened if need be, held open (not closed or re-opened) until exit."""
        depth = getattr(self._local, "depth", 0)
        with self._cond:
            if depth == 0:  # a nested call must not wait for a writer waiting on its outer one
                while self._writing or self._waiting:
                    self._cond.wait()
            if self._client is None:
                self._client = self._connect()
            self._readers += 1
        self._local.depth = depth + 1
        try:
            yield self._client
        finally:
            self._local.depth = depth
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    def collection(self, client: Any, name: str, create: CollectionFactory) -> Any:
        """The collection ``name`` of the open ``client`` (from ``use``), made once."""
        col = self._collections.get(name)
        if col is None:
            with self._made:
                col = self._collections.get(name)
                if col is None:
                    col = self._collections[name] = create(client)
        return col

    def _connect(self) -> Any:
        import chromadb  # heavy: chromadb
        from chromadb.config import Settings  # heavy: chromadb

        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return chromadb.PersistentClient(
                path=str(self.path), settings=Settings(anonymized_telemetry=False,
                                                       allow_reset=False))
        except Exception:
            # chromadb 1.5 keeps a half-started System in its class-level cache when opening
            # fails (a damaged database), and every later client for the path would fail too.
            self._forget_system()
            raise

    def _forget_system(self) -> None:
        from chromadb.api.shared_system_client import SharedSystemClient  # heavy: chromadb

        SharedSystemClient._identifier_to_system.pop(str(self.path), None)
        SharedSystemClient._identifier_to_refcount.pop(str(self.path), None)

    # -- closing (exclusive) ----------------------------------------------------------------

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            raise RuntimeError(f"chromadb folder {self.path}: cannot close or re-open it "
                               "from inside a call on it")
        with self._cond:
            self._waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def _close_client(self) -> None:
        client, self._client = self._client, None
        self._collections = {}
        self.token = None
        if client is not None:
            client.close()

    def close(self) -> None:
        """Close the client (the next ``use`` opens a new one). Safe to call twice."""
        with self._exclusive():
            self._close_client()

    def refresh(self, token: str | None) -> None:
        """Make the client reflect the state ``token``: re-open it when it was opened before
        another process re-synced the folder. Free when the token already matches."""
        if self.token == token:
            return
        with self._exclusive():
            if self.token != token and self._client is not None:
                self._close_client()
            self.token = token  # a client opened from now on reads what the token describes

    def wipe(self) -> None:
        """Close the client, forget chromadb's cached System and delete the folder."""
        with self._exclusive():
            try:
                self._close_client()
            except Exception:  # noqa: BLE001 - a damaged database may fail to close; it goes anyway
                self._client = None
            self._forget_system()
            shutil.rmtree(self.path, ignore_errors=True)


class SharedCollection:
    """A chromadb collection called through its folder's ``SharedChroma``: each call holds
    the shared lock, and a client re-opened in between is picked up by the next call."""

    def __init__(self, shared: SharedChroma, name: str, create: CollectionFactory) -> None:
        self.shared = shared
        self.name = name
        self._create = create

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self.shared.use() as client:
            col = self.shared.collection(client, self.name, self._create)
            return getattr(col, method)(*args, **kwargs)

    def get(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("get", *args, **kwargs)

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("query", *args, **kwargs)

    def upsert(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("upsert", *args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        return self._call("delete", *args, **kwargs)

    def count(self) -> int:
        return int(self._call("count"))


_REGISTRY: dict[str, SharedChroma] = {}
_REGISTRY_LOCK = threading.Lock()


def acquire(path: Path | str) -> SharedChroma:
    """The shared client of the chromadb folder ``path``; ``release`` it when done."""
    key = str(Path(path).resolve())
    with _REGISTRY_LOCK:
        shared = _REGISTRY.get(key)
        if shared is None:
            shared = _REGISTRY[key] = SharedChroma(Path(path))
        shared.refs += 1
        return shared


def release(shared: SharedChroma) -> None:
    """Let go of ``shared``; the last holder's release closes its client."""
    with _REGISTRY_LOCK:
        shared.refs = max(0, shared.refs - 1)
        if shared.refs:
            return
        # Closed under the registry lock, so a new holder cannot take the folder half-closed.
        # The entry itself stays: a thread still calling through a released holder must find
        # the same entry (and its lock), never open a second client beside a new one.
        shared.close()
