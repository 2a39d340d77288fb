"""Nothing learned is a label: the lines of a patch that carry a training task's answer.

An evolver's analyst reads training runs beside their labels, and a small one copies them: a
skill distiller's 0.5B wrote "The expected answer was: silver" into a skill's pitfalls, one
item's fact, which helps no other task and can mislead all of them. A library carries the
environment's layout, its conventions and the calls that worked, never the answers.

A line *leaks* a training task's label when it holds the label as a whole value (a number
with three significant digits or more, a text of four characters or more) together with what
names that task's item (a rare span of its question: "Domtra Crest", "order 42249"), or next
to words that present an answer ("expected", "answer", "label"). A value alone is not a
leak: "Garden" in a list of category codes is the layout. A worked example may hold its own
task's label (it is that task's verified run, kept as a demonstration), never another's.

Leaking lines are dropped from text files; a structured file (YAML, JSON, Python) with a
leaking line is refused whole, since dropping a line could change what it means. What was
dropped is counted in the patch's ``details["label_leaks"]``, which the decision shows.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..methods.base import LibraryPatch

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'&.-]*[A-Za-z0-9]|[A-Za-z0-9]")
_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?![\w.]*\d)")
_ANSWER_WORDS = re.compile(r"\b(?:expected|answer(?:ed)?|label|correct(?:ly)?|ground[- ]truth)\b",
                           re.IGNORECASE)
_EXAMPLE_HEAD = re.compile(r"^## Example ")
_TASK_LINE = re.compile(r"^Task: (.*)$")
TEXT_SUFFIXES = (".md", ".txt")


@dataclass(frozen=True)
class Labelled:
    """A training task as the check reads it: its question, its label, and the spans that
    name its item."""

    question: str
    label: str
    keys: tuple[str, ...]


@dataclass
class Leaks:
    """What ``drop_label_leaks`` took out: lines by file, files refused whole, and a few of
    the lines (clipped) for the person reading the decision."""

    lines: Counter[str] = field(default_factory=Counter)
    refused: list[str] = field(default_factory=list)
    shown: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.lines.values())

    def to_dict(self) -> dict[str, Any]:
        return {"lines_dropped": self.total, "by_file": dict(self.lines),
                "files_refused": list(self.refused), "examples": list(self.shown)}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def distinctive(label: str) -> bool:
    """Whether finding ``label`` in a line means it was copied: a number with three
    significant digits or more, a text of four characters or more (not a bare yes/no)."""
    text = label.strip()
    value = _number(text)
    if value is not None:
        return len(re.sub(r"\D", "", f"{abs(value):.6f}").strip("0")) >= 3
    return len(text) >= 4 and text.casefold() not in {"true", "false", "none", "null"}


def holds(line: str, label: str) -> bool:
    """Whether ``line`` holds ``label`` as a whole value. A label inside a name (a status
    "placed" in the column ``placed_day``) is the layout: ``_`` joins it as a letter does."""
    value = _number(label.strip())
    if value is not None:
        return any(_number(m.group()) == value for m in _NUMBER.finditer(line))
    words = label.split()
    pattern = r"(?<![A-Za-z0-9_])" + r"\s+".join(map(re.escape, words)) + r"(?![A-Za-z0-9_])"
    return re.search(pattern, line, re.IGNORECASE) is not None


def labelled_tasks(pairs: Iterable[tuple[str, Any]]) -> list[Labelled]:
    """``(question, label)`` pairs with their item spans: the words of a question that few
    of the questions share (fewer than 2% of them, and fewer than 4)."""
    items = [(q, str(lab)) for q, lab in pairs if lab is not None and str(lab).strip()]
    counts: Counter[str] = Counter()
    for q, _ in items:
        counts.update({w.casefold() for w in _WORD.findall(q)})
    cut = max(4.0, 0.02 * len(items))
    out: list[Labelled] = []
    for q, lab in items:
        if not distinctive(lab):
            continue
        keys = tuple(dict.fromkeys(w for w in _WORD.findall(q)
                                   if counts[w.casefold()] < cut and len(w) >= 3
                                   and w.casefold() != lab.casefold()))
        out.append(Labelled(" ".join(q.split()), lab, keys))
    return out


def _called_with(line: str, key: str) -> bool:
    """Whether ``key`` stands in ``line`` as a quoted value inside an object or a call written
    out (``f(x="Dorsal")``, ``{"item": "Dorsal"}``): a call, or the record a call returned."""
    quoted = rf"""\\?["']{re.escape(key)}\\?["']"""  # JSON inside JSON escapes its quotes
    return re.search(r"[{(][^{}()]*" + quoted, line, re.IGNORECASE) is not None


def _leak(line: str, tasks: Sequence[Labelled], own: str | None) -> Labelled | None:
    for t in tasks:
        if own is not None and t.question == own:
            continue
        if not holds(line, t.label):
            continue
        if _ANSWER_WORDS.search(line):
            return t
        named = [k for k in t.keys if holds(line, k)]
        # A verified call and its result (the calls that worked) is what a library keeps;
        # the item's fact stated in prose is not.
        if named and not all(_called_with(line, k) for k in named):
            return t
    return None


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "…"


def drop_label_leaks(patch: LibraryPatch, tasks: Sequence[Labelled]) -> tuple[LibraryPatch,
                                                                                Leaks]:
    """``patch`` without the lines that leak a training label (see the module docstring),
    and what was taken out."""
    leaks = Leaks()
    if not tasks:
        return patch, leaks
    changes: dict[str, Any] = {}
    for path, text in patch.changes.items():
        if not isinstance(text, str):
            changes[path] = text
            continue
        kept: list[str] = []
        own: str | None = None  # the task of the worked example the line belongs to
        refused = False
        for line in text.split("\n"):
            if _EXAMPLE_HEAD.match(line):
                own = None
            elif (m := _TASK_LINE.match(line)) and own is None:
                own = " ".join(m.group(1).split())
                # The example's own question, as it was asked: not something learned. It may
                # hold another task's label as a word ("placed" in "When was order 43073
                # placed? Answer as ..."); dropping it would break the example.
                kept.append(line)
                continue
            hit = _leak(line, tasks, own)
            if hit is None:
                kept.append(line)
                continue
            leaks.lines[path] += 1
            if len(leaks.shown) < 5:
                leaks.shown.append(f"{path}: {_clip(line)} (the label of: {_clip(hit.question, 80)})")
            if not path.endswith(TEXT_SUFFIXES):
                refused = True
        if refused:
            leaks.refused.append(path)
            continue
        changes[path] = "\n".join(kept)
    if not leaks.total:
        return patch, leaks
    details: Mapping[str, Any] = {**dict(patch.details), "label_leaks": leaks.to_dict()}
    return replace(patch, changes=changes, details=details), leaks


__all__ = ["Labelled", "Leaks", "distinctive", "drop_label_leaks", "holds", "labelled_tasks"]
