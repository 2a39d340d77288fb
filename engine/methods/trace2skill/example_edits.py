"""Trace2Skill's worked examples: the analysts add, replace and retire examples of a skill.

With ``examples=true`` a skill keeps ``references/examples.md`` (``whetstone.skills.format``'s examples
format). The example text is never written by an analyst: it is taken by code from a run the
scorer verifies (``whetstone.engine.evaluation.verified_examples``), so it is the model's own output, exactly, under
its trace id. The analysts only choose, with an optional ``examples`` list in their JSON reply:

    {"action": "add", "trace": "<id>"}                 keep this run as an example
    {"action": "replace", "trace": "<id>", "replaces": "<example id>"}
    {"action": "retire", "trace": "<example id>"}      the example misleads: drop it
    {"action": "skip", "trace": "<id>"}                do not keep this run

Small analysts slip, so a reply is repaired where its meaning is plain (synonyms such as
"keep" or "remove", "this" or a run's number in a batch for its trace id, ``replaces`` given as
``old``) and otherwise dropped, each counted. A verified run that no analyst skipped is added by
default while the skill has room (``max_examples``); past that, a new one enters only by an
explicit ``replace``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....skills.format import (
    EXAMPLES_FILE,
    MAX_REFERENCE_LINES,
    Example,
    count_lines,
    parse_examples,
    render_examples,
)
from ...errors import WhetstoneError
from ...replies import extract_json_object
from . import PROMPTS

_ACTIONS = {"add": "add", "keep": "add", "include": "add", "new": "add",
            "replace": "replace", "swap": "replace", "update": "replace",
            "retire": "retire", "remove": "retire", "delete": "retire", "drop": "retire",
            "skip": "skip", "none": "skip", "ignore": "skip"}
_SELF = {"", "this", "current", "this run", "this trace", "the run"}
_INTRO = ("Worked examples from this model's own runs, each verified by the scorer and kept "
          "under the id of its trace. Solve new tasks the same way.")


@dataclass(frozen=True)
class ExampleAction:
    """One analyst's choice about an example (``explicit``: said by an analyst, not a
    default)."""

    action: str
    trace: str
    replaces: str | None = None
    explicit: bool = True


@dataclass
class ExampleReport:
    """What the analysts proposed about examples and what became of it."""

    proposed: int = 0
    repaired: int = 0
    dropped: int = 0
    added: list[str] = field(default_factory=list)
    replaced: list[list[str]] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    edits_dropped: int = 0  # analyst edits aimed at the examples file (code writes it)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"proposed": self.proposed, "repaired": self.repaired, "dropped": self.dropped,
                "added": self.added, "replaced": self.replaced, "retired": self.retired,
                "skipped": self.skipped, "edits_dropped": self.edits_dropped,
                "errors": self.errors[:20]}


def listing(files: Mapping[str, str]) -> str:
    """The prompt block that shows an analyst the skill's current examples."""
    current = parse_examples(files.get(EXAMPLES_FILE, ""))[0]
    lines = [PROMPTS.render("examples.yaml#entry", id=ex.trace_id,
                            task=ex.task[:160]) for ex in current]
    return PROMPTS.render("examples.yaml#block",
                          examples="\n".join(lines) or PROMPTS.render(
                             "examples.yaml#none"))


def _trace_id(value: Any, batch: Sequence[str], known: set[str]) -> tuple[str | None, bool]:
    """The trace id ``value`` names and whether it had to be repaired."""
    text = str(value if value is not None else "").strip().strip("\"'`").removeprefix("trace ")
    if text in batch or text in known:
        return text, False
    if text.lower() in _SELF and len(batch) == 1:
        return batch[0], True
    if text.isdigit() and 1 <= int(text) <= len(batch):
        return batch[int(text) - 1], True  # a batch's runs are numbered from 1 in the prompt
    return None, False


def actions_from_reply(raw: str, batch: Sequence[str], existing: Sequence[str],
                       report: ExampleReport) -> list[ExampleAction]:
    """The example actions in an analyst's reply (none when it has no JSON or no
    ``examples``), repaired or dropped and counted in ``report``."""
    try:
        obj = extract_json_object(raw, what="a JSON object")
    except WhetstoneError:
        return []
    items = obj.get("examples") if isinstance(obj, Mapping) else None
    if isinstance(items, Mapping):
        items = [items]
        report.repaired += 1
    if not isinstance(items, list):
        return []
    known = set(existing)
    out: list[ExampleAction] = []
    for item in items:
        report.proposed += 1
        repaired = False
        if isinstance(item, str):  # a bare action word: about the run analysed
            item, repaired = {"action": item}, True
        if not isinstance(item, Mapping):
            report.dropped += 1
            report.errors.append(f"not an object: {item!r}"[:200])
            continue
        action = _ACTIONS.get(str(item.get("action") or item.get("op") or "").strip().lower())
        trace, fixed = _trace_id(item.get("trace", item.get("id")), batch, known)
        old_raw = item.get("replaces", item.get("old"))
        old, old_fixed = _trace_id(old_raw, (), known) if old_raw is not None else (None, False)
        problem = None
        if action is None:
            problem = f"unknown action {item.get('action')!r}"
        elif trace is None:
            problem = f"unknown trace {item.get('trace')!r}"
        elif action == "retire" and trace not in known:
            problem = f"no example {trace!r} to retire"
        elif action in ("add", "replace", "skip") and trace not in batch:
            problem = f"run {trace!r} was not analysed here"
        elif action == "replace" and old is None:
            problem = f"replace needs an existing example in 'replaces', got {old_raw!r}"
        if problem:
            report.dropped += 1
            report.errors.append(problem)
            continue
        assert action is not None and trace is not None
        if repaired or fixed or old_fixed or (item.get("old") is not None
                                              and "replaces" not in item):
            report.repaired += 1
        out.append(ExampleAction(action, trace, old))
    return out


def apply_examples(files: Mapping[str, str], actions: Sequence[ExampleAction],
                   runs: Mapping[str, Example], *, max_examples: int,
                   report: ExampleReport) -> dict[str, str]:
    """``files`` with the examples file updated: retire, replace, then add (explicit adds
    first, then the defaults) while there is room. Only runs in ``runs`` (the verified ones)
    can enter; an add of any other run is dropped and counted."""
    current = parse_examples(files.get(EXAMPLES_FILE, ""))[0]
    skips = {a.trace for a in actions if a.action == "skip"}
    report.skipped += sorted(skips)
    for a in actions:
        if a.action in ("add", "replace") and a.trace not in runs:
            report.dropped += 1
            report.errors.append(f"run {a.trace} is not a verified success: not an example")
    for a in actions:
        if a.action == "retire" and any(ex.trace_id == a.trace for ex in current):
            current = [ex for ex in current if ex.trace_id != a.trace]
            report.retired.append(a.trace)
        elif a.action == "replace" and a.trace in runs and a.trace not in skips:
            at = next((i for i, ex in enumerate(current) if ex.trace_id == a.replaces), None)
            if at is not None and all(ex.task != runs[a.trace].task for ex in current):
                current[at] = runs[a.trace]
                report.replaced.append([str(a.replaces), a.trace])
    adds = [a.trace for a in actions if a.action == "add" and a.explicit] + \
        [a.trace for a in actions if a.action == "add" and not a.explicit]
    for tid in dict.fromkeys(adds):
        if tid in skips or tid not in runs or len(current) >= max_examples:
            continue
        if all(ex.trace_id != tid and ex.task != runs[tid].task for ex in current):
            current.append(runs[tid])
            report.added.append(tid)
    out = dict(files)
    if not current:
        out.pop(EXAMPLES_FILE, None)
        return out
    text = render_examples(current, intro=_INTRO)
    while count_lines(text) > MAX_REFERENCE_LINES and len(current) > 1:
        gone = current.pop()  # the newest goes first: the file stays a reference file
        if gone.trace_id in report.added:
            report.added.remove(gone.trace_id)
        text = render_examples(current, intro=_INTRO)
    if count_lines(text) <= MAX_REFERENCE_LINES:
        out[EXAMPLES_FILE] = text
    return out


def default_adds(runs: Mapping[str, Example]) -> list[ExampleAction]:
    """Every verified run analysed, as an add nobody asked for (used while there is room)."""
    return [ExampleAction("add", tid, explicit=False) for tid in runs]


__all__ = ["ExampleAction", "ExampleReport", "actions_from_reply", "apply_examples",
           "default_adds", "listing"]
