"""Content-addressed blob storage: every file content and tree object, stored once by sha256.

Blobs are immutable and never rewritten, so a reader holding a hash can always read it while
writers add new versions beside it. Unchanged files are shared by every version that holds them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path

from ..engine.errors import LibraryError
from .fsutil import atomic_write, make_dirs, sha256_bytes


class BlobStore:
    """Blobs under ``root/<first two hex>/<rest>``; temp files go to ``tmp_dir``."""

    def __init__(self, root: Path, tmp_dir: Path, *, durable: bool = True) -> None:
        self.root = Path(root)
        self.tmp_dir = Path(tmp_dir)
        self.durable = durable

    def path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def has(self, digest: str) -> bool:
        return self.path(digest).exists()

    def put(self, data: bytes) -> str:
        """Store ``data`` (idempotent) and return its sha256."""
        digest = sha256_bytes(data)
        target = self.path(digest)
        if not target.exists():
            make_dirs(target.parent, durable=self.durable)
            atomic_write(target, data, tmp_dir=self.tmp_dir, durable=self.durable)
        return digest

    def get(self, digest: str) -> bytes:
        """The bytes of a blob; a missing blob means the library was damaged by hand."""
        try:
            return self.path(digest).read_bytes()
        except FileNotFoundError as exc:
            raise LibraryError(
                f"blob {digest[:12]} is missing from {self.root}",
                hint="the library was changed outside Whetstone; restore it from a backup or "
                     "an export (`whetstone library import`)",
            ) from exc

    def verify(self, digest: str) -> bool:
        """True when the blob exists and its content still hashes to its name."""
        try:
            return sha256_bytes(self.path(digest).read_bytes()) == digest
        except FileNotFoundError:
            return False


def unified_diff(blobs: BlobStore, pairs: Mapping[str, tuple[str | None, str | None]],
                 label_a: str, label_b: str, *, context: int = 3) -> str:
    """Unified diff text for path -> (hash before, hash after) pairs of blobs in ``blobs``."""
    chunks: list[str] = []
    for path, (ha, hb) in sorted(pairs.items()):
        da = blobs.get(ha) if ha else b""
        db = blobs.get(hb) if hb else b""
        try:
            ta, tb = da.decode("utf-8"), db.decode("utf-8")
        except UnicodeDecodeError:
            chunks.append(f"Binary file {path} differs ({label_a} -> {label_b})\n")
            continue
        lines = difflib.unified_diff(
            ta.splitlines(keepends=True), tb.splitlines(keepends=True),
            fromfile=f"a/{path} ({label_a})" if ha else "/dev/null",
            tofile=f"b/{path} ({label_b})" if hb else "/dev/null", n=context)
        chunks.append("".join(line if line.endswith("\n") else line + "\n\\ No newline at "
                              "end of file\n" for line in lines))
    return "".join(chunks)
