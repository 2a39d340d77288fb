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


def passed_gate(scores: Mapping[str, Any]) -> bool:
    """Whether a write's scores hold a gate decision that accepted it, and no mark that it
    went live without one (a candidate applied by hand keeps its rejected decision)."""
    gate = scores.get("gate")
    return isinstance(gate, Mapping) and gate.get("accepted") is True and "ungated" not in scores


def gate_record(m: Manifest) -> dict[str, Any]:
    """How a version came to be: ``gated`` True (a gate accepted it: its ``rule``, ``tasks``
    (the task set), ``n_tasks``, ``verdict`` and ``difference``), False (it went live
    unmeasured: ``by`` which command, ``note``; a version made before writes recorded this says
    ``by`` its method), or None for the first, empty version (the library as it started)."""
    if m.parent is None and m.method == "init":
        return {"gated": None, "note": "the empty library it started as"}
    gate = m.scores.get("gate")
    if passed_gate(m.scores) and isinstance(gate, Mapping):
        return {"gated": True, "rule": gate.get("rule"), "tasks": gate.get("task_set"),
                "n_tasks": gate.get("n_tasks"), "verdict": gate.get("verdict"),
                "difference": gate.get("difference"), "decision": "accepted"}
    ungated = m.scores.get("ungated")
    if isinstance(ungated, Mapping):
        return {"gated": False, "by": ungated.get("by"), "note": ungated.get("note"),
                "decision": "ungated"}
    return {"gated": False, "by": m.method, "note": "no gate ran (made before writes recorded "
            "it, or through the Python API)", "decision": "ungated"}
