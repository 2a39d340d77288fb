"""NLPG's policy memory and its bounded update.

The memory is ``{module: [PolicyNote, ...]}``, each list in priority order (the runtime shows
notes from the front and trims from the back). One update step of one module applies
operations in order and refuses any past the bound:

    ADD     a new note (route, text); a text that restates a note folds into AGREE on it
    EDIT    new wording for a note (its id and counters stay)
    AGREE   a correction restates the note: it moves to the front
    REMOVE  the note goes (retired, wrong, redundant, or to make room)

At most ``max_ops`` operations per module per step, and never more than ``budget`` tokens of
note text per module: an ADD or EDIT that would cross it is refused. Counters are not
operations: ``helpful``/``harmful`` change with the uses later traces report (see
``whetstone.engine.methods.nlpg``), and a note with ``harmful > helpful`` is retired by a REMOVE.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .notes import (
    MAX_NOTE_CHARS,
    ROUTE_RE,
    PolicyNote,
    module_of,
    policy_path,
    read_policy,
    render_policy,
)

OpKind = Literal["ADD", "EDIT", "AGREE", "REMOVE"]
OP_KINDS: tuple[OpKind, ...] = ("ADD", "EDIT", "AGREE", "REMOVE")
TokenCount = Callable[[str], int]
Memory = dict[str, list[PolicyNote]]
DUPLICATE_SIMILARITY = 0.6  # word-set Jaccard at which two notes say the same thing


def estimate_tokens(text: str) -> int:
    """A model-free token estimate (4 characters a token), for when no tokenizer is at hand."""
    return max(1, len(text) // 4) if text else 0


def note_tokens(notes: Iterable[PolicyNote], count: TokenCount) -> int:
    """Tokens of note text a module's prompt would show for ``notes``."""
    return sum(count(n.text) for n in notes)


_STOP = frozenset(("a", "an", "the", "to", "of", "and", "or", "you", "your", "it", "its", "is",
                   "are", "be", "in", "on", "for", "with", "that", "this", "then"))


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _words(text: str) -> set[str]:
    """Content words, crudely stemmed: "answering" and "answers" are "answer"."""
    return {_stem(w) for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of the two texts' word sets (1.0: same words)."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return float(a.strip().lower() == b.strip().lower())
    return len(wa & wb) / len(wa | wb)


def clean_text(text: str) -> str:
    """A note's text as stored: one line, no list bullet, no surrounding quotes."""
    text = " ".join(str(text).split())
    text = re.sub(r"^(?:[-*•]\s+|\d+[.)]\s+)", "", text)
    return text.strip().strip('"').strip()


def routes_overlap(a: str, b: str) -> bool:
    return a == b or "*" in (a, b)


def find_duplicate(notes: Sequence[PolicyNote], text: str, route: str, *,
                   skip: str | None = None) -> PolicyNote | None:
    """The note (on an overlapping route) that says what ``text`` says, if any."""
    best, best_sim = None, DUPLICATE_SIMILARITY
    for n in notes:
        if n.id == skip or not routes_overlap(n.route, route):
            continue
        sim = similarity(n.text, text)
        if sim >= best_sim:
            best, best_sim = n, sim
    return best


def new_note_id(module: str, route: str, text: str, taken: Iterable[str]) -> str:
    """A stable id for a new note (a hash of what it says), unique among ``taken``."""
    used = set(taken)
    digest = hashlib.sha256(f"{module}|{route}|{text}".encode()).hexdigest()
    for width in range(6, len(digest)):
        candidate = "n" + digest[:width]
        if candidate not in used:
            return candidate
    raise AssertionError("unreachable: a sha256 prefix always becomes unique")


@dataclass(frozen=True)
class Op:
    """One operation on one module's notes (``id``: the note; for ADD, set once applied)."""

    kind: OpKind
    id: str = ""
    route: str = "*"
    text: str = ""
    reason: str = ""
    support: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"op": self.kind, "id": self.id}
        if self.kind in ("ADD", "EDIT"):
            d["text"] = self.text
        if self.kind == "ADD":
            d["route"] = self.route
        if self.reason:
            d["reason"] = self.reason
        if self.support:
            d["support"] = round(self.support, 4)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Op:
        return cls(kind=d["op"], id=d.get("id", ""), route=d.get("route", "*"),
                   text=d.get("text", ""), reason=d.get("reason", ""),
                   support=float(d.get("support", 0.0)))


@dataclass
class ApplyReport:
    """What one module's update did: the operations applied, and why others were refused."""

    applied: list[Op] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    tokens_before: int = 0
    tokens_after: int = 0
    notes_after: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"ops": [o.to_dict() for o in self.applied], "refused": dict(self.refused),
                "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
                "notes": self.notes_after}


def _index(notes: Sequence[PolicyNote], note_id: str) -> int:
    return next((i for i, n in enumerate(notes) if n.id == note_id), -1)


def _valid_text(text: str) -> bool:
    return 0 < len(text) <= MAX_NOTE_CHARS


class _Update:
    """Applies one module's operations in order, within the bound and the budget."""

    def __init__(self, module: str, notes: Sequence[PolicyNote], *, max_ops: int,
                 budget: int, count: TokenCount) -> None:
        self.module, self.notes = module, list(notes)
        self.max_ops, self.budget, self.count = max_ops, budget, count
        self.report = ApplyReport(tokens_before=note_tokens(self.notes, count))
        self.agreed: set[str] = set()

    def tokens(self) -> int:
        return note_tokens(self.notes, self.count)

    def refuse(self, why: str) -> None:
        self.report.refused[why] += 1

    def run(self, ops: Iterable[Op]) -> None:
        for op in ops:
            if len(self.report.applied) >= self.max_ops:
                self.refuse("over_ops")
                continue
            getattr(self, f"_{op.kind.lower()}")(op)

    def _remove(self, op: Op) -> None:
        i = _index(self.notes, op.id)
        if i < 0:
            return self.refuse("unknown_id")
        del self.notes[i]
        self.report.applied.append(op)

    def _agree(self, op: Op) -> None:
        i = _index(self.notes, op.id)
        if i < 0:
            return self.refuse("unknown_id")
        if op.id in self.agreed:
            return self.refuse("duplicate")
        self.agreed.add(op.id)
        self.notes.insert(0, self.notes.pop(i))
        self.report.applied.append(op)

    def _edit(self, op: Op) -> None:
        i = _index(self.notes, op.id)
        text = clean_text(op.text)
        if i < 0:
            return self.refuse("unknown_id")
        if not _valid_text(text):
            return self.refuse("invalid")
        if find_duplicate(self.notes, text, self.notes[i].route, skip=op.id) is not None:
            return self.refuse("duplicate")
        edited = replace(self.notes[i], text=text)
        if self.tokens() - self.count(self.notes[i].text) + self.count(text) > self.budget:
            return self.refuse("over_budget")
        self.notes[i] = edited
        self.report.applied.append(replace(op, text=text))

    def _add(self, op: Op) -> None:
        text, route = clean_text(op.text), op.route or "*"
        if not _valid_text(text) or not ROUTE_RE.match(route):
            return self.refuse("invalid")
        same = find_duplicate(self.notes, text, route)
        if same is not None:  # fold: the correction restates a note we have
            if same.id in self.agreed:
                return self.refuse("duplicate")
            return self._agree(Op("AGREE", id=same.id, reason="folded", support=op.support))
        if self.tokens() + self.count(text) > self.budget:
            return self.refuse("over_budget")
        note_id = new_note_id(self.module, route, text, (n.id for n in self.notes))
        self.notes.append(PolicyNote(id=note_id, module=self.module, text=text, route=route))
        self.report.applied.append(replace(op, id=note_id, text=text, route=route))


def apply_ops(module: str, notes: Sequence[PolicyNote], ops: Iterable[Op], *, max_ops: int,
              budget: int, count: TokenCount) -> tuple[list[PolicyNote], ApplyReport]:
    """``notes`` after ``ops`` (in order), at most ``max_ops`` of them and never over
    ``budget`` tokens; the report lists what was applied and counts what was refused.

    Notes already over the budget (hand edits, a lowered budget) are first trimmed, lowest
    value first: those REMOVEs count as operations, and the budget wins over the bound when
    more than ``max_ops`` must go (``refused["trim_past_bound"]`` counts them).
    """
    update = _Update(module, notes, max_ops=max_ops, budget=budget, count=count)
    for victim in eviction_order(update.notes):
        if update.tokens() <= budget:
            break
        if len(update.report.applied) >= max_ops:
            update.refuse("trim_past_bound")
            del update.notes[_index(update.notes, victim.id)]
        else:
            update._remove(Op("REMOVE", id=victim.id, reason="over budget"))
    update.run(ops)
    update.report.tokens_after = update.tokens()
    update.report.notes_after = len(update.notes)
    return update.notes, update.report


def value(note: PolicyNote) -> int:
    return note.helpful - note.harmful


def eviction_order(notes: Sequence[PolicyNote]) -> list[PolicyNote]:
    """Notes in the order they go when room is needed: lowest value, then furthest back."""
    ranked = sorted(enumerate(notes), key=lambda iv: (value(iv[1]), -iv[0]))
    return [n for _, n in ranked]


def retire_ops(notes: Sequence[PolicyNote]) -> list[Op]:
    """A REMOVE for every note that hurt more often than it helped, worst first."""
    return [Op("REMOVE", id=n.id, reason="retired") for n in eviction_order(notes)
            if n.harmful > n.helpful]


def count_uses(memory: Mapping[str, Sequence[PolicyNote]], helpful: Counter[tuple[str, str]],
               harmful: Counter[tuple[str, str]]) -> Memory:
    """The memory with use counts added (keys ``(module, note id)``; unknown notes ignored)."""
    out: Memory = {}
    for module, notes in memory.items():
        out[module] = [replace(n, helpful=n.helpful + helpful[(module, n.id)],
                               harmful=n.harmful + harmful[(module, n.id)]) for n in notes]
    return out


def memory_from_files(files: Mapping[str, str]) -> tuple[Memory, int]:
    """The memory held by ``{policies/<module>.md: text}``, and how many malformed lines
    were skipped (a commit validates them, but a library may come from elsewhere)."""
    memory: Memory = {}
    malformed = 0
    for path, text in sorted(files.items()):
        module = module_of(path)
        if module is None:
            malformed += 1
            continue
        notes, problems = read_policy(text, module, path=path)
        memory[module] = notes
        malformed += len(problems)
    return memory, malformed


def memory_changes(before: Mapping[str, Sequence[PolicyNote]],
                   after: Mapping[str, Sequence[PolicyNote]]) -> dict[str, str | None]:
    """The library changes that turn ``before`` into ``after``: a module whose notes changed
    is rewritten, one left without notes is deleted."""
    changes: dict[str, str | None] = {}
    for module in sorted(set(before) | set(after)):
        old, new = list(before.get(module, ())), list(after.get(module, ()))
        if old == new:
            continue
        if new:
            changes[policy_path(module)] = render_policy(module, new)
        elif module in before:
            changes[policy_path(module)] = None
    return changes


def memory_to_dict(memory: Mapping[str, Sequence[PolicyNote]]) -> dict[str, list[dict[str, Any]]]:
    return {m: [n.to_dict() for n in notes] for m, notes in memory.items()}


def memory_from_dict(data: Mapping[str, Sequence[Mapping[str, Any]]]) -> Memory:
    return {m: [PolicyNote.from_dict(n) for n in notes] for m, notes in data.items()}


def rules_curator(notes: Sequence[PolicyNote], groups: Sequence[Any], *, max_ops: int,
                  budget: int, count: TokenCount) -> list[Op]:
    """Operations without an analyst: AGREE on a note a correction restates, else ADD the
    correction, making room by removing the least valuable unproven notes (value <= 0) when
    the budget is full. ``groups`` are ``CorrectionGroup``s, best supported first."""
    ops: list[Op] = []
    live = list(notes)
    agreed: set[str] = set()
    used = note_tokens(live, count)
    for g in groups:
        if len(ops) >= max_ops:
            break
        same = find_duplicate(live, g.text, g.route)
        if same is not None:
            if same.id and same.id not in agreed:  # "": a note this step adds already
                agreed.add(same.id)
                ops.append(Op("AGREE", id=same.id, reason="restated", support=g.support))
            continue
        need = count(clean_text(g.text))
        over = used + need - budget
        room: list[PolicyNote] = []
        for victim in eviction_order(live):
            if over <= 0:
                break
            if value(victim) <= 0 and victim.id and victim.id not in agreed:
                room.append(victim)
                over -= count(victim.text)
        if over > 0 or len(ops) + len(room) + 1 > max_ops:
            continue
        for victim in room:
            live.remove(victim)
            used -= count(victim.text)
            ops.append(Op("REMOVE", id=victim.id, reason="room"))
        used += need
        live.append(PolicyNote(id="", module="", text=clean_text(g.text), route=g.route))
        ops.append(Op("ADD", route=g.route, text=g.text, reason="correction",
                      support=g.support))
    return ops
