"""Change control on the store: which writes a library lets through, and which versions passed
a gate.

``library.json``'s ``require_gate: true`` (``whetstone library config require_gate true``)
makes every write that holds no passing gate decision refuse (``GateRequired``); the store
checks it on every commit, whatever face made it, and the faces check first to name the
command to run. The change sets of the writes a face gates (hand edits, a rollback, a
candidate) are read here, so the face can score them before they land.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from whetstone.engine.errors import GateRequired
from whetstone.library_store.manifest import Manifest, gate_record, passed_gate

if TYPE_CHECKING:
    from whetstone.library_store.store import Library

SETTING = "require_gate"


def requires_gate(library: Library) -> bool:
    """Whether the library's ``library.json`` sets ``require_gate`` to true."""
    return library.settings().get(SETTING) is True


def check_gated(library: Library, scores: Mapping[str, Any] | None, *,
                what: str = "this write", hint: str | None = None) -> None:
    """``GateRequired`` when the library requires a gate and ``scores`` hold no decision that
    accepted the change."""
    if not requires_gate(library) or passed_gate(scores or {}):
        return
    raise GateRequired(
        f"{what} refused: the library at {library.root} requires a gate ({SETTING}), and "
        "no gate accepted it",
        hint=hint or "run the write with held-out tasks: --gate-tasks SET@dev (e.g. "
                     "`whetstone library commit -m MSG --gate-tasks gsm8k@dev:0:30`), or turn "
                     f"the setting off: `whetstone library config {SETTING} false`")


def newest_gated(library: Library) -> Manifest:
    """The newest version a gate accepted, from the current one back; the first, empty version
    when none was."""
    versions = library.log()
    for m in versions:
        if gate_record(m)["gated"]:
            return m
    return versions[-1]


def rollback_changes(library: Library, ref: str) -> dict[str, bytes | None]:
    """The change that makes the current version's files equal ``ref``'s (contents)."""
    target = library.manifest(ref)
    current = library.manifest()
    return {p: (library.blobs.get(new) if new is not None else None)
            for p, (_, new) in library.trees.diff(current.root, target.root).items()}


def candidate_changes(library: Library, name: str) -> dict[str, bytes | None]:
    """A kept candidate's change on top of the current version (contents)."""
    cand = library.candidates.get(name)
    snap = library.snapshot()
    return {p: (library.blobs.get(h) if h is not None else None)
            for p, h in cand.changes.items() if snap.hash_of(p) != h}


def view_changes(library: Library) -> tuple[dict[str, bytes | None], str]:
    """The hand edits under the view's folders as a change, and the version they edit."""
    snap = library.snapshot()
    edits = library.view.edits(snap.root)
    changes: dict[str, bytes | None] = {p: library.view.read(p)
                                        for p in edits.modified + edits.added}
    changes.update({p: None for p in edits.deleted})
    return changes, snap.id
