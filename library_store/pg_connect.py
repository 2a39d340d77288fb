"""Reaching the PostgreSQL store: its URL, a small pool of connections, and what a lost
connection becomes.

``--store postgresql://user:pass@host:5432/db?schema=NAME`` (or ``WHETSTONE_STORE``) keeps a
library's shared state in PostgreSQL (``pg_library.py``, ``pg_traces.py``). ``schema`` names
the library inside the database (default ``whetstone``): one database may hold several. The
rest of the URL is libpq's own, passed as written.

psycopg (``pip install 'whetstone-engine[scale]'``) is imported only when such a store is
opened. A connection that breaks (the server restarted, a proxy cut it) is dropped from the
pool, and ``Pool.call`` runs its work again on a fresh one for a few seconds before it gives
up with ``StoreUnavailable``: every write it repeats is idempotent (blobs by hash, trace
records by their write key), so a retry never doubles anything.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..engine.errors import ConfigError, ModelNotInstalled, StoreUnavailable

STORE_ENV = "WHETSTONE_STORE"
DEFAULT_SCHEMA = "whetstone"
SCHEMES = ("postgresql", "postgres")
RETRY_S = 5.0  # how long a call retries a lost connection before StoreUnavailable
CONNECT_TIMEOUT_S = 3
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")

T = TypeVar("T")


def psycopg() -> Any:
    """The psycopg module; ``ModelNotInstalled`` (exit 3) saying how to install it."""
    try:
        import psycopg as module  # optional: the scale extra, only for a PostgreSQL store
    except ImportError:
        raise ModelNotInstalled(
            "a postgresql:// store needs the 'psycopg' package",
            hint="pip install 'whetstone-engine[scale]' (psycopg 3 with its binary), or drop "
                 "--store / WHETSTONE_STORE to keep the library in its folder") from None
    return module


def lost_errors() -> tuple[type[BaseException], ...]:
    """The errors of a connection that broke (retried on a fresh one)."""
    pg = psycopg()
    return (pg.OperationalError, pg.InterfaceError)


def is_store_url(text: str | None) -> bool:
    return bool(text) and str(text).split("://", 1)[0].lower() in SCHEMES


def store_spec(explicit: str | None = None) -> str | None:
    """The store a library opens: ``explicit``, else ``$WHETSTONE_STORE``; None (or ``file``,
    or empty) is the library's own folder."""
    spec = explicit if explicit is not None else os.environ.get(STORE_ENV)
    spec = (spec or "").strip()
    if not spec or spec == "file":
        return None
    if not is_store_url(spec):
        raise ConfigError(f"unknown store {StoreUrl.mask(spec)!r}",
                          hint="use postgresql://user@host:5432/db (or 'file', the default: "
                               "the library's own folder)")
    return spec


@dataclass(frozen=True)
class StoreUrl:
    """A parsed store URL: what libpq connects to, the schema holding the library, and the
    URL as messages may show it (no password)."""

    conninfo: str
    schema: str
    shown: str

    @staticmethod
    def mask(url: str) -> str:
        """``url`` with the password of its user part replaced by ``***``."""
        return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)

    @classmethod
    def parse(cls, url: str) -> StoreUrl:
        parts = urlsplit(url)
        if parts.scheme.lower() not in SCHEMES:
            raise ConfigError(f"{cls.mask(url)!r} is not a postgresql:// URL",
                              hint="e.g. postgresql://whetstone@db:5432/whetstone")
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((v for k, v in reversed(query) if k == "schema"), DEFAULT_SCHEMA)
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(f"bad schema {schema!r} in the store URL",
                              hint="a schema is 1-48 lower-case letters, digits and '_', "
                                   "starting with a letter or '_'")
        rest = urlencode([(k, v) for k, v in query if k != "schema"])
        conninfo = urlunsplit(parts._replace(query=rest))
        return cls(conninfo=conninfo, schema=schema, shown=cls.mask(url))

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel that announces new versions of this library."""
        return f"whetstone_{self.schema}"


class Pool:
    """Up to ``size`` idle connections to one store, shared by the threads of a process.

    Connections are autocommit (a transaction is asked for explicitly), keep TCP keepalives
    on (a peer that vanished is noticed), and read and write only the URL's schema."""

    def __init__(self, url: StoreUrl, *, size: int = 8) -> None:
        self.url = url
        self.size = size
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self.failures = 0  # connections that broke (tests and /readyz read it)

    def connect(self, **extra: Any) -> Any:
        """A new connection (not from the pool); ``StoreUnavailable`` when none can be made."""
        pg = psycopg()
        try:
            return pg.connect(self.url.conninfo, autocommit=True,
                              connect_timeout=CONNECT_TIMEOUT_S,
                              options=f"-c search_path={self.url.schema}",
                              application_name="whetstone", keepalives=1,
                              keepalives_idle=5, keepalives_interval=2, keepalives_count=3,
                              **extra)
        except pg.Error as exc:
            raise self.unavailable("cannot connect", exc) from exc

    def unavailable(self, what: str, exc: BaseException) -> StoreUnavailable:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreUnavailable(f"the store {self.url.shown}: {what}: {text}",
                                hint="check that PostgreSQL is up and reachable (pg_isready "
                                     "-d URL); writes are retried when it is back")

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection for one piece of work; a broken one is closed, not pooled again."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = self.connect()
        pg = psycopg()
        try:
            yield conn
        except BaseException:
            if not conn.closed and not conn.broken and \
                    conn.info.transaction_status != pg.pq.TransactionStatus.IDLE:
                with contextlib.suppress(pg.Error):
                    conn.rollback()
            if conn.broken or conn.closed:
                self.failures += 1
                conn.close()
            else:
                self._give_back(conn)
            raise
        self._give_back(conn)

    def _give_back(self, conn: Any) -> None:
        with self._lock:
            if len(self._idle) < self.size and not conn.closed:
                self._idle.append(conn)
                return
        conn.close()

    def call(self, work: Callable[[Any], T], *, what: str, retry_s: float = RETRY_S) -> T:
        """``work(connection)``, run again on a fresh connection while connections break,
        for at most ``retry_s`` seconds; then ``StoreUnavailable``. ``work`` must be safe to
        repeat (a read, or an idempotent write in one transaction)."""
        lost = lost_errors()
        deadline = time.monotonic() + retry_s
        delay = 0.02
        while True:
            try:
                with self.connection() as conn:
                    return work(conn)
            except StoreUnavailable as exc:
                error: BaseException = exc
            except lost as exc:
                error = exc
            if time.monotonic() + delay > deadline:
                if isinstance(error, StoreUnavailable):
                    raise error
                raise self.unavailable(what, error) from error
            time.sleep(delay)
            delay = min(0.5, delay * 2)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
