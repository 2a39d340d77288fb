"""The retrieval index: chromadb collections at ``<library>/index`` that follow the library.

The index is derived data. Each document (a skill's name + description; later tool and policy
notes, through more ``DocumentSource``s) carries the content hash of the file it came from,
and ``state.json`` records the tree it was built for. ``ensure`` brings the index to a version:
from the difference of the two trees when the last sync finished, or by comparing every
document's hash with the files when a sync was interrupted (``pending`` in the state). So
whatever version a library opens at after a crash, the index is made to match it before use.

One collection per document kind (``whetstone-skill``): chromadb answers a filtered query by
scanning metadata (33 ms at 10k documents, measured) but an unfiltered one from the HNSW graph
(1.4 ms), so kinds are separated by collection rather than by a ``where`` filter. The kind is
still stored on every document.

chromadb keeps each collection's vector graph in the memory of the process that opened it, so
a process re-opens its client when another process has re-synced the index (``token``). Every
``LibraryIndex`` of one folder in a process shares one client (``whetstone.library_store.chroma_client``),
so the threads of an ``eval -j 8`` can open, query and re-open it at once.
"""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from filelock import FileLock, Timeout

from ..engine.errors import LibraryError, ValidationError, WhetstoneError
from ..library_store.chroma_client import SharedChroma, SharedCollection, acquire, release
from ..library_store.embeddings import (
    Embedder,
    TextEmbedder,
    chroma_embedding_function,
    skill_embedder,
)
from ..library_store.fsutil import FileMemo, atomic_write, clean_dir
from ..library_store.store import Library, Snapshot
from .format import SKILL_FILE, parse_skill_md
from .loader import SKILLS_DIR

# Up to this many documents of a kind are ranked exactly in memory (a matrix-vector product,
# ~1.5 MB of vectors at 1,000), past it through chromadb's HNSW graph.
EXACT_MAX = 2048


@dataclass(frozen=True)
class Document:
    """One indexed text. ``key`` is unique within its kind; ``hash`` is its source file's."""

    kind: str
    key: str
    text: str
    hash: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """A query result: cosine similarity ``score`` in [-1, 1], higher is closer."""

    kind: str
    key: str
    score: float
    hash: str
    metadata: Mapping[str, Any] = field(default_factory=dict)


class DocumentSource(Protocol):
    """Where documents of one kind come from in a library version."""

    kind: str

    def key_of(self, path: str) -> str | None:
        """The document a changed file belongs to (None: not this kind)."""

    def expected(self, snapshot: Snapshot) -> dict[str, str]:
        """key -> source hash for every document of this kind (cheap: no parsing)."""

    def document(self, snapshot: Snapshot, key: str) -> Document | None:
        """The document for ``key``, or None when it is absent or malformed (not indexed)."""


def skill_document_text(name: str, description: str) -> str:
    """What is embedded for a skill. Hyphenated names read as words to the embedding model."""
    return f"{name.replace('-', ' ')}: {description}"


class SkillSource:
    """Skills: one document per ``skills/<name>/SKILL.md``, embedded as name + description."""

    kind = "skill"

    def key_of(self, path: str) -> str | None:
        parts = path.split("/")
        return parts[1] if len(parts) == 3 and parts[0] == SKILLS_DIR and \
            parts[2] == SKILL_FILE else None

    def expected(self, snapshot: Snapshot) -> dict[str, str]:
        return {p.split("/")[1]: h for p, h in snapshot.files(f"{SKILLS_DIR}/").items()
                if self.key_of(p)}

    def document(self, snapshot: Snapshot, key: str) -> Document | None:
        path = f"{SKILLS_DIR}/{key}/{SKILL_FILE}"
        digest = snapshot.hash_of(path)
        if digest is None:
            return None
        try:
            parsed = parse_skill_md(snapshot.read_text(path), path=path, folder=key)
        except UnicodeDecodeError:
            return None
        if parsed.skill is None or parsed.problems:
            return None
        s = parsed.skill
        return Document(self.kind, key, skill_document_text(s.name, s.description), digest,
                        {"name": s.name, "description": s.description, "path": path})


def _state_of(text: str) -> dict[str, Any] | None:
    """state.json's object; None for a file that is not one (torn by hand, or empty)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


class LibraryIndex:
    """chromadb collections over a library's documents, kept in step with its versions."""

    def __init__(self, library: Library, embedder: Embedder | None = None, *,
                 sources: Sequence[DocumentSource] | None = None, path: Path | None = None,
                 batch_size: int = 256, lock_timeout: float = 300.0,
                 exact_max: int = EXACT_MAX) -> None:
        self.library = library
        self.exact_max = exact_max
        self.embedder: Embedder = embedder if embedder is not None else skill_embedder()
        self.sources = {s.kind: s for s in (sources or [SkillSource()])}
        self.path = Path(path) if path else library.root / "index"
        self.batch_size = batch_size
        self.lock_timeout = lock_timeout
        self._shared: SharedChroma | None = None
        self._hold = threading.Lock()  # guards _shared and _collections
        self._collections: dict[str, SharedCollection] = {}
        # kind -> (state token, ids, unit vectors, metadatas, rank of each id by key): the
        # documents of a small kind, for exact ranking in memory
        self._tables: dict[str, tuple[Any, ...]] = {}
        self._state = FileMemo(self.path / "state.json", _state_of)

    # -- state ------------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    def state(self) -> dict[str, Any] | None:
        """What the index was last synced to: version, root, token, pending, counts (a
        copy). Read again only when the file changed: every write replaces it (a new inode
        and new times), and a server asks for it on every query."""
        try:
            data = self._state.get()
        except FileNotFoundError:
            return None
        return dict(data) if data is not None else None

    def _write_state(self, **state: Any) -> None:
        atomic_write(self.state_path, json.dumps(state).encode("utf-8"),
                     tmp_dir=self.path / ".tmp", durable=False)

    # -- chromadb ---------------------------------------------------------------------------

    def _open(self) -> SharedChroma:
        """This process's one client of the index folder, shared with every other holder
        and thread (``whetstone.library_store.chroma_client``: chromadb cannot open one path from two
        threads at once)."""
        with self._hold:
            if self._shared is None:
                self.path.mkdir(parents=True, exist_ok=True)
                self._shared = acquire(self.path / "chroma")
            return self._shared

    def _collection(self, kind: str) -> SharedCollection:
        col = self._collections.get(kind)
        if col is None:
            embed = chroma_embedding_function(
                self.embedder if isinstance(self.embedder, TextEmbedder) else None)

            def create(client: Any) -> Any:
                return client.get_or_create_collection(
                    f"whetstone-{kind}", embedding_function=embed,
                    configuration={"hnsw": {"space": "cosine"}}, metadata={"kind": kind})

            col = self._collections[kind] = SharedCollection(self._open(), f"whetstone-{kind}",
                                                             create)
        return col

    def close(self) -> None:
        """Let go of the shared client (the last holder closes it). Safe to call twice."""
        with self._hold:
            shared, self._shared = self._shared, None
            self._collections = {}
            self._tables = {}
        if shared is not None:
            release(shared)

    def _wipe(self) -> None:
        self._open().wipe()
        self._tables = {}
        self.state_path.unlink(missing_ok=True)

    # -- syncing ----------------------------------------------------------------------------

    def _lock(self) -> FileLock:
        self.path.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.path / ".lock"), timeout=self.lock_timeout)

    def ensure(self, snapshot: Snapshot | None = None) -> str:
        """Make the index match ``snapshot`` (the current version by default); returns its id.

        Cheap when it already matches (two small file reads).
        """
        snap = snapshot or self.library.snapshot()
        state = self.state()
        if self._fresh(state, snap):
            return snap.id
        lock = self._lock()
        try:
            lock.acquire()
        except Timeout as exc:
            raise LibraryError(f"the index at {self.path} is locked by another process",
                               hint="wait for it, or run `whetstone library reindex`") from exc
        try:
            clean_dir(self.path / ".tmp")
            state = self.state()  # another process may have synced while we waited
            if self._fresh(state, snap):
                return snap.id
            try:
                self._sync_locked(state, snap)
            except WhetstoneError:
                raise
            except Exception:  # noqa: BLE001 - chromadb failed: the index is derived, rebuild it
                self._wipe()
                self._sync_locked(None, snap)
        finally:
            lock.release()
        return snap.id

    def _fresh(self, state: dict[str, Any] | None, snap: Snapshot) -> bool:
        if not state or state.get("pending") or state.get("root") != snap.root \
                or state.get("embedder") != self.embedder.name:
            return False
        # Another process re-synced: the vector graph this process holds is stale.
        self._open().refresh(state.get("token"))
        return True

    def _sync_locked(self, state: dict[str, Any] | None, snap: Snapshot) -> None:
        self._open().refresh((state or {}).get("token"))
        if state and state.get("embedder") != self.embedder.name:
            self._wipe()
            state = None
        old_root: str | None = state.get("root") if state else None
        clean = state is not None and not state.get("pending") and old_root is not None \
            and self.library.blobs.has(old_root)
        self._write_state(version=(state or {}).get("version"), root=old_root,
                          pending=snap.root, token=uuid.uuid4().hex, embedder=self.embedder.name,
                          counts=(state or {}).get("counts", {}))
        if clean and old_root is not None:
            changed = list(self.library.trees.diff(old_root, snap.root))
            for kind, source in self.sources.items():
                keys = {k for k in map(source.key_of, changed) if k is not None}
                self._apply(kind, snap, sorted(keys))
        else:
            for kind in self.sources:
                self._sync_full(kind, snap)
        counts = {kind: self._collection(kind).count() for kind in self.sources}
        token = uuid.uuid4().hex
        self._write_state(version=snap.id, root=snap.root, pending=None, token=token,
                          embedder=self.embedder.name, counts=counts)
        self._open().token = token  # our own writes: the shared client reflects them

    def _indexed(self, kind: str, page: int = 5000) -> dict[str, str]:
        """id -> source hash of every indexed document (paged: chromadb's SQLite refuses
        one query over ~100k ids)."""
        col, out, offset = self._collection(kind), {}, 0
        while True:
            got = col.get(include=["metadatas"], limit=page, offset=offset)
            out.update({i: (m or {}).get("hash", "") for i, m in zip(got["ids"],
                                                                     got["metadatas"], strict=False)})
            if len(got["ids"]) < page:
                return out
            offset += page

    def _sync_full(self, kind: str, snap: Snapshot) -> None:
        expected = self.sources[kind].expected(snap)
        indexed = self._indexed(kind)
        stale = [k for k, h in expected.items() if indexed.get(k) != h]
        gone = [k for k in indexed if k not in expected]
        self._apply(kind, snap, stale + gone)

    def _apply(self, kind: str, snap: Snapshot, keys: Sequence[str]) -> None:
        """Re-index ``keys`` from ``snap``: upsert the ones present and well-formed, delete
        the rest."""
        if not keys:
            return
        source, col = self.sources[kind], self._collection(kind)
        docs: list[Document] = []
        drop: list[str] = []
        for key in keys:
            doc = source.document(snap, key)
            (docs.append(doc) if doc is not None else drop.append(key))
        if drop:
            col.delete(ids=drop)
        for start in range(0, len(docs), self.batch_size):
            self._upsert(col, docs[start:start + self.batch_size])

    def _upsert(self, col: Any, docs: Sequence[Document], vectors: np.ndarray | None = None
                ) -> None:
        if vectors is None:
            vectors = self.embedder.embed([d.text for d in docs])
        col.upsert(ids=[d.key for d in docs], embeddings=vectors,
                   documents=[d.text for d in docs],
                   metadatas=[{**d.metadata, "kind": d.kind, "hash": d.hash} for d in docs])

    def rebuild(self, snapshot: Snapshot | None = None) -> dict[str, int]:
        """Drop the index and build it again from the files; returns documents per kind."""
        snap = snapshot or self.library.snapshot()
        lock = self._lock()
        with lock:
            clean_dir(self.path / ".tmp")
            self._wipe()
            shutil.rmtree(self.path / "pinned", ignore_errors=True)
            self._sync_locked(None, snap)
        return dict((self.state() or {}).get("counts", {}))

    # -- other versions ---------------------------------------------------------------------

    def pinned(self, snapshot: Snapshot) -> LibraryIndex:
        """An index of its own for a version this index does not follow (an old version or a
        candidate being scored), so the shared index never flips between versions.

        It lives in ``<index>/pinned/<tree root>`` and starts as a copy of this index, so only
        the files that differ are embedded. The caller closes it; ``clear_pinned`` deletes all.
        """
        path = self.path / "pinned" / snapshot.root[:24]
        if not (path / "state.json").exists():
            with self._lock():
                if not (path / "state.json").exists():
                    tmp = self.path / ".tmp" / f"pinned-{uuid.uuid4().hex[:8]}"
                    if (self.path / "chroma").exists():
                        shutil.copytree(self.path / "chroma", tmp / "chroma")
                    tmp.mkdir(parents=True, exist_ok=True)
                    if self.state_path.exists():
                        shutil.copy(self.state_path, tmp / "state.json")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    shutil.rmtree(path, ignore_errors=True)
                    tmp.replace(path)
        index = LibraryIndex(self.library, self.embedder, sources=list(self.sources.values()),
                             path=path, batch_size=self.batch_size,
                             lock_timeout=self.lock_timeout, exact_max=self.exact_max)
        index.ensure(snapshot)
        return index

    def clear_pinned(self) -> int:
        """Delete the indexes of pinned versions; returns how many there were."""
        folder = self.path / "pinned"
        if not folder.exists():
            return 0
        with self._lock():
            n = sum(1 for _ in folder.iterdir())
            shutil.rmtree(folder, ignore_errors=True)
        return n

    # -- reading ----------------------------------------------------------------------------

    def check(self, snapshot: Snapshot | None = None) -> list[str]:
        """Every difference between the index and a version's files ([] when they match)."""
        snap = snapshot or self.library.snapshot()
        problems: list[str] = []
        state = self.state()
        if not state or state.get("root") != snap.root or state.get("pending"):
            problems.append(f"index state is {state!r}, not synced to {snap.id}")
        for kind, source in self.sources.items():
            expected = source.expected(snap)
            indexed = self._indexed(kind)
            for key, digest in expected.items():
                if indexed.get(key) != digest and source.document(snap, key) is not None:
                    problems.append(f"{kind} {key}: indexed {indexed.get(key)!r}, "
                                    f"files hold {digest}")
            for key in indexed:
                if key not in expected:
                    problems.append(f"{kind} {key}: indexed but not in {snap.id}")
                elif source.document(snap, key) is None:
                    problems.append(f"{kind} {key}: indexed but malformed in {snap.id}")
        return problems

    def embed_query(self, text: str) -> np.ndarray:
        """The query vector for ``text``, shape ``(dim,)``."""
        return self.embedder.embed([text])[0]

    def query(self, vector: np.ndarray, *, kind: str = "skill", k: int = 5) -> list[Hit]:
        """The ``k`` nearest documents of ``kind``. Call ``ensure`` first for a given version."""
        if kind not in self.sources:
            raise ValidationError(kind, "index-kind", f"no documents of kind {kind!r}",
                                  hint=f"kinds: {', '.join(self.sources)}")
        state = self.state() or {}
        count = int((state.get("counts") or {}).get(kind, 0))
        if count == 0 or k <= 0:
            return []
        if count <= self.exact_max:
            return self._exact(kind, vector, k, state.get("token"))
        got = self._collection(kind).query(query_embeddings=[np.asarray(vector, np.float32)],
                                           n_results=min(k, count),
                                           include=["metadatas", "distances"])
        return [Hit(kind, key, 1.0 - float(dist), (meta or {}).get("hash", ""), dict(meta or {}))
                for key, dist, meta in zip(got["ids"][0], got["distances"][0],
                                           got["metadatas"][0], strict=False)]

    def _exact(self, kind: str, vector: np.ndarray, k: int, token: str | None) -> list[Hit]:
        """Every document scored against ``vector`` in memory: exact where the HNSW graph is
        approximate, and ~0.05 ms instead of chromadb's ~1.7 ms a query at a few dozen skills
        (measured). The vectors are read from the collection once per sync (``token``)."""
        table = self._tables.get(kind)
        if table is None or table[0] != token or token is None:
            col, ids, rows, metas, offset = self._collection(kind), [], [], [], 0
            while True:  # paged, as in _indexed
                got = col.get(include=["embeddings", "metadatas"], limit=5000, offset=offset)
                ids += got["ids"]
                rows += list(got["embeddings"])
                metas += [dict(m or {}) for m in got["metadatas"]]
                if len(got["ids"]) < 5000:
                    break
                offset += 5000
            matrix = np.asarray(rows, dtype=np.float32).reshape(len(ids), -1)
            matrix /= np.clip(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12, None)
            by_key = np.argsort(np.asarray(ids, dtype=object)).argsort() if ids else \
                np.zeros(0, dtype=np.int64)
            table = (token, ids, matrix, metas, by_key)
            self._tables[kind] = table
        _, ids, matrix, metas, by_key = table
        if not ids:
            return []
        v = np.asarray(vector, np.float32).reshape(-1)
        scores = matrix @ (v / max(float(np.linalg.norm(v)), 1e-12))
        # Highest score first; equal scores by key, so the order never depends on storage.
        order = np.lexsort((by_key, -scores))[:k]
        return [Hit(kind, ids[i], float(scores[i]), str(metas[i].get("hash", "")),
                    dict(metas[i])) for i in order]
