"""From one run's calls that worked to a workflow: the task's own values become slots.

Agent Workflow Memory's induction step, done by rule instead of by an analyst: a span of the
question that stands in a call's arguments becomes a slot (the question's other words, which
most questions of a task set share, stay text), a value a later call took from an earlier
call's result becomes a slot read from that result, and the question with its slots marked is
a pattern that reads them from the next question of the same kind. Nothing of the run's answer
is kept: a workflow whose calls still hold its own answer is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .records import (
    SLOT_RE,
    CallStep,
    Selector,
    Slot,
    Workflow,
    placeholders,
)
from .values import holds, learn_selector, one_path, supports

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'&./-]*[A-Za-z0-9]|[A-Za-z0-9]")
_STOP = frozenset((
    "a", "an", "the", "of", "in", "on", "at", "to", "for", "by", "with", "from", "and", "or",
    "is", "are", "was", "were", "be", "been", "do", "does", "did", "how", "what", "which",
    "who", "whom", "whose", "when", "where", "why", "many", "much", "it", "its", "this",
    "that", "these", "those", "there", "their", "they", "them", "has", "have", "had", "as",
    "per", "each", "all", "any", "our", "your", "my", "me", "i", "we", "you", "he", "she",
    "his", "her", "not", "no", "yes", "than", "then", "into", "over", "under", "about",
))
MAX_SPAN_WORDS = 8


@dataclass(frozen=True)
class CallRecord:
    """One tool call of a run and its result, as the evolver reads them from a trace."""

    tool: str
    arguments: Mapping[str, Any]
    result: str


class Wording:
    """How often each span of words stands in the questions of a task set. A span many
    questions share is wording ("how much does", "cost"); a span few share is a value ("Amber
    Kettle", "ledger", "10442"). Counting whole spans, not single words, matters: the words of
    made-up names repeat across many names ("Amber" in 8 of 48 products), the names do not."""

    def __init__(self, questions: Iterable[str], share: float = 0.02, floor: int = 4) -> None:
        self.questions = [" ".join(q.split()).casefold() for q in questions]
        self.cut = max(floor, share * len(self.questions))
        self._counts: dict[str, int] = {}

    def count(self, span: str) -> int:
        key = " ".join(span.split()).casefold()
        if key not in self._counts:
            pattern = re.compile(r"(?<![a-z0-9])" + re.escape(key) + r"(?![a-z0-9])")
            self._counts[key] = sum(1 for q in self.questions if pattern.search(q))
        return self._counts[key]

    def is_value(self, span: str, question: str) -> bool:
        """Whether ``span`` (of ``question``) is a value rather than wording: rare among the
        questions, or written as a name (capitalised after the first word, quoted, or with a
        digit) and not in a tenth of them."""
        words = [w.casefold() for w in _WORD.findall(span)]
        if not words or all(w in _STOP for w in words):
            return False
        n = self.count(span)
        if n < self.cut:
            return True
        at = question.find(span)
        named = any(c.isdigit() for c in span) or (at > 0 and span[:1].isupper()) or \
            (at > 0 and question[at - 1:at] in "'\"" and question[at + len(span):][:1] in "'\"")
        return named and n < 0.1 * len(self.questions)


    def values_in(self, question: str) -> list[str]:
        """What ``question`` names, before any call is known: runs of words that are rare
        among the questions, written as names (capitalised after the first word) or holding
        a digit (and not in a tenth of the questions)."""
        words = list(_WORD.finditer(question))
        marks = []
        for i, w in enumerate(words):
            text = w.group()
            n = self.count(text)
            after_stop = i > 0 and question[:w.start()].rstrip()[-1:] in ".?!:"
            named = (i > 0 and not after_stop and text[:1].isupper()) or \
                any(c.isdigit() for c in text)
            marks.append(text.casefold() not in _STOP and (
                n < self.cut or (named and n < 0.1 * len(self.questions))))
        spans: list[str] = []
        i = 0
        while i < len(words):
            if not marks[i]:
                i += 1
                continue
            j = i
            while j + 1 < len(words) and marks[j + 1] and \
                    not question[words[j].end():words[j + 1].start()].strip():
                j += 1
            span = question[words[i].start():words[j].end()]
            spans.append(re.sub(r"['’]s\Z", "", span))  # "Corwa Lonter's" names Corwa Lonter
            i = j + 1
        return spans


def _boundaried(text: str, span: str) -> list[int]:
    pattern = r"(?<![A-Za-z0-9])" + re.escape(span) + r"(?![A-Za-z0-9])"
    return [m.start() for m in re.finditer(pattern, text, re.IGNORECASE)]


def question_spans(question: str, arguments: Sequence[str], wording: Wording) -> list[str]:
    """The spans of ``question`` (whole words, longest first, not overlapping) that stand in
    one of ``arguments`` as whole words and are values, not wording (``Wording``)."""
    words = list(_WORD.finditer(question))
    taken = [False] * len(words)
    found: list[str] = []
    for size in range(min(MAX_SPAN_WORDS, len(words)), 0, -1):
        for i in range(len(words) - size + 1):
            if any(taken[i:i + size]):
                continue
            span = question[words[i].start():words[i + size - 1].end()]
            # "Corwa Lonter's role": the name is "Corwa Lonter" (the possessive is wording).
            span = re.sub(r"['’]s\Z", "", span)
            if len(span) < 2 or not any(_boundaried(a, span) for a in arguments):
                continue
            if not wording.is_value(span, question):
                continue
            found.append(span)
            for j in range(i, i + size):
                taken[j] = True
    return found


def _slot_name(args: Sequence[str], span: str, used: set[str]) -> str:
    """A name for the slot that ``span`` fills, from what stands before it in the arguments:
    ``title = 'X'`` -> ``title``, ``services/X/`` -> ``services``; ``value`` otherwise."""
    name = ""
    # Named where it is first used: a later call's path may hold a value before it (the
    # folder a search found), which is no name.
    first = next((a for a in args if _boundaried(a, span)), "")
    for at in _boundaried(first, span):
        m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\W{0,6}\Z", first[:at])
        if m:
            name = m.group(1).lower()
            break
    name = re.sub(r"[^a-z0-9_]", "_", name).strip("_")
    if not name or not SLOT_RE.fullmatch(name) or name in {"select", "from", "where", "and",
                                                           "or", "like", "is", "in"}:
        name = "value"
    base, i = name, 2
    while name in used:
        name, i = f"{base}{i}", i + 1
    used.add(name)
    return name


def _replace(text: str, span: str, slot: str) -> str:
    pattern = r"(?<![A-Za-z0-9])" + re.escape(span) + r"(?![A-Za-z0-9])"
    return re.sub(pattern, lambda _: "{" + slot + "}", text, flags=re.IGNORECASE)


def _strings(arguments: Mapping[str, Any]) -> list[str]:
    return [v for v in arguments.values() if isinstance(v, str)]


def _pieces(text: str) -> list[str]:
    """Value-like pieces of an argument: quoted strings, path segments, words."""
    out = re.findall(r"'([^']{1,80})'|\"([^\"]{1,80})\"", text)
    pieces = [a or b for a, b in out]
    pieces += [p for p in re.split(r"[/\\]", text) if p]
    pieces += [p for p in re.split(r"[/\\.,;:=()\s'\"]+", text) if p]
    pieces += _WORD.findall(text)
    # A one-character piece only when it is quoted or a number written once (a status code
    # 2): "a" or the 1 of a LIMIT 1 would otherwise link to any result.
    once = {p for p in re.findall(r"(?<![\w.])\d(?![\w.])", text)
            if len(re.findall(rf"(?<![\w.]){p}(?![\w.])", text)) == 1}
    return list(dict.fromkeys(p.strip() for p in pieces if len(p.strip()) >= 2
                              or p.strip() in once or (p in [a or b for a, b in out]
                                                        and p.strip())))


def _path_prefix(result: str, value: str) -> str:
    """The start of ``value`` that is the path ``result`` holds (a search's one hit), or the
    end of it from a folder on (``services/media/relay`` of ``/srv/tree/services/media/relay``,
    as the server reads a path relative to its folder); "" when none is. The workflow then
    reads the whole path from the result: the folder it sits in is the result's to say."""
    line = one_path(result)
    for k in range(len(line)):
        tail = line[k:]
        if (k and line[k - 1] != "/") or "/" not in tail.strip("/"):
            continue
        if value.startswith(tail) and value[len(tail):len(tail) + 1] in ("", "/"):
            return tail
    return ""


def induce(question: str, calls: Sequence[CallRecord], answer: Any, wording: Wording
           ) -> Workflow | None:
    """The workflow ``calls`` (a run's calls up to the one whose result held ``answer``)
    make for ``question``; None when nothing generalises (no call takes anything from the
    question), the answer cannot be read back from the last result, or a call holds the
    answer itself."""
    if not calls:
        return None
    last = calls[-1]
    selector = learn_selector(last.result, answer)
    if selector is None:
        return None
    # The calls that lead to the last one: those whose result a later call took a value from.
    all_args = [a for c in calls for a in _strings(c.arguments)]
    spans = question_spans(question, all_args, wording)
    used: set[str] = set()
    slots: list[Slot] = []
    names: dict[str, str] = {}
    for span in spans:
        names[span] = _slot_name(all_args, span, used)
        slots.append(Slot(names[span], example=span))
    steps: list[CallStep] = []
    # Calls that depend on the task (they take a slot); only their results feed later calls:
    # what a look around returned (a list of tables) is the same for every question.
    dependent: set[int] = set()
    for i, call in enumerate(calls):
        args: dict[str, Any] = {}
        for key, value in call.arguments.items():
            if isinstance(value, str):
                for j in sorted(dependent):  # a path an earlier call found, gone on from
                    tail = _path_prefix(calls[j].result, value)
                    if tail:
                        name = next(n for n in ("path", *(f"path{i}" for i in range(2, 99)))
                                    if n not in used)
                        used.add(name)
                        slots.append(Slot(name, example=calls[j].result.strip(), from_step=j,
                                          select=Selector("whole")))
                        value = "{" + name + "}" + value[len(tail):]
                        break
                for span in spans:
                    value = _replace(value, span, names[span])
                # A value this call took from an earlier call's result.
                for j in sorted(dependent):
                    for piece in _pieces(value):
                        if placeholders(piece) or "{" in piece:
                            continue
                        sel = learn_selector(calls[j].result, piece)
                        if sel is None or sel.kind == "whole" and len(piece) > 60:
                            continue
                        if any(supports(piece, sp) for sp in spans):
                            continue
                        name = _slot_name([value], piece, used)
                        slots.append(Slot(name, example=piece, from_step=j, select=sel))
                        value = _replace(value, piece, name)
            args[key] = value
        if any(placeholders(v) for v in _strings(args)):
            dependent.add(i)
        steps.append(CallStep(call.tool, args))
    # Drop leading calls nothing later reads from (a look around before the call that worked).
    needed = {len(steps) - 1}
    for s in slots:
        if s.from_step is not None:
            needed.add(s.from_step)
    keep = sorted(needed)
    if keep != list(range(len(steps))):
        remap = {old: new for new, old in enumerate(keep)}
        steps = [steps[i] for i in keep]
        slots = [s if s.from_step is None else Slot(s.name, s.example, remap[s.from_step],
                                                    s.select) for s in slots
                 if s.from_step is None or s.from_step in remap]
    used_names = {n for st in steps for v in _strings(st.arguments) for n in placeholders(v)}
    slots = [s for s in slots if s.name in used_names]
    if not any(s.from_step is None for s in slots):
        return None  # the same call for every question: nothing of this task in it
    if any(holds(v, answer) is not None for st in steps for v in _strings(st.arguments)):
        return None  # the call holds its own answer: a lucky or leaked call, not a workflow
    pattern = question
    for span in spans:
        if names[span] in used_names:
            pattern = _replace(pattern, span, names[span])
    return Workflow(name="", description="", slots=tuple(slots), steps=tuple(steps),
                    answer=selector if isinstance(selector, Selector) else Selector(),
                    patterns=(" ".join(pattern.split()),))


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A pattern as a regex over questions: its text up to case, spacing and the final
    punctuation; each ``{slot}`` a named group."""
    parts = re.split(r"\{(" + SLOT_RE.pattern + r")\}", pattern.strip().rstrip("?.!"))
    out: list[str] = []
    seen: set[str] = set()
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"(?P={part})" if part in seen else f"(?P<{part}>.+?)")
            seen.add(part)
        else:
            out.append(r"\s+".join(re.escape(w) for w in part.split()) if part.strip() else "")
            if part[:1].isspace() and out[-1]:
                out[-1] = r"\s*" + out[-1]
            if part[-1:].isspace() and out[-1]:
                out[-1] = out[-1] + r"\s*"
            if not part.strip() and part:
                out[-1] = r"\s+"
    return re.compile(r"\s*" + "".join(out) + r"\s*[?.!]*\s*\Z", re.IGNORECASE | re.DOTALL)


def read_slots(patterns: Sequence[str], question: str) -> dict[str, str] | None:
    """The slot values the first matching pattern reads from ``question``; None when no
    pattern matches."""
    for p in patterns:
        m = pattern_regex(p).match(question)
        if m:
            return {k: v.strip().strip("'\"") for k, v in m.groupdict().items()}
    return None


def name_for(workflow: Workflow, taken: set[str], others: Sequence[str] = ()) -> str:
    """A tool name: what the answer is read as (its key: ``price``) or else the words of the
    workflow's pattern that the ``others`` patterns do not all share, then the slots it takes
    (``price_of_title``); unique among ``taken``."""
    slots = [s.name for s in workflow.task_slots]
    if workflow.answer.kind == "key" and workflow.answer.key:
        head = [workflow.answer.key.casefold()]
    else:
        pattern = workflow.patterns[0] if workflow.patterns else ""
        shared = set.intersection(*(set(_WORD.findall(o.casefold())) for o in others)) \
            if len(others) > 1 else set()
        head = [w.casefold() for w in _WORD.findall(re.sub(r"\{[^}]*\}", " ", pattern))
                if w.casefold() not in _STOP and w.isalpha() and w.casefold() not in shared][:2]
    base = "_".join(head) or "lookup"
    if slots:
        base += "_of_" + "_".join(slots[:2])
    base = re.sub(r"[^a-z0-9_]+", "_", base.lower()).strip("_")[:40] or "lookup"
    base = base if base[:1].isalpha() else f"w_{base}"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


__all__ = ["CallRecord", "Wording", "induce", "name_for", "pattern_regex",
           "question_spans", "read_slots"]
