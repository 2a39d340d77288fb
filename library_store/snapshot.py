"""``Snapshot``: one library version, read-only (kept apart from ``store.py``, which makes
them; import it from either)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..engine.errors import NotFound
from ..engine.types import LibraryVersion
from .manifest import Manifest

if TYPE_CHECKING:
    from .store import Library


@dataclass(frozen=True)
class Snapshot:
    """One version, read-only. Everything read through a snapshot comes from that version."""

    library: Library = field(repr=False)
    manifest: Manifest

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def root(self) -> str:
        return self.manifest.root

    @property
    def version(self) -> LibraryVersion:
        """The version's record (without its file map; see ``files``)."""
        return self.manifest.to_version()

    def files(self, prefix: str = "") -> dict[str, str]:
        """path -> sha256 of the files under ``prefix`` (all files by default)."""
        return self.library.trees.files(self.root, prefix)

    def has(self, prefix: str) -> bool:
        """Whether any file path starts with ``prefix`` (``has("skills/")``); cheap at any size."""
        return self.library.trees.any_under(self.root, prefix)

    def hash_of(self, path: str) -> str | None:
        return self.library.trees.lookup(self.root, path)

    def exists(self, path: str) -> bool:
        return self.hash_of(path) is not None

    def read_bytes(self, path: str) -> bytes:
        digest = self.hash_of(path)
        if digest is None:
            raise NotFound(f"{path} is not in library version {self.id}",
                           hint="`whetstone library ls` lists what the library holds")
        return self.library.blobs.get(digest)

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def texts(self, prefix: str = "") -> dict[str, str]:
        """path -> text of the UTF-8 files under ``prefix`` (binary files are left out)."""
        out: dict[str, str] = {}
        for path, digest in self.files(prefix).items():
            try:
                out[path] = self.library.blobs.get(digest).decode("utf-8")
            except UnicodeDecodeError:
                continue
        return out

    def children(self, folder: str) -> list[str]:
        """Names of the entries directly under ``folder`` (``children("skills")``: skill names)."""
        prefix = folder.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/", 1)[0] for p in self.files(prefix)})

    def unit(self, unit: str) -> dict[str, str]:
        """The files of one unit (``skills/<name>``), read from a single tree bucket."""
        return self.library.trees.group(self.root, unit)
