"""A version's manifest: ``versions/vN.json``, small and human-readable.

It holds the version's history (parent, time, method, message), the gate's scores and costs,
counts of what changed, and the root of its file tree (path -> sha256, see tree.py), so the
manifest stays a few hundred bytes however large the library grows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from whetstone.engine.errors import NotFound
from whetstone.engine.types import LibraryVersion

FORMAT = 1


@dataclass(frozen=True)
class Manifest:
    """What ``versions/vN.json`` holds. ``root`` addresses the version's file tree."""

    id: str
    parent: str | None
    created: float
    method: str
    message: str
    root: str
    scores: Mapping[str, Any] = field(default_factory=dict)
    costs: Mapping[str, Any] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)  # files, added, modified, deleted

    @property
    def number(self) -> int:
        return version_number(self.id)

    def to_json(self) -> bytes:
        d = {"format": FORMAT, "id": self.id, "parent": self.parent, "created": self.created,
             "method": self.method, "message": self.message, "root": self.root,
             "scores": dict(self.scores), "costs": dict(self.costs), "counts": dict(self.counts)}
        return json.dumps(d, indent=1, ensure_ascii=False, default=str).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        d = json.loads(data)
        return cls(id=d["id"], parent=d.get("parent"), created=d["created"], method=d["method"],
                   message=d.get("message", ""), root=d["root"], scores=d.get("scores") or {},
                   costs=d.get("costs") or {}, counts=d.get("counts") or {})

    def to_version(self, files: Mapping[str, str] | None = None) -> LibraryVersion:
        return LibraryVersion(id=self.id, parent=self.parent, created=self.created,
                              method=self.method, message=self.message, files=dict(files or {}),
                              scores=dict(self.scores), costs=dict(self.costs))


_VERSION_RE = re.compile(r"v([0-9]{1,18})")  # ASCII digits only: '²'.isdigit() is True


def version_number(vid: str) -> int:
    """``"v12"`` -> 12; ``NotFound`` for anything else."""
    m = _VERSION_RE.fullmatch(vid) if isinstance(vid, str) else None
    if m is None:
        raise NotFound(f"{vid!r} is not a version id", hint="versions look like v1, v2, ...")
    return int(m.group(1))
