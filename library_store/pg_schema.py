"""The PostgreSQL store's schema, as numbered migrations applied in order.

``schema_migrations`` records which have run. Opening a store applies the missing ones in one
transaction under an advisory lock, so replicas starting together upgrade it once, and a
store written by an older Whetstone is upgraded in place (its rows kept). A store newer than
this Whetstone is refused: its tables may mean something this code does not know.

What lives where:

    blobs(digest, data)               file contents and tree objects, by sha256 (never rewritten)
    versions(number, id, manifest)    each version's manifest, the JSON ``versions/vN.json`` holds
    pointer(name, version)            ``current``: what ``CURRENT`` says in a folder
    candidates(name, record, created) the gate's rejected changes (``candidates/NAME.json``)
    settings(id, data)                what ``library.json`` says (the trace caps)
    trace_records(seq, ...)           one row per trace record; the latest seq of an id wins
    trace_images(digest, ...)         images of traces, once by hash
    trace_totals(id, bytes)           the records' bytes, kept by every write (the size cap)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..engine.errors import LibraryError

# Each entry runs once, in order; never edit one that has shipped: add the next.
MIGRATIONS: tuple[str, ...] = (
    # 1: the library (versions, blobs, the current pointer, candidates, settings) and traces.
    """
    CREATE TABLE blobs(digest text PRIMARY KEY, data bytea NOT NULL);
    CREATE TABLE versions(number bigint PRIMARY KEY, id text NOT NULL UNIQUE,
                          manifest bytea NOT NULL);
    CREATE TABLE pointer(name text PRIMARY KEY, version text NOT NULL);
    CREATE TABLE candidates(name text PRIMARY KEY, record bytea NOT NULL,
                            created double precision NOT NULL);
    CREATE TABLE settings(id integer PRIMARY KEY CHECK (id = 1), data jsonb NOT NULL);
    CREATE TABLE trace_records(seq bigserial PRIMARY KEY, id text NOT NULL,
                               started double precision NOT NULL, line text NOT NULL);
    CREATE INDEX trace_records_id ON trace_records(id);
    """,
    # 2: a write key per record (a write retried after a lost connection lands once), record
    # sizes kept for the size cap, the latest record of an id (and id prefixes) by index,
    # and images stored once by hash instead of in each record.
    """
    ALTER TABLE trace_records ADD COLUMN write_key text;
    ALTER TABLE trace_records ADD COLUMN nbytes integer;
    UPDATE trace_records SET nbytes = octet_length(line);
    ALTER TABLE trace_records ALTER COLUMN nbytes SET NOT NULL;
    CREATE UNIQUE INDEX trace_records_write_key ON trace_records(write_key);
    DROP INDEX trace_records_id;
    CREATE INDEX trace_records_latest ON trace_records((id COLLATE "C"), seq DESC);
    CREATE TABLE trace_images(digest text PRIMARY KEY, media_type text NOT NULL,
                              data bytea NOT NULL);
    CREATE TABLE trace_totals(id integer PRIMARY KEY CHECK (id = 1), bytes bigint NOT NULL);
    INSERT INTO trace_totals VALUES (1, (SELECT coalesce(sum(nbytes), 0) FROM trace_records));
    """,
)
LATEST = len(MIGRATIONS)


def schema_version(conn: Any) -> int:
    """The highest migration applied to the connection's schema (0: none, or no tables)."""
    row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    found = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(found[0]) if found else 0


def migrate(conn: Any, schema: str, *, upto: int | None = None,
            migrations: Sequence[str] = MIGRATIONS) -> list[int]:
    """Bring ``schema`` (made when missing) up to migration ``upto`` (default: the latest);
    returns the numbers applied. One transaction: a failure leaves the schema as it was."""
    target = len(migrations) if upto is None else upto
    applied: list[int] = []
    with conn.transaction():
        # Serialises replicas starting at once on the same schema (database-wide lock key).
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('whetstone-migrate:' || %s))",
                     (schema,))
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations("
                     "version integer PRIMARY KEY, applied double precision NOT NULL)")
        have = schema_version(conn)
        if have > len(migrations):
            raise LibraryError(
                f"the store's schema {schema!r} is at version {have}; this Whetstone knows "
                f"versions up to {len(migrations)}",
                hint="upgrade Whetstone on this machine to the release the other replicas run")
        for number in range(have + 1, target + 1):
            conn.execute(migrations[number - 1])
            conn.execute("INSERT INTO schema_migrations VALUES (%s, %s)", (number, time.time()))
            applied.append(number)
    return applied
