"""The human-readable copy of the current version: ``<library>/skills`` and ``<library>/policies``.

The versions (manifests + blobs) are the truth; this folder is derived from them so a person can
read, diff and ``git add`` plain files. It is updated after each commit's atomic switch, under
the writers' lock. A marker records the tree it shows; a writer killed between the switch and
the marker is repaired by the next writer or opener from the difference of the two trees.

Files a person edited by hand are never silently lost: when a new version changes such a file,
the hand-edited copy is moved to ``.state/stash/<time>/`` first. ``edits`` lists hand edits so
``Library.commit_view`` can turn them into a version.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..engine.errors import LibraryError
from .blobs import BlobStore
from .fsutil import atomic_write, remove_empty_parents, sha256_bytes
from .paths import shown
from .tree import Trees

IGNORED_SUFFIXES = ("~", ".swp", ".swo", ".tmp")


class ViewError(LibraryError):
    """Some files of the view could not be written; the versions themselves are intact."""

    def __init__(self, version: str, failures: list[tuple[str, OSError]],
                 stashed: list[str]) -> None:
        self.version = version
        self.failures = failures
        self.stashed = stashed
        first, exc = failures[0]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        super().__init__(
            f"the view of {version} could not be written: {shown(first, 120)}{more}: "
            f"{exc.strerror or exc}",
            hint="the versions are intact; `whetstone library rollback VERSION` makes a "
                 "version without the file, or fix the cause (disk space, permissions) and "
                 "run `whetstone library repair`")

    @property
    def paths(self) -> list[str]:
        return [p for p, _ in self.failures]


@dataclass(frozen=True)
class ViewEdits:
    """How the view differs from a version: paths relative to the library root."""

    modified: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.modified or self.added or self.deleted)

    def to_dict(self) -> dict[str, list[str]]:
        return {"modified": list(self.modified), "added": list(self.added),
                "deleted": list(self.deleted)}


class View:
    """Keeps the view folders equal to one tree. Callers hold the writers' lock for writes."""

    def __init__(self, root: Path, roots: tuple[str, ...], blobs: BlobStore, trees: Trees,
                 state_dir: Path, tmp_dir: Path) -> None:
        self.root = root
        self.roots = roots
        self.blobs = blobs
        self.trees = trees
        self.state_dir = state_dir
        self.tmp_dir = tmp_dir
        self.marker_path = state_dir / "view.json"

    def marker(self) -> dict[str, str] | None:
        """``{"version", "root"}`` of the tree the view shows, or None when unknown."""
        try:
            data = json.loads(self.marker_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data if isinstance(data, dict) and "root" in data else None

    def _write_marker(self, version: str, root: str) -> None:
        payload = json.dumps({"version": version, "root": root}).encode("utf-8")
        atomic_write(self.marker_path, payload, tmp_dir=self.tmp_dir, durable=False)

    def _in_view(self, path: str) -> bool:
        return path.split("/", 1)[0] in self.roots

    def _hash_on_disk(self, target: Path) -> str | None:
        try:
            return sha256_bytes(target.read_bytes()) if target.is_file() else None
        except OSError:
            return None

    def _stash(self, target: Path, rel: str, stash_id: str) -> None:
        dest = self.state_dir / "stash" / stash_id / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        target.replace(dest)

    def sync(self, old_root: str | None, new_root: str, version: str, *,
             write_marker: bool = True) -> list[str]:
        """Move the view from tree ``old_root`` to ``new_root``; returns stashed hand edits.

        ``old_root=None`` (marker lost) compares every file of the new tree with the disk; as
        what the view showed is unknown, every file that differs is stashed before it is
        replaced (a stash too many beats a hand edit lost).

        A file that cannot be written (a full disk, a name the file system refuses) does not
        stop the others; once all were tried, ``ViewError`` lists the failures and the marker
        is left as it was, so the next repair tries them again.
        """
        if old_root is None or not self.blobs.has(old_root):
            changes: dict[str, tuple[str | None, str | None]] = {
                p: (None, h) for p, h in self.trees.files(new_root).items()}
        else:
            changes = self.trees.diff(old_root, new_root)
        stash_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        stashed: list[str] = []
        failures: list[tuple[str, OSError]] = []
        for rel, (old_h, new_h) in changes.items():
            if not self._in_view(rel):
                continue
            try:
                self._sync_one(rel, old_h, new_h, stash_id, stashed)
            except OSError as exc:
                failures.append((rel, exc))
        if failures:
            raise ViewError(version, failures, stashed)
        if write_marker:
            self._write_marker(version, new_root)
        return stashed

    def _sync_one(self, rel: str, old_h: str | None, new_h: str | None, stash_id: str,
                  stashed: list[str]) -> None:
        target = self.root / rel
        on_disk = self._hash_on_disk(target)
        if on_disk == new_h:
            return  # already in place (e.g. a killed writer got this far)
        if on_disk is not None and on_disk != old_h:
            self._stash(target, rel, stash_id)
            stashed.append(rel)
        if new_h is None:
            target.unlink(missing_ok=True)
            remove_empty_parents(target, self.root)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, self.blobs.get(new_h), tmp_dir=self.tmp_dir, durable=False)

    def forget_marker(self) -> None:
        """Drop the marker: the next repair compares every file with the disk."""
        self.marker_path.unlink(missing_ok=True)

    def _walk(self) -> Iterator[str]:
        for top in self.roots:
            base = self.root / top
            if not base.is_dir():
                continue
            for path in base.rglob("*"):
                rel = path.relative_to(self.root).as_posix()
                if path.is_symlink() or not path.is_file():
                    continue
                if any(part.startswith(".") or part == "__pycache__" for part in rel.split("/")):
                    continue
                if rel.endswith(IGNORED_SUFFIXES):
                    continue
                yield rel

    def edits(self, root: str) -> ViewEdits:
        """Hand edits: view files that differ from tree ``root`` (hashes every file)."""
        tracked = {p: h for p, h in self.trees.files(root).items() if self._in_view(p)}
        on_disk = set(self._walk())
        modified = [p for p in sorted(on_disk & set(tracked))
                    if self._hash_on_disk(self.root / p) != tracked[p]]
        return ViewEdits(modified=tuple(modified),
                         added=tuple(sorted(on_disk - set(tracked))),
                         deleted=tuple(sorted(set(tracked) - on_disk)))

    def write_new(self, rel: str, data: bytes) -> Path:
        """Write a file no version holds (a draft, a hand edit): syncs leave it alone."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data, tmp_dir=self.tmp_dir, durable=False)
        return target

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()
