"""A version's file map (path -> sha256) stored as a two-level tree of blobs.

A flat map of 100,000 skills is ~10 MB of JSON; rewriting it on every commit would make a
one-line change cost O(library). Instead paths are grouped by their unit (``skills/<name>``
or ``policies/<file>``) and the groups hashed into 256 buckets: the root object maps bucket
-> bucket hash, and each bucket maps path -> file hash. A commit rewrites only the buckets
it touches plus the small root, and a diff only opens buckets whose hashes differ.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from .blobs import BlobStore

BUCKET_HEX = 2  # 256 buckets: ~400 skills per bucket at 100k skills


def group_of(path: str) -> str:
    """The unit a path belongs to: its first two components (``skills/pdf-tools``)."""
    parts = path.split("/", 2)
    return "/".join(parts[:2])


def bucket_of(path: str) -> str:
    return hashlib.sha256(group_of(path).encode("utf-8")).hexdigest()[:BUCKET_HEX]


def _encode(obj: Mapping[str, str]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


class Trees:
    """Reads and writes tree objects in a blob store, with a bounded cache of parsed objects.

    Parsed objects are shared between callers and must be treated as read-only.
    """

    def __init__(self, blobs: BlobStore, cache_size: int = 2048) -> None:
        self.blobs = blobs
        self._cache: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # The empty tree is known without touching the disk (constructors do no I/O).
        self.empty_root = hashlib.sha256(_encode({})).hexdigest()

    def _put(self, obj: Mapping[str, str]) -> str:
        digest = self.blobs.put(_encode(obj))
        self._remember(digest, dict(obj))
        return digest

    def _remember(self, digest: str, obj: dict[str, str]) -> None:
        with self._lock:
            self._cache[digest] = obj
            self._cache.move_to_end(digest)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def load(self, digest: str) -> dict[str, str]:
        """A root (bucket -> hash) or bucket (path -> hash) object. Read-only."""
        if digest == self.empty_root:
            return {}
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
                return hit
        obj = json.loads(self.blobs.get(digest))
        self._remember(digest, obj)
        return obj

    def lookup(self, root: str, path: str) -> str | None:
        """The file hash of ``path`` in the tree ``root``, or None."""
        bucket = self.load(root).get(bucket_of(path))
        return None if bucket is None else self.load(bucket).get(path)

    def group(self, root: str, group: str) -> dict[str, str]:
        """Every path of one unit (``skills/<name>``), from a single bucket."""
        bucket = self.load(root).get(bucket_of(group + "/x"))
        if bucket is None:
            return {}
        prefix = group + "/"
        return {p: h for p, h in self.load(bucket).items() if p == group or p.startswith(prefix)}

    def files(self, root: str, prefix: str = "") -> dict[str, str]:
        """All paths (under ``prefix``), sorted. Opens one bucket when the prefix names a unit."""
        parts = prefix.rstrip("/").split("/")
        if prefix and len(parts) >= 2:
            found = self.group(root, "/".join(parts[:2]))
            return dict(sorted((p, h) for p, h in found.items() if p.startswith(prefix)))
        out: dict[str, str] = {}
        for bucket in self.load(root).values():
            for p, h in self.load(bucket).items():
                if p.startswith(prefix):
                    out[p] = h
        return dict(sorted(out.items()))

    def any_under(self, root: str, prefix: str) -> bool:
        """Whether some path starts with ``prefix``; stops at the first bucket holding one."""
        return any(p.startswith(prefix) for b in self.load(root).values() for p in self.load(b))

    def count(self, root: str) -> int:
        return sum(len(self.load(b)) for b in self.load(root).values())

    def apply(self, root: str, changes: Mapping[str, str | None]) -> str:
        """A new root with ``changes`` (path -> hash, None deletes) applied; writes new objects."""
        buckets = dict(self.load(root))
        by_bucket: dict[str, dict[str, str | None]] = {}
        for path, digest in changes.items():
            by_bucket.setdefault(bucket_of(path), {})[path] = digest
        for key, edits in by_bucket.items():
            entries = dict(self.load(buckets[key])) if key in buckets else {}
            for path, digest in edits.items():
                if digest is None:
                    entries.pop(path, None)
                else:
                    entries[path] = digest
            if entries:
                buckets[key] = self._put(entries)
            else:
                buckets.pop(key, None)
        return self._put(buckets)

    def diff(self, a: str, b: str) -> dict[str, tuple[str | None, str | None]]:
        """Paths whose hash differs between trees ``a`` and ``b``: path -> (hash in a, in b)."""
        if a == b:
            return {}
        ra, rb = self.load(a), self.load(b)
        out: dict[str, tuple[str | None, str | None]] = {}
        for key in set(ra) | set(rb):
            ha, hb = ra.get(key), rb.get(key)
            if ha == hb:
                continue
            ea = self.load(ha) if ha else {}
            eb = self.load(hb) if hb else {}
            for path in set(ea) | set(eb):
                if ea.get(path) != eb.get(path):
                    out[path] = (ea.get(path), eb.get(path))
        return dict(sorted(out.items()))

    def objects(self, root: str) -> Iterable[str]:
        """The hashes of the tree objects themselves (root and buckets), for integrity checks."""
        yield root
        yield from self.load(root).values()

    def problems(self, root: str) -> list[str]:
        """Integrity problems of the tree ``root``: missing or corrupt blobs and tree objects."""
        problems = [f"tree object {d[:12]} is missing or corrupt" for d in self.objects(root)
                    if d != self.empty_root and not self.blobs.verify(d)]
        if problems:
            return problems
        return [f"{path}: content {digest[:12]} is missing or corrupt"
                for path, digest in self.files(root).items() if not self.blobs.verify(digest)]
