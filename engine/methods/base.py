"""What every evolver returns: a ``LibraryPatch`` — file changes plus the evidence behind them.

Contract (DESIGN.md): ``fit(traces, library, analyst, labels=None) -> LibraryPatch``; the caller
runs the regression gate and commits the patch as a new library version (or keeps it as a
named candidate). Methods never write to the library themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LibraryPatch:
    """``changes`` maps library-relative paths to new text (None deletes the file)."""

    method: str
    changes: Mapping[str, str | None]
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    costs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.changes

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "changes": dict(self.changes), "message": self.message,
                "details": dict(self.details), "costs": dict(self.costs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LibraryPatch:
        return cls(d["method"], dict(d["changes"]), d.get("message", ""),
                   dict(d.get("details") or {}), dict(d.get("costs") or {}))
