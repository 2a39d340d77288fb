"""A library's shared state in PostgreSQL (``--store postgresql://...``): the ``Backing`` of
backing.py over the tables of pg_schema.py.

A commit is one transaction under a transaction-scoped advisory lock (the writers' lock across
machines): its blobs, its manifest, the ``current`` pointer and the ``NOTIFY`` that announces it
land together or not at all, so a connection cut at any point leaves the old version current
or the new one, never a mix. Blobs are content-addressed and written with ``ON CONFLICT DO
NOTHING``, so a write retried after a lost answer lands once. A commit whose answer was lost
is looked up before it is tried again (``landed``).

Each process keeps one ``PgShared`` per store URL (its connections, the version follower, a
cache of blobs read): a server opens the same store from several places, and the connections
and the listening socket are process state whatever holds them.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..engine.errors import LibraryError, StoreUnavailable
from .blobs import BlobStore
from .fsutil import sha256_bytes
from .manifest import Manifest, version_number
from .pg_connect import RETRY_S, Pool, StoreUrl, lost_errors, psycopg
from .pg_follow import VersionFollower
from .pg_schema import migrate
from .traces import TraceStore

T = TypeVar("T")
BLOB_CACHE_BYTES = 64 * 1024 * 1024
SETTINGS_TTL_S = 1.0
# The writers' lock across machines, one per schema; released when its transaction ends.
WRITERS_LOCK = "SELECT pg_advisory_xact_lock(hashtext('whetstone-write:' || %s))"


class PgShared:
    """One store's state in this process: connections, the follower, the blob cache."""

    def __init__(self, url: StoreUrl) -> None:
        self.url = url
        self.pool = Pool(url)
        self.follower = VersionFollower(self.pool, lambda: self.read_current(retry_s=0))
        self.blob_cache: OrderedDict[str, bytes] = OrderedDict()
        self.blob_cache_bytes = 0
        self.cache_lock = threading.Lock()
        self._migrated = False
        self._lock = threading.Lock()

    def ensure_schema(self) -> None:
        """Create or upgrade the schema, once per process."""
        if self._migrated:
            return
        with self._lock:
            if not self._migrated:
                self.pool.call(lambda c: migrate(c, self.url.schema), what="setting up the schema")
                self._migrated = True

    def read_current(self, retry_s: float = RETRY_S) -> str | None:
        self.ensure_schema()
        row = self.pool.call(lambda c: c.execute(
            "SELECT version FROM pointer WHERE name = 'current'").fetchone(),
            what="reading the current version", retry_s=retry_s)
        return str(row[0]) if row else None

    def remember(self, digest: str, data: bytes) -> None:
        """Keep a committed blob's bytes (least recently used out past the byte budget)."""
        if len(data) > BLOB_CACHE_BYTES // 64:
            return
        with self.cache_lock:
            if digest in self.blob_cache:
                self.blob_cache.move_to_end(digest)
                return
            self.blob_cache[digest] = data
            self.blob_cache_bytes += len(data)
            while self.blob_cache_bytes > BLOB_CACHE_BYTES:
                _, old = self.blob_cache.popitem(last=False)
                self.blob_cache_bytes -= len(old)

    def cached(self, digest: str) -> bytes | None:
        with self.cache_lock:
            data = self.blob_cache.get(digest)
            if data is not None:
                self.blob_cache.move_to_end(digest)
            return data


# Process state on purpose: one pool and one listening socket per store, however many
# ``Library`` objects a process opens on it (see chroma_client.py for the same choice).
_SHARED: dict[str, PgShared] = {}
_SHARED_LOCK = threading.Lock()


def shared_store(url: StoreUrl) -> PgShared:
    key = f"{url.conninfo}#{url.schema}"
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = PgShared(url)
        return found


def close_store(url: str | StoreUrl) -> None:
    """Close this process's connections to a store and forget them (the next use opens new
    ones)."""
    parsed = url if isinstance(url, StoreUrl) else StoreUrl.parse(url)
    with _SHARED_LOCK:
        found = _SHARED.pop(f"{parsed.conninfo}#{parsed.schema}", None)
    if found is not None:
        found.follower.close()
        found.pool.close()


class _Tx(threading.local):
    """The transaction this thread holds (inside ``PgBacking.transaction``)."""

    conn: Any = None
    blobs: dict[str, bytes] | None = None  # written in it: one batch at publish or commit
    published: str | None = None


class PgBlobStore(BlobStore):
    """Blobs in the ``blobs`` table. Inside a transaction new blobs wait in memory (reads of
    them are answered from there) and go in one batch when the version is published or the
    transaction commits; committed blobs read are cached by hash (they never change)."""

    def __init__(self, backing: PgBacking, local: Path) -> None:
        super().__init__(local / "blobs", local / ".tmp", durable=False)  # never written
        self.backing = backing

    def has(self, digest: str) -> bool:
        tx = self.backing.tx
        if tx.blobs is not None and digest in tx.blobs:
            return True
        if self.backing.shared.cached(digest) is not None:
            return True
        row = self.backing.run(lambda c: c.execute(
            "SELECT 1 FROM blobs WHERE digest = %s", (digest,)).fetchone(), "reading a blob")
        return row is not None

    def put(self, data: bytes) -> str:
        digest = sha256_bytes(data)
        tx = self.backing.tx
        if tx.blobs is not None:
            tx.blobs.setdefault(digest, bytes(data))
            return digest
        self.backing.run(lambda c: c.execute(
            "INSERT INTO blobs VALUES (%s, %s) ON CONFLICT DO NOTHING", (digest, data)),
            "writing a blob")
        return digest

    def flush(self) -> None:
        """Write the blobs this thread's transaction holds in memory."""
        tx = self.backing.tx
        if tx.blobs and tx.conn is not None:
            with tx.conn.cursor() as cur:
                cur.executemany("INSERT INTO blobs VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                list(tx.blobs.items()))
            tx.blobs.clear()

    def get(self, digest: str) -> bytes:
        tx = self.backing.tx
        if tx.blobs is not None and digest in tx.blobs:
            return tx.blobs[digest]
        hit = self.backing.shared.cached(digest)
        if hit is not None:
            return hit
        row = self.backing.run(lambda c: c.execute(
            "SELECT data FROM blobs WHERE digest = %s", (digest,)).fetchone(), "reading a blob")
        if row is None:
            raise LibraryError(f"blob {digest[:12]} is missing from the store "
                               f"{self.backing.where}",
                               hint="the store was changed outside Whetstone; restore it from "
                                    "a backup or an export (`whetstone library import`)")
        data = bytes(row[0])
        if tx.conn is None:  # read inside a transaction: may not be committed yet
            self.backing.shared.remember(digest, data)
        return data

    def verify(self, digest: str) -> bool:
        row = self.backing.run(lambda c: c.execute(
            "SELECT data FROM blobs WHERE digest = %s", (digest,)).fetchone(), "reading a blob")
        return row is not None and sha256_bytes(bytes(row[0])) == digest


class PgBacking:
    """A library in PostgreSQL (see the module). ``local`` is the library's folder on this
    machine (the view, resume state); nothing shared is kept there."""

    kind = "postgresql"

    def __init__(self, url: str | StoreUrl, local: Path) -> None:
        self.url = url if isinstance(url, StoreUrl) else StoreUrl.parse(url)
        self.shared = shared_store(self.url)
        self.local = local
        self.tx = _Tx()
        self.blobs = PgBlobStore(self, local)
        self._settings: tuple[float, dict[str, Any]] | None = None

    @property
    def where(self) -> str:
        return f"{self.url.shown} (schema {self.url.schema})"

    @property
    def follower(self) -> VersionFollower:
        return self.shared.follower

    def run(self, work: Callable[[Any], T], what: str) -> T:
        """``work(connection)`` on this thread's transaction when it holds one, else on a
        pooled connection, retried while connections break (``Pool.call``)."""
        self.shared.ensure_schema()
        if self.tx.conn is not None:
            return work(self.tx.conn)  # reads of its own blobs are answered from memory
        return self.shared.pool.call(work, what=what)

    def initialized(self) -> bool:
        return self.current() is not None

    def local_folders(self) -> tuple[str, ...]:
        return ()

    def current(self) -> str | None:
        if self.tx.conn is not None:  # a writer reads the pointer under its lock, fresh
            row = self.tx.conn.execute(
                "SELECT version FROM pointer WHERE name = 'current'").fetchone()
            return str(row[0]) if row else None
        self.shared.ensure_schema()
        return self.follower.current()

    def manifest(self, vid: str) -> bytes:
        row = self.run(lambda c: c.execute("SELECT manifest FROM versions WHERE id = %s",
                                           (vid,)).fetchone(), "reading a version")
        if row is None:
            raise FileNotFoundError(vid)
        return bytes(row[0])

    @contextlib.contextmanager
    def transaction(self, timeout_s: float) -> Iterator[None]:
        """One transaction holding the writers' advisory lock (waits ``timeout_s``)."""
        if self.tx.conn is not None:  # nested: the outer one commits
            yield
            return
        self.shared.ensure_schema()
        pg = psycopg()
        try:
            with self.shared.pool.connection() as conn, conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {max(1, int(timeout_s * 1000))}")
                try:
                    conn.execute(WRITERS_LOCK, (self.url.schema,))
                except pg.errors.LockNotAvailable as exc:
                    raise LibraryError(
                        f"the library in {self.where} is locked by another writer "
                        f"(waited {timeout_s:.0f}s)",
                        hint="wait for the other process (an evolve or import) to finish"
                    ) from exc
                self.tx.conn, self.tx.blobs, self.tx.published = conn, {}, None
                try:
                    yield
                    self.blobs.flush()
                finally:
                    self.tx.conn, self.tx.blobs = None, None
        except lost_errors() as exc:
            raise self.shared.pool.unavailable("the write was cut off", exc) from exc
        published, self.tx.published = self.tx.published, None
        if published is not None:
            self.follower.changed(published)  # committed: this process serves it at once

    def publish(self, m: Manifest) -> None:
        conn = self._writer()
        conn.execute("INSERT INTO versions VALUES (%s, %s, %s)",
                     (version_number(m.id), m.id, m.to_json()))
        conn.execute("INSERT INTO pointer VALUES ('current', %s) ON CONFLICT (name) "
                     "DO UPDATE SET version = excluded.version", (m.id,))
        conn.execute("SELECT pg_notify(%s, %s)", (self.url.channel, m.id))
        self.tx.published = m.id

    def unpublish(self, m: Manifest, parent: Manifest) -> None:
        """Nothing to undo here: the error that follows rolls the transaction back."""
        self.tx.published = None

    def landed(self, m: Manifest) -> bool:
        """Whether ``m`` was published, asked under the writers' lock: a commit whose answer
        was cut off may still be ending on the server, and read before it ends it would look
        lost (its retry then finds its own change already made)."""
        def ask(conn: Any) -> Any:
            with conn.transaction():
                conn.execute(WRITERS_LOCK, (self.url.schema,))
                return conn.execute("SELECT manifest FROM versions WHERE id = %s",
                                    (m.id,)).fetchone()

        row = self.run(ask, "reading a version")
        return row is not None and bytes(row[0]) == m.to_json()

    def _writer(self) -> Any:
        if self.tx.conn is None:
            raise LibraryError("a write to the store outside its transaction",
                               hint="this is a bug in Whetstone; please report it")
        self.blobs.flush()
        return self.tx.conn

    def settings(self) -> dict[str, Any]:
        """The settings, read again at most every ``SETTINGS_TTL_S``; while the store does not
        answer, the ones last read (a server keeps serving through an outage)."""
        now = time.monotonic()
        if self._settings is not None and now - self._settings[0] < SETTINGS_TTL_S \
                and self.tx.conn is None:
            return dict(self._settings[1])
        try:
            row = self.run(lambda c: c.execute(
                "SELECT data FROM settings WHERE id = 1").fetchone(), "reading the settings")
        except StoreUnavailable:
            if self._settings is None or self.tx.conn is not None:
                raise
            return dict(self._settings[1])
        data = dict(row[0]) if row and isinstance(row[0], dict) else {}
        self._settings = (now, data)
        return dict(data)

    def write_settings(self, data: Mapping[str, Any]) -> None:
        self._writer().execute(
            "INSERT INTO settings VALUES (1, %s) ON CONFLICT (id) DO UPDATE SET data = "
            "excluded.data", (json.dumps(dict(data)),))
        self._settings = None

    def save_candidate(self, name: str, record: bytes, created: float) -> None:
        self._writer().execute(
            "INSERT INTO candidates VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
            "record = excluded.record, created = excluded.created", (name, record, created))

    def candidate(self, name: str) -> bytes:
        row = self.run(lambda c: c.execute("SELECT record FROM candidates WHERE name = %s",
                                           (name,)).fetchone(), "reading a candidate")
        if row is None:
            raise FileNotFoundError(name)
        return bytes(row[0])

    def candidates(self) -> list[bytes]:
        rows = self.run(lambda c: c.execute(
            "SELECT record FROM candidates ORDER BY created, name").fetchall(),
            "reading the candidates")
        return [bytes(r[0]) for r in rows]

    def drop_candidate(self, name: str) -> None:
        self._writer().execute("DELETE FROM candidates WHERE name = %s", (name,))

    def trace_store(self, settings: Mapping[str, Any]) -> TraceStore:
        # lazy: cycle (pg_traces builds on this module's PgShared)
        from .pg_traces import pg_trace_store

        return pg_trace_store(self, settings)

    def ready(self) -> str | None:
        try:
            self.shared.pool.call(lambda c: c.execute("SELECT 1").fetchone(),
                                  what="answering", retry_s=0)
        except LibraryError as exc:
            return exc.message
        return None
