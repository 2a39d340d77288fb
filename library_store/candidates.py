"""Named candidates: changes the regression gate rejected, kept to inspect or apply by hand.

A candidate is a change set (path -> content hash, None deletes) recorded against the version
it was prepared on (its base), with the gate's scores and costs. Its contents live in the
blob store, so nothing is lost; ``apply`` commits it on top of the current version and refuses
when a file it touches changed since the base (unless forced).
"""

from __future__ import annotations

import builtins
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.errors import LibraryError, NotFound, ValidationError
from ..engine.types import LibraryVersion
from .paths import Content, check_path, to_bytes

if TYPE_CHECKING:  # the store owns its candidates; this module never imports it at run time
    from .store import Library, Snapshot
    from .validation import Validate

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")  # use fullmatch: '$' allows a final '\n'


@dataclass(frozen=True)
class Candidate:
    """A kept change: what it changes, what it was based on, and how the gate scored it."""

    name: str
    base: str
    created: float
    method: str
    message: str = ""
    changes: Mapping[str, str | None] = field(default_factory=dict)  # path -> sha256 | None
    scores: Mapping[str, Any] = field(default_factory=dict)
    costs: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "created": self.created,
                "method": self.method, "message": self.message, "changes": dict(self.changes),
                "scores": dict(self.scores), "costs": dict(self.costs)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        return cls(name=d["name"], base=d["base"], created=d["created"], method=d["method"],
                   message=d.get("message", ""), changes=d.get("changes") or {},
                   scores=d.get("scores") or {}, costs=d.get("costs") or {})


class Candidates:
    """The candidates of one library, in ``<library>/candidates/<name>.json`` (or the store's
    ``candidates`` table: ``Library.backing``)."""

    def __init__(self, library: Library) -> None:
        self.library = library
        self.dir = library.root / "candidates"

    def _path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def _where(self, name: str) -> str:
        lib = self.library
        return str(self._path(name)) if lib.store is None else f"{name} in {lib.where}"

    def save(self, name: str | None, changes: Mapping[str, Content], *, method: str,
             message: str = "", scores: Mapping[str, Any] | None = None,
             costs: Mapping[str, Any] | None = None, base: str | None = None) -> Candidate:
        """Keep a change set under ``name`` (default: ``<method>-<time>``); replaces a namesake."""
        lib = self.library
        name = name or f"{re.sub(r'[^a-z0-9]+', '-', method.lower()).strip('-') or 'change'}-" \
                       f"{time.strftime('%Y%m%d-%H%M%S')}"
        if not NAME_RE.fullmatch(name):
            raise ValidationError(name, "candidate-name", "a candidate name is 1-100 characters "
                                  "of a-z, 0-9, '.', '_' and '-', starting with a letter or digit")
        data = {check_path(p, deleting=v is None, roots=lib.roots): to_bytes(p, v)
                for p, v in changes.items()}
        base = lib.resolve(base)
        with lib._write_lock():
            hashes = {p: (lib.blobs.put(b) if b is not None else None) for p, b in data.items()}
            cand = Candidate(name=name, base=base, created=time.time(), method=method,
                             message=message, changes=hashes, scores=dict(scores or {}),
                             costs=dict(costs or {}))
            payload = json.dumps(cand.to_dict(), indent=1, ensure_ascii=False, default=str)
            lib.backing.save_candidate(name, payload.encode("utf-8"), cand.created)
        return cand

    def list(self) -> list[Candidate]:
        """All candidates, oldest first."""
        found = []
        for record in self.library.backing.candidates():
            try:
                found.append(Candidate.from_dict(json.loads(record.decode("utf-8"))))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
                continue  # a damaged record is skipped; `get` reports it by name
        return sorted(found, key=lambda c: c.created)

    def get(self, name: str) -> Candidate:
        try:
            record = self.library.backing.candidate(name)
            return Candidate.from_dict(json.loads(record.decode("utf-8")))
        except FileNotFoundError as exc:
            known = ", ".join(c.name for c in self.list()) or "none"
            raise NotFound(f"no candidate named {name!r}", hint=f"candidates: {known}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise LibraryError(f"candidate record {self._where(name)} is damaged: {exc}",
                               hint="delete it with `whetstone library candidates drop`") from exc

    def _target(self, cand: Candidate) -> dict[str, str | None]:
        """The candidate's changes on top of the current version, minus the no-ops."""
        snap = self.library.snapshot()
        return {p: h for p, h in cand.changes.items() if snap.hash_of(p) != h}

    def snapshot(self, name: str) -> Snapshot:
        """The current version with the candidate applied, read-only (to score it again)."""
        cand = self.get(name)
        return self.library._preview(dict(cand.changes), {}, label=f"candidate-{name}",
                                     method=cand.method)

    # builtins.list: in the class body ``list`` is the method above.
    def conflicts(self, name: str, now: Snapshot | None = None) -> builtins.list[str]:
        """Paths the candidate changes that also changed between its base and ``now`` (by
        default the current version)."""
        lib = self.library
        cand = self.get(name)
        base, now = lib.snapshot(cand.base), now or lib.snapshot()
        return sorted(p for p, h in cand.changes.items()
                      if base.hash_of(p) != now.hash_of(p) and now.hash_of(p) != h)

    def diff(self, name: str, *, context: int = 3) -> str:
        """A unified diff from the current version to the current version plus the candidate."""
        lib = self.library
        cand = self.get(name)
        snap = lib.snapshot()
        pairs = {p: (snap.hash_of(p), h) for p, h in self._target(cand).items()}
        return lib.format_diff(pairs, snap.id, f"candidate {cand.name}", context=context)

    def apply(self, name: str, *, validate: Validate = True, force: bool = False,
              message: str | None = None, scores: Mapping[str, Any] | None = None,
              expect_parent: str | None = None) -> LibraryVersion:
        """Commit a candidate on top of the current version, checked by the library's
        validator unless ``validate`` says otherwise; then it is removed. The version keeps
        the candidate's scores, and ``scores`` beside them (``ungated``: applied by hand).
        ``expect_parent``: only on that version (a canary measured against it)."""
        lib = self.library
        cand = self.get(name)
        checked = lib.snapshot()
        if expect_parent is not None and checked.id != expect_parent:
            raise LibraryError(f"the library moved from {expect_parent} to {checked.id}; "
                               f"candidate {name} was measured against {expect_parent}",
                               hint="measure it again against the current version")
        clashes = self.conflicts(name, checked)
        if clashes and not force:
            raise LibraryError(
                f"candidate {name} was prepared on {cand.base}; since then "
                f"{', '.join(clashes[:5])}{' ...' if len(clashes) > 5 else ''} changed",
                hint="review `whetstone library candidates show` and apply with --force")
        try:
            # The check above ran outside the writers' lock: commit only onto the version it
            # checked, so a write landing in between is never silently overwritten.
            version = lib._commit({}, prehashed=dict(cand.changes), method=cand.method,
                                  message=message or f"apply candidate {name}: {cand.message}",
                                  scores={**cand.scores, **dict(scores or {})},
                                  costs=cand.costs,
                                  validate=lib.validator_for(validate),
                                  expect_parent=checked.id)
        except LibraryError as exc:
            now = lib.current_id()
            if isinstance(exc, ValidationError) or now == checked.id:
                raise
            raise LibraryError(
                f"another writer made {now} while candidate {name} was checked against "
                f"{checked.id}; nothing was applied",
                hint="run `whetstone library candidates apply` again to re-check its "
                     "conflicts against the new version") from exc
        with lib._write_lock():
            lib.backing.drop_candidate(name)
        return version

    def drop(self, name: str) -> None:
        """Forget a candidate (its contents stay in the blob store)."""
        self.get(name)
        with self.library._write_lock():
            self.library.backing.drop_candidate(name)
