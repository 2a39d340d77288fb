"""What learning in production keeps in the library: the canary, the steps, the status.

A learner (``whetstone learn``) never makes a gated change current at once: it becomes a
**canary**, served to a share of conversations by every replica until live feedback says
promote or roll back. The canary is one small record, ``learning/canary.json``, replaced
atomically (a replica reads it on every request, a ``stat``, as it reads ``CURRENT``): its id
(``v3+canary-...``), the version it was gated against (its base), the root of its file tree
(the base plus the candidate's change, whose contents the kept candidate holds), the share,
and the gate's figures. Every step (a canary started, promoted, rolled back, expired,
abandoned, stopped by hand; an evolve the gate rejected, one whose change broke the library's
rules or whose gate runs failed, one that changed nothing) is one line of
``learning/steps.jsonl`` with its figures: ``library log`` shows them beside the versions,
``/metrics`` counts them. ``learning/status.json`` holds the learner's last comparison, for
people and ``/metrics``; nothing decides on it.

Writes of the canary and the steps happen under the library's writers' lock, after a
``fence`` the learner passes (its lease is still held: ``lease.py``), so a learner that lost
its lease while it was paused writes nothing. A store kept elsewhere (a database) implements
the same methods.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.errors import LibraryError
from .fsutil import FileMemo, atomic_write, make_dirs
from .manifest import Manifest
from .snapshot import Snapshot

if TYPE_CHECKING:  # the store owns its learning state; this module never imports it at run time
    from .store import Library

LEARNING_DIR = "learning"
STEPS = ("canary_started", "promoted", "rolled_back", "expired", "abandoned", "stopped",
         "gate_rejected", "refused", "no_change")
Fence = Callable[[], None]  # raises when the writer may no longer write (its lease is lost)


def _no_fence() -> None:
    return None


@dataclass(frozen=True)
class CanaryRecord:
    """The canary every replica routes a share of conversations to."""

    id: str  # "v3+canary-20261203-101500": the version id traces and headers carry
    base: str  # the version the gate compared it with; routed only while that is current
    root: str  # the canary's file tree (base + the candidate's change)
    candidate: str  # the kept candidate holding the change (promotion applies it)
    share: float
    started: float
    method: str
    message: str = ""
    holder: str = ""  # the learner that started it
    gate: Mapping[str, Any] = field(default_factory=dict)  # the gate's figures, in short

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gate"] = dict(self.gate)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CanaryRecord:
        share = float(d["share"])
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share {share} is not in (0, 1]")
        return cls(id=str(d["id"]), base=str(d["base"]), root=str(d["root"]),
                   candidate=str(d["candidate"]), share=share, started=float(d["started"]),
                   method=str(d.get("method", "")), message=str(d.get("message", "")),
                   holder=str(d.get("holder", "")), gate=dict(d.get("gate") or {}))


@dataclass(frozen=True)
class Step:
    """One step of learning in production, as ``learning/steps.jsonl`` keeps it."""

    step: str  # one of STEPS
    time: float
    base: str  # the current version when it happened
    canary: str | None = None
    version: str | None = None  # the version a promotion made
    holder: str = ""
    figures: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["figures"] = dict(self.figures)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        return cls(step=str(d["step"]), time=float(d["time"]), base=str(d["base"]),
                   canary=d.get("canary"), version=d.get("version"),
                   holder=str(d.get("holder", "")), figures=dict(d.get("figures") or {}),
                   note=str(d.get("note", "")))


def _parse_canary(text: str) -> CanaryRecord | None:
    try:
        return CanaryRecord.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return None  # a damaged record routes nothing; `library canary stop` removes it


class LearningState:
    """The learning files of one library (``<library>/learning/``)."""

    def __init__(self, library: Library) -> None:
        self.library = library
        self.dir = library.root / LEARNING_DIR
        self.canary_path = self.dir / "canary.json"
        self.steps_path = self.dir / "steps.jsonl"
        self.status_path = self.dir / "status.json"
        self._canary = FileMemo(self.canary_path, _parse_canary)

    # -- reading (cheap: a replica asks on every request) -----------------------------------

    def canary(self) -> CanaryRecord | None:
        """The running canary (None: none, or a damaged record)."""
        try:
            return self._canary.get()
        except FileNotFoundError:
            return None

    def canary_snapshot(self, record: CanaryRecord) -> Snapshot:
        """The canary's files, read-only, under its own id."""
        m = Manifest(id=record.id, parent=record.base, created=record.started,
                     method=record.method, message=record.message, root=record.root)
        return Snapshot(self.library, m)

    def steps(self) -> list[Step]:
        """Every step, oldest first (a torn or damaged line is skipped)."""
        try:
            text = self.steps_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out: list[Step] = []
        for line in text.splitlines():
            try:
                out.append(Step.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def status(self) -> dict[str, Any]:
        """The learner's last comparison and state ({} when none was written)."""
        try:
            data = json.loads(self.status_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    # -- writing (under the writers' lock, after the fence) ---------------------------------

    @contextlib.contextmanager
    def _locked(self, fence: Fence) -> Iterator[None]:
        lib = self.library
        with lib._write_lock():
            fence()
            make_dirs(self.dir, durable=lib.durable)
            yield

    def _append(self, step: Step) -> None:
        line = json.dumps(step.to_dict(), ensure_ascii=False, default=str) + "\n"
        with open(self.steps_path, "a", encoding="utf-8") as f:
            f.write(line)  # one write of a whole line: a crash leaves at worst a torn last line
            f.flush()

    def start_canary(self, record: CanaryRecord, step: Step, *, fence: Fence = _no_fence
                     ) -> None:
        """Make ``record`` the canary (refused while another one runs) and log ``step``."""
        with self._locked(fence):
            running = self.canary()
            if running is not None:
                raise LibraryError(f"canary {running.id} is still running",
                                   hint="wait for the learner to decide it, or end it: "
                                        "`whetstone library canary stop`")
            if self.library.current_id() != record.base:
                raise LibraryError(f"the library moved to {self.library.current_id()} while "
                                   f"canary {record.id} was prepared on {record.base}",
                                   hint="the learner evolves again against the new version")
            payload = json.dumps(record.to_dict(), indent=1, ensure_ascii=False, default=str)
            atomic_write(self.canary_path, payload.encode("utf-8"),
                         tmp_dir=self.library.root / ".tmp", durable=self.library.durable)
            self._append(step)

    def end_canary(self, canary_id: str, step: Step, *, fence: Fence = _no_fence) -> bool:
        """End the canary ``canary_id`` (a no-op, False, when it is not the one running) and
        log ``step``."""
        with self._locked(fence):
            running = self.canary()
            if running is None and self.canary_path.exists():
                running_id: str | None = canary_id  # a damaged record: remove it all the same
            else:
                running_id = running.id if running is not None else None
            if running_id != canary_id:
                return False
            self.canary_path.unlink(missing_ok=True)
            self._append(step)
            return True

    def log_step(self, step: Step, *, fence: Fence = _no_fence) -> None:
        """Log a step that changes nothing served (an evolve the gate refused)."""
        with self._locked(fence):
            self._append(step)

    def write_status(self, status: Mapping[str, Any]) -> None:
        """The learner's state for people and ``/metrics`` (not fenced: nothing decides on
        it; not fsynced: a lost write is replaced at the next poll)."""
        make_dirs(self.dir, durable=False)
        data = {**dict(status), "written": time.time()}
        # Its own temp folder: this write takes no lock, and a writer holding the lock
        # empties the library's .tmp/.
        atomic_write(self.status_path, json.dumps(data, indent=1, default=str).encode("utf-8"),
                     tmp_dir=self.dir / ".tmp", durable=False)


__all__ = ["LEARNING_DIR", "STEPS", "CanaryRecord", "Fence", "LearningState", "Step"]
