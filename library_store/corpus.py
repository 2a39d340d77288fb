"""An evidence corpus: documents a user adds, cut into chunks, searchable by meaning.

The verifier's solver and checker read their evidence from here, and the ``search`` tool
(``tools/search.py``) lets an agent query it. One corpus is one folder, by default
``<library>/corpus/<name>/`` (beside ``traces/`` and ``index/``: not part of any library
version, so adding ten thousand passages makes no version)::

    documents.jsonl   the truth: one line per document (content hash, sources, chunks)
    chroma/           the chromadb collection of the chunks (derived: ``reindex`` rebuilds it)
    state.json        what the collection was last synced to; .lock, .tmp/ for writers

A document is keyed by the sha256 of its text, so adding the same text again changes nothing
(its new source is remembered beside the old), and adding a changed file replaces what that
file gave before. Writers hold a file lock; each change rewrites ``documents.jsonl`` atomically,
then brings the collection in step (``pending`` in the state until it is), so a writer killed
half-way leaves a corpus the next opener repairs. Embeddings come from the packaged
all-MiniLM-L6-v2 (``library_store/embeddings.py``), never chromadb's downloading default.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ..engine.errors import ConfigError, EmptyCorpus, LibraryError, NotFound
from ..engine.types import Passage
from .chroma_client import SharedChroma, SharedCollection, acquire, release
from .chunking import DEFAULT_CHUNKS, ChunkSpec, SourceDoc, chunk_document
from .embeddings import Embedder, TextEmbedder, chroma_embedding_function
from .fsutil import atomic_write, clean_dir, sha256_bytes

CORPUS_DIR = "corpus"
DEFAULT_CORPUS = "default"
COLLECTION = "whetstone-corpus"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def check_corpus_name(name: str) -> str:
    """A corpus name: lower-case letters, digits, '.', '_' and '-', starting with a letter or
    digit (it names a folder)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"bad corpus name {name!r}: use lower-case letters, digits, '.', "
                          "'_' and '-' (at most 63), starting with a letter or digit",
                          hint="e.g. --corpus halueval")
    return name


def corpus_path(library_root: Path, name: str = DEFAULT_CORPUS) -> Path:
    """Where the corpus ``name`` of a library lives."""
    return Path(library_root) / CORPUS_DIR / check_corpus_name(name)


@dataclass(frozen=True)
class CorpusDocument:
    """One stored document: ``key`` (its content hash, 16 hex), every source that gave this
    text, its title, its chunks and how they were cut."""

    key: str
    sources: tuple[str, ...]
    chunks: tuple[str, ...]
    title: str = ""
    chunking: str = ""
    chars: int = 0
    added: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)

    def chunk_ids(self) -> list[str]:
        # The cut is part of the id: the same text cut differently is different chunks.
        tag = self.chunking.replace("/", "-")
        return [f"{self.key}-{tag}-{i}" for i in range(len(self.chunks))]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "sources": list(self.sources), "chunks": list(self.chunks),
                "title": self.title, "chunking": self.chunking, "chars": self.chars,
                "added": self.added, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CorpusDocument:
        return cls(d["key"], tuple(d.get("sources") or ()), tuple(d.get("chunks") or ()),
                   d.get("title", ""), d.get("chunking", ""), int(d.get("chars", 0)),
                   float(d.get("added", 0.0)), dict(d.get("metadata") or {}))


@dataclass
class AddReport:
    """What one ``add`` did, by source: added (a new text), duplicates (a new source of a text
    already stored), unchanged, replaced (a source's text changed); removed: documents gone
    with a re-added file's dropped records; chunks cut; inputs skipped (with why)."""

    added: int = 0
    duplicates: int = 0
    unchanged: int = 0
    replaced: int = 0
    removed: int = 0
    chunks: int = 0
    skipped: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"added": self.added, "duplicates": self.duplicates, "unchanged": self.unchanged, "replaced": self.replaced,
                "removed": self.removed, "chunks": self.chunks, "skipped": list(self.skipped)}


class Corpus:
    """A corpus folder (see the module docstring). ``search`` is what retrievers call.

    ``embedder`` embeds chunks and queries (default: the packaged MiniLM through torch).
    Thread-safe for readers; writers in any process are serialised by the lock.
    """

    def __init__(self, path: Path | str, embedder: Embedder | None = None, *,
                 name: str | None = None, lock_timeout: float = 300.0,
                 batch_size: int = 256) -> None:
        self.path = Path(path)
        self.name = name or self.path.name
        self.embedder: Embedder = embedder if embedder is not None else TextEmbedder()
        self.lock_timeout = lock_timeout
        self.batch_size = batch_size
        self._client: SharedChroma | None = None
        self._collection: SharedCollection | None = None
        self._hold = threading.Lock()  # guards _client and _collection

    @classmethod
    def of_library(cls, library_root: Path | str, name: str = DEFAULT_CORPUS,
                   embedder: Embedder | None = None) -> Corpus:
        """The corpus ``name`` of the library at ``library_root``."""
        return cls(corpus_path(Path(library_root), name), embedder, name=name)

    # -- the catalog ------------------------------------------------------------------------

    @property
    def catalog_path(self) -> Path:
        return self.path / "documents.jsonl"

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    def exists(self) -> bool:
        return self.catalog_path.exists()

    def documents(self) -> list[CorpusDocument]:
        """Every document, in the order they were first added."""
        try:
            text = self.catalog_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(CorpusDocument.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise LibraryError(f"{self.catalog_path}:{lineno} is damaged ({exc})",
                                   hint="fix or delete that line, then `whetstone corpus "
                                        "reindex`") from exc
        return out

    def _write_catalog(self, docs: Sequence[CorpusDocument]) -> None:
        data = "".join(json.dumps(d.to_dict(), ensure_ascii=False) + "\n" for d in docs)
        atomic_write(self.catalog_path, data.encode("utf-8"), tmp_dir=self.path / ".tmp")

    def state(self) -> dict[str, Any]:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_state(self, **state: Any) -> None:
        atomic_write(self.state_path, json.dumps(state).encode("utf-8"),
                     tmp_dir=self.path / ".tmp")

    def stats(self) -> dict[str, Any]:
        """Name, path, documents, chunks, characters and the embedder."""
        docs = self.documents()
        return {"name": self.name, "path": str(self.path), "documents": len(docs),
                "chunks": sum(len(d.chunks) for d in docs),
                "chars": sum(d.chars for d in docs), "embedder": self.embedder.name}

    # -- writing ----------------------------------------------------------------------------

    def _lock(self) -> FileLock:
        self.path.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.path / ".lock"), timeout=self.lock_timeout)

    def _locked(self) -> FileLock:
        lock = self._lock()
        try:
            lock.acquire()
        except Timeout as exc:
            raise LibraryError(f"the corpus at {self.path} is locked by another process",
                               hint="wait for it to finish, then try again") from exc
        clean_dir(self.path / ".tmp")
        return lock

    def add(self, docs: Iterable[SourceDoc], *, spec: ChunkSpec = DEFAULT_CHUNKS,
            replace_under: Sequence[str] = (), keep: Sequence[str] = ()) -> AddReport:
        """Add ``docs``. A text already stored (same hash and cut) is unchanged; a source that
        gave another text before now gives this one. Sources equal to or under one of
        ``replace_under`` (a re-added file or folder) that ``docs`` no longer give are dropped,
        except those under ``keep`` (refused this time: a refused input changes nothing).
        """
        report = AddReport()
        lock = self._locked()
        try:
            catalog = {d.key: d for d in self.documents()}
            owner = {s: d.key for d in catalog.values() for s in d.sources}
            given: set[str] = {s for s in owner if any(_under(s, k) for k in keep)}
            for doc in docs:
                given.add(doc.source)
                self._add_one(catalog, owner, doc, spec, report)
            for source in [s for s in owner if s not in given
                           and any(_under(s, p) for p in replace_under)]:
                report.removed += _detach(catalog, owner, source)
            self._commit(list(catalog.values()))
        finally:
            lock.release()
        return report

    @staticmethod
    def _add_one(catalog: dict[str, CorpusDocument], owner: dict[str, str], doc: SourceDoc,
                 spec: ChunkSpec, report: AddReport) -> None:
        if not doc.text.strip():
            report.skipped.append(f"{doc.source}: empty")
            return
        key = sha256_bytes(doc.text.encode("utf-8"))[:16]
        old = owner.get(doc.source)
        if old == key and catalog[key].chunking == spec.tag:
            report.unchanged += 1
            return
        if old is not None:
            _detach(catalog, owner, doc.source)  # its text changed (or is cut differently)
        found = catalog.get(key)
        if found is not None and found.chunking == spec.tag:
            # The same text from another source: one document, both sources remembered.
            catalog[key] = _with_sources(found, (*found.sources, doc.source))
            report.duplicates += 1 if old is None else 0
        else:
            others = found.sources if found is not None else ()
            chunks = tuple(chunk_document(doc, spec))
            catalog[key] = CorpusDocument(key, (*others, doc.source), chunks, doc.title,
                                          spec.tag, len(doc.text), time.time(),
                                          dict(doc.metadata))
            report.chunks += len(chunks)
            report.added += 1 if old is None else 0
        report.replaced += 1 if old is not None else 0
        owner[doc.source] = key

    def remove(self, target: str) -> list[str]:
        """Remove a source (a path as it was added, resolved when it exists here; a folder
        removes every source under it; ``file#id`` one record) or a document by key prefix
        (at least 6 hex digits). Returns the keys of the documents removed."""
        target = target.strip()
        if not target:
            raise ConfigError("nothing to remove", hint="give a source (see `whetstone "
                              "corpus ls`) or a document key")
        resolved = str(Path(target).resolve()) if Path(target).exists() else target
        lock = self._locked()
        try:
            catalog = {d.key: d for d in self.documents()}
            owner = {s: d.key for d in catalog.values() for s in d.sources}
            sources = [s for s in owner if _under(s, target) or _under(s, resolved)]
            before = set(catalog)
            for s in sources:
                _detach(catalog, owner, s)
            if not sources and re.fullmatch(r"[0-9a-f]{6,16}", target):
                keys = [k for k in catalog if k.startswith(target)]
                if len(keys) > 1:
                    raise ConfigError(f"{target!r} matches {len(keys)} documents",
                                      hint="give more digits of the key")
                for k in keys:
                    del catalog[k]
            removed = sorted(before - set(catalog))
            if not sources and not removed:
                raise NotFound(f"corpus {self.name!r} has no source or document {target!r}",
                               hint="`whetstone corpus ls` lists sources and keys")
            self._commit(list(catalog.values()))
        finally:
            lock.release()
        return removed

    def _commit(self, docs: Sequence[CorpusDocument]) -> None:
        """Write the catalog, then bring the collection in step (under the lock)."""
        self._write_catalog(docs)
        self._sync_locked()

    # -- the collection ---------------------------------------------------------------------

    def _open(self) -> SharedCollection:
        """The chunks' collection, through this process's one client of the folder
        (``chroma_client``: threads searching at once must not each open one)."""
        with self._hold:
            if self._collection is None:
                self._client = acquire(self.path / "chroma")
                embed = chroma_embedding_function(
                    self.embedder if isinstance(self.embedder, TextEmbedder) else None)

                def create(client: Any) -> Any:
                    return client.get_or_create_collection(
                        COLLECTION, embedding_function=embed,
                        configuration={"hnsw": {"space": "cosine"}},
                        metadata={"corpus": self.name})

                self._collection = SharedCollection(self._client, COLLECTION, create)
            return self._collection

    def close(self) -> None:
        """Let go of the shared client (the last holder closes it). Safe to call twice."""
        with self._hold:
            shared, self._client, self._collection = self._client, None, None
        if shared is not None:
            release(shared)

    def _shared(self) -> SharedChroma:
        self._open()
        assert self._client is not None  # _open set it
        return self._client

    def _wipe(self) -> None:
        self._shared().wipe()

    def _indexed_ids(self, page: int = 5000) -> set[str]:
        col, out, offset = self._open(), set(), 0
        while True:
            got = col.get(include=[], limit=page, offset=offset)
            out.update(got["ids"])
            if len(got["ids"]) < page:
                return out
            offset += page

    def _sync_locked(self) -> None:
        """Make the collection hold exactly the catalog's chunks."""
        digest = sha256_bytes(self.catalog_path.read_bytes()) if self.exists() else ""
        state = self.state()
        if state.get("embedder") not in (None, self.embedder.name):
            self._wipe()
        self._write_state(catalog=digest, embedder=self.embedder.name, pending=True,
                          token=uuid.uuid4().hex, chunks=state.get("chunks", 0))
        try:
            count = self._apply()
        except LibraryError:
            raise
        except Exception:  # noqa: BLE001 - chromadb failed: the collection is derived, rebuild
            self._wipe()
            count = self._apply()
        token = uuid.uuid4().hex
        self._write_state(catalog=digest, embedder=self.embedder.name, pending=False,
                          token=token, chunks=count, stamp=self._stamp() if self.exists()
                          else None)
        self._shared().token = token  # our own writes: the shared client reflects them

    def _apply(self) -> int:
        expected: dict[str, tuple[CorpusDocument, int]] = {}
        for doc in self.documents():
            for i, cid in enumerate(doc.chunk_ids()):
                expected[cid] = (doc, i)
        col = self._open()
        indexed = self._indexed_ids()
        gone = sorted(indexed - set(expected))
        for start in range(0, len(gone), self.batch_size):
            col.delete(ids=gone[start:start + self.batch_size])
        new = [cid for cid in expected if cid not in indexed]
        for start in range(0, len(new), self.batch_size):
            ids = new[start:start + self.batch_size]
            texts = [expected[c][0].chunks[expected[c][1]] for c in ids]
            col.upsert(ids=ids, embeddings=self.embedder.embed(texts), documents=texts,
                       metadatas=[{"doc": expected[c][0].key, "chunk": expected[c][1],
                                   "source": expected[c][0].sources[0]
                                   if expected[c][0].sources else ""} for c in ids])
        return len(expected)

    def _stamp(self) -> list[int]:
        """The catalog's modification time and size: a cheap check that it is unchanged."""
        st = self.catalog_path.stat()
        return [st.st_mtime_ns, st.st_size]

    def ensure(self) -> None:
        """Repair the collection when a writer stopped half-way or the catalog was edited by
        hand; reopen it when another process changed it. Cheap when all is in step (a stat
        and a small file read)."""
        if not self.exists():
            return
        state = self.state()
        fresh = bool(state) and not state.get("pending") and \
            state.get("embedder") == self.embedder.name
        if fresh and state.get("stamp") != self._stamp():
            fresh = state.get("catalog") == sha256_bytes(self.catalog_path.read_bytes())
        if fresh:
            if self._client is not None:  # another process re-synced: our graph is stale
                self._client.refresh(state.get("token"))
            return
        lock = self._lock()
        try:
            lock.acquire(timeout=0)
        except Timeout:
            # A writer is at work (a long add): read what is indexed now rather than wait.
            if self._client is not None:
                self._client.close()
            return
        try:
            clean_dir(self.path / ".tmp")
            self._sync_locked()
        finally:
            lock.release()

    def reindex(self) -> int:
        """Drop the collection and build it again from ``documents.jsonl``; returns chunks."""
        lock = self._locked()
        try:
            self._wipe()
            self.state_path.unlink(missing_ok=True)
            self._sync_locked()
        finally:
            lock.release()
        return int(self.state().get("chunks", 0))

    # -- reading ----------------------------------------------------------------------------

    def search(self, query: str, k: int = 5) -> list[Passage]:
        """The ``k`` chunks nearest to ``query``, best first. ``EmptyCorpus`` when the corpus
        holds nothing (the hint says how to fill it)."""
        if not query.strip():
            raise ConfigError("the search query is empty", hint="ask about something")
        self.ensure()
        count = self._open().count() if self.exists() else 0
        if count == 0:
            busy = " and is being filled by another process" if self.state().get("pending") \
                else ""
            raise EmptyCorpus(f"the corpus {self.name!r} is empty{busy} ({self.path})",
                              hint=f"add documents: whetstone corpus add PATH --corpus "
                                   f"{self.name}" if not busy else "try again when it is done")
        if k <= 0:
            return []
        got = self._open().query(query_embeddings=[self.embedder.embed([query])[0]],
                                 n_results=min(k, count),
                                 include=["documents", "metadatas", "distances"])
        return [Passage(text=text, source=str((meta or {}).get("source", "")),
                        score=round(1.0 - float(dist), 6), id=cid)
                for cid, text, meta, dist in zip(got["ids"][0], got["documents"][0],
                                                 got["metadatas"][0], got["distances"][0], strict=False)]


def _under(source: str, prefix: str) -> bool:
    """``source`` is ``prefix`` itself, a record of it (``prefix#id``) or a file under it."""
    return source == prefix or source.startswith((prefix + "#", prefix.rstrip("/") + "/"))


def _detach(catalog: dict[str, CorpusDocument], owner: dict[str, str], source: str) -> int:
    """Forget one source; a document no source gives any more is removed (returns 1)."""
    key = owner.pop(source, None)
    if key is None or key not in catalog:
        return 0
    rest = tuple(s for s in catalog[key].sources if s != source)
    if rest:
        catalog[key] = _with_sources(catalog[key], rest)
        return 0
    del catalog[key]
    return 1


def _with_sources(doc: CorpusDocument, sources: tuple[str, ...]) -> CorpusDocument:
    return CorpusDocument(doc.key, sources, doc.chunks, doc.title, doc.chunking, doc.chars,
                          doc.added, doc.metadata)


def list_corpora(library_root: Path | str) -> list[str]:
    """The names of a library's corpora."""
    folder = Path(library_root) / CORPUS_DIR
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and _NAME.match(p.name))
