"""NLPG's backward pass: outcome feedback walked from the last module of a trace to the first.

A trace's steps are module visits. The visits that came from a model call (``think``, and the
steps a method's node records, of a kind of its own: a step rubric, a check of the answer)
are the *learnable* ones: their module has a prompt that policy notes can change. The others
(the runtime's ``act`` running a tool, ``prepare``) are code; what they did is shown to the
analyst as what happened after the visit before them.

For a scored trace the walk starts at the last learnable visit with the outcome feedback
(score, expected answer, answer, how the run ended) and a weight (1 - score). Each visit asks
the analyst for the visit's share of the blame, a correction for that module on that route,
the notes that misled it, and *upstream*: the feedback the visit before it receives, rewritten
by the analyst (TextGrad-style), never the raw outcome. The visit's correction weighs
``weight * blame``; the weight passed upstream is ``weight * (1 - blame)``. The walk stops at
the first visit, after ``max_visits``, when upstream is empty, or when the weight left is
below ``min_weight``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...backends.base import Backend
from ...errors import ParseError
from ...replies import extract_json_object
from ...types import RUNTIME_STEP_KINDS, Step, Trace
from ..analyst import AnalystStats, ask_parsed
from . import PROMPTS
from .memory import DUPLICATE_SIMILARITY, clean_text, similarity
from .notes import PolicyNote

CORRECTION_CHARS = 300
UPSTREAM_CHARS = 800
_BLAME_WORDS = {"none": 0.0, "no": 0.0, "low": 0.25, "little": 0.25, "some": 0.5,
                "medium": 0.5, "moderate": 0.5, "partial": 0.5, "high": 0.75, "most": 0.75,
                "all": 1.0, "full": 1.0, "total": 1.0}
_ALIASES = {"blame": ("share", "responsibility"), "correction": ("rule", "note", "fix"),
            "upstream": ("feedback", "critique", "upstream_feedback"),
            "misleading_notes": ("misleading", "harmful_notes")}


def _clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _piece(kind: str, **values: Any) -> str:
    return PROMPTS.render(f"backward.yaml#{kind}", **values)


# -- visits ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Visit:
    """One learnable step of a trace, as the analyst reads it."""

    index: int
    module: str
    route: str
    input: str
    output: str
    after: str
    shown: tuple[str, ...] = ()


def shown_notes(trace: Trace) -> dict[str, list[str]]:
    """Note ids each module was shown in a run (``trace.meta["nlpg"]["shown"]``)."""
    meta = trace.meta.get("nlpg") if isinstance(trace.meta, Mapping) else None
    shown = meta.get("shown") if isinstance(meta, Mapping) else None
    if not isinstance(shown, Mapping):
        return {}
    return {str(m): [str(i) for i in ids] for m, ids in shown.items() if isinstance(ids, list)}


def from_model(step: Step) -> bool:
    """Whether ``step`` came from a model call: ``think``, or a step of a kind the runtime
    does not write (a method's node, which asks the model)."""
    return step.kind == "think" or step.kind not in RUNTIME_STEP_KINDS


def _learnable(step: Step, modules: Collection[str] | None) -> bool:
    if not from_model(step) or step.error or step.output is None:
        return False
    return modules is None or step.module in modules


def _think_input(step: Step) -> str:
    messages = (step.input or {}).get("messages") or [] if isinstance(step.input, Mapping) \
        else []
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last is None:
        return _piece("first_input")
    lines = []
    for m in messages[last + 1:]:
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)[:400]
        lines.append(_piece("message", role=m.get("role", "?"), text=_clip(text, 400)))
    return "\n".join(lines) or _piece("first_input")


def _think_output(step: Step) -> str:
    completion = (step.output or {}).get("completion") or {}
    lines = [_clip(completion.get("text") or "", 1200)] if completion.get("text") else []
    for call in completion.get("tool_calls") or []:
        fn = call.get("function", call)
        lines.append(_piece("call", name=fn.get("name"),
                            arguments=_clip(str(fn.get("arguments")), 300)))
    return "\n".join(lines) or "(empty reply)"


def _line_after(step: Step) -> str | None:
    if step.kind == "act" and isinstance(step.output, Mapping):
        obs = step.output.get("observation")
        if obs is None:
            return None
        tool = step.input.get("tool") if isinstance(step.input, Mapping) else "?"
        return _piece("tool", tool=tool, observation=_clip(str(obs), 300))
    if step.kind == "observe":
        return _piece("unparseable", error=_clip(step.error or "", 200))
    if from_model(step):
        return _piece("checked", module=step.module, output=_clip(json.dumps(
            step.output, default=str), 300))
    return None


def visits_of(trace: Trace, modules: Collection[str] | None = None) -> list[Visit]:
    """The learnable visits of a trace, in run order (``modules``: only these)."""
    shown = shown_notes(trace)
    marks = [i for i, s in enumerate(trace.steps) if _learnable(s, modules)]
    out = []
    for n, i in enumerate(marks):  # n: the visit's place, i: its step's
        step = trace.steps[i]
        end = marks[n + 1] if n + 1 < len(marks) else len(trace.steps)
        # (The last visit's feedback is the outcome, which already holds the answer.)
        after = [line for s in trace.steps[i + 1:end] if (line := _line_after(s))]
        if step.kind == "think":
            seen, made = _think_input(step), _think_output(step)
        else:
            seen = _clip(json.dumps(step.input, default=str), 800)
            made = _clip(json.dumps(step.output, default=str), 800)
        ids = step.meta.get("policy_notes") if isinstance(step.meta, Mapping) else None
        own = tuple(str(x) for x in ids) if isinstance(ids, list) else \
            tuple(shown.get(step.module, ()))
        out.append(Visit(index=i, module=step.module, route=step.route or "*", input=seen,
                         output=made, after="\n".join(after) or _piece("nothing_after"),
                         shown=own))
    return out


def outcome_feedback(trace: Trace, expected: str | None, success: bool) -> str:
    """The feedback the walk starts from: the scored outcome of the whole run."""
    answer = "(none)" if trace.answer is None else _clip(trace.answer, 300)
    score = "n/a" if trace.score is None else f"{trace.score:g}"
    if success:
        return _piece("outcome_passed", score=score, answer=answer)
    return _piece("outcome_failed", score=score, expected=_clip(expected or "(unknown)", 300),
                  answer=answer, outcome=trace.outcome,
                  reason=str(trace.meta.get("reason") or trace.outcome))


# -- the analyst's reply -----------------------------------------------------------------------


@dataclass(frozen=True)
class BlameReply:
    """One visit's verdict, after repairs (``repairs`` names each one made)."""

    blame: float
    correction: str
    upstream: str
    misleading: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()


def _blame(value: Any, repairs: list[str]) -> float | None:
    if isinstance(value, bool):
        repairs.append("blame was true/false")
        return float(value)
    if isinstance(value, str):
        word = value.strip().lower().rstrip("%")
        if word in _BLAME_WORDS:
            repairs.append("blame was a word")
            return _BLAME_WORDS[word]
        try:
            number = float(word)
        except ValueError:
            return None
        repairs.append("blame was text")
        value = number / 100 if value.strip().endswith("%") else number
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    if 1 < value <= 100:
        repairs.append("blame was a percentage")
        return float(value) / 100
    if not 0 <= value <= 1:
        repairs.append("blame out of [0, 1]")
        return min(1.0, max(0.0, float(value)))
    return float(value)


def _text(value: Any, limit: int, name: str, repairs: list[str]) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        repairs.append(f"{name} was a list")
        value = "; ".join(str(v) for v in value if v)
    elif not isinstance(value, str):
        repairs.append(f"{name} was not text")
        value = json.dumps(value) if isinstance(value, Mapping) else str(value)
    text = clean_text(value)
    if len(text) > limit:
        repairs.append(f"{name} too long")
        text = _clip(text, limit)
    return text


def parse_blame(raw: str, shown: Collection[str] = ()) -> BlameReply:
    """The analyst's verdict on one visit; ``ParseError`` (with the raw reply) when it holds
    no JSON object or none of the fields. Small slips are repaired and named."""
    data = extract_json_object(raw, what="a verdict object",
                               hint='reply with {"blame": 0.5, "correction": "...", '
                                    '"upstream": "...", "misleading_notes": []}')
    if not isinstance(data, Mapping):
        raise ParseError("the verdict is not a JSON object", raw)
    repairs: list[str] = []
    fields: dict[str, Any] = {}
    for key, aliases in _ALIASES.items():
        if key in data:
            fields[key] = data[key]
            continue
        alias = next((a for a in aliases if a in data), None)
        if alias is not None:
            repairs.append(f"{alias} read as {key}")
            fields[key] = data[alias]
    if not fields:
        raise ParseError("the verdict has none of blame, correction, upstream", raw,
                         hint='reply with {"blame": 0.5, "correction": "...", "upstream": '
                              '"...", "misleading_notes": []}')
    correction = _text(fields.get("correction"), CORRECTION_CHARS, "correction", repairs)
    upstream = _text(fields.get("upstream"), UPSTREAM_CHARS, "upstream", repairs)
    blame = _blame(fields.get("blame"), repairs) if "blame" in fields else None
    if blame is None:
        repairs.append("blame missing or unreadable")
        blame = 0.5 if correction else 0.0
    ids = fields.get("misleading_notes") or []
    if not isinstance(ids, list):
        repairs.append("misleading_notes was not a list")
        ids = [ids]
    known = [str(i).strip("[] ") for i in ids if str(i).strip("[] ") in shown]
    if len(known) < len(ids):
        repairs.append("misleading_notes named notes not shown")
    return BlameReply(blame, correction, upstream, tuple(dict.fromkeys(known)), tuple(repairs))


# -- the walk ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """A local correction for one module on one route, weighted by its share of the blame."""

    module: str
    route: str
    text: str
    weight: float
    trace_id: str


@dataclass
class Walk:
    """One trace's backward pass: its corrections, the notes blamed, what each visit said."""

    trace_id: str
    success: bool
    corrections: list[Correction] = field(default_factory=list)
    misleading: list[tuple[str, str]] = field(default_factory=list)  # (module, note id)
    visits: list[dict[str, Any]] = field(default_factory=list)
    stats: AnalystStats = field(default_factory=AnalystStats)
    repairs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"trace_id": self.trace_id, "success": self.success,
                "corrections": [c.__dict__ for c in self.corrections],
                "misleading": [list(m) for m in self.misleading], "visits": self.visits,
                "stats": self.stats.to_dict(),
                "repairs": self.repairs}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Walk:
        s = d.get("stats") or {}
        stats = AnalystStats(calls=s.get("calls", 0), retries=s.get("retries", 0),
                             dropped=s.get("dropped", 0),
                             prompt_tokens=s.get("prompt_tokens", 0),
                             completion_tokens=s.get("completion_tokens", 0),
                             seconds=s.get("seconds", 0.0), errors=list(s.get("errors") or []))
        return cls(trace_id=d["trace_id"], success=bool(d["success"]),
                   corrections=[Correction(**c) for c in d.get("corrections") or []],
                   misleading=[(m[0], m[1]) for m in d.get("misleading") or []],
                   visits=list(d.get("visits") or []), stats=stats,
                   repairs=int(d.get("repairs", 0)))


@dataclass(frozen=True)
class WalkSettings:
    """How far a walk goes and how the analyst is asked."""

    max_visits: int = 3
    min_weight: float = 0.1
    temperature: float = 0.3
    max_tokens: int = 512
    modules: frozenset[str] | None = None


def _notes_text(ids: Sequence[str], notes: Mapping[str, PolicyNote]) -> str:
    lines = [_piece("note", id=i, text=notes[i].text) for i in ids if i in notes]
    return "\n".join(lines) or _piece("no_notes")


def visit_messages(trace: Trace, visit: Visit, feedback: str,
                   notes: Mapping[str, PolicyNote]) -> list[dict[str, str]]:
    """The analyst's prompt for one visit, given the feedback from downstream."""
    user = PROMPTS.render("backward", task=_clip(trace.task, 1500), module=visit.module,
                          route=visit.route, notes=_notes_text(visit.shown, notes),
                          input=visit.input, output=visit.output, after=visit.after,
                          feedback=feedback)
    return [{"role": "system", "content": PROMPTS.load("backward_system")},
            {"role": "user", "content": user}]


async def walk_trace(trace: Trace, analyst: Backend, memory: Mapping[str, Sequence[PolicyNote]],
                     *, expected: str | None, success: bool, settings: WalkSettings,
                     seed: int = 0) -> Walk:
    """The backward pass over one scored trace (see the module docstring)."""
    walk = Walk(trace_id=trace.id, success=success)
    visits = visits_of(trace, settings.modules)
    if success:
        visits = visits[-1:]  # a success teaches through the step that answered
    feedback = outcome_feedback(trace, expected, success)
    weight = 1.0 if success else 1.0 - max(0.0, min(1.0, trace.score or 0.0))
    for n, visit in enumerate(reversed(visits[-settings.max_visits:])):
        notes = {note.id: note for note in memory.get(visit.module, ())}
        shown = [i for i in visit.shown if i in notes]
        reply = await ask_parsed(
            analyst, visit_messages(trace, visit, feedback, notes),
            functools.partial(parse_blame, shown=tuple(shown)),
            temperature=settings.temperature, max_tokens=settings.max_tokens, seed=seed + n)
        walk.stats.add(reply.stats)
        if reply.value is None:  # dropped and counted: no feedback to pass further up
            walk.visits.append({"module": visit.module, "route": visit.route,
                                "dropped": True})
            break
        verdict = reply.value
        walk.repairs += len(verdict.repairs)
        share = weight * verdict.blame
        walk.visits.append({"module": visit.module, "route": visit.route,
                            "blame": round(verdict.blame, 4), "weight": round(share, 4),
                            "feedback": feedback[:300]})
        if verdict.correction and share > 0:
            walk.corrections.append(Correction(visit.module, visit.route, verdict.correction,
                                               share, trace.id))
        if not success:
            walk.misleading += [(visit.module, i) for i in verdict.misleading]
        weight *= 1.0 - verdict.blame
        feedback = verdict.upstream
        if success or not feedback or weight < settings.min_weight:
            break
    return walk


# -- aggregation -------------------------------------------------------------------------------


@dataclass
class CorrectionGroup:
    """Corrections for one (module, route) that say the same thing, folded: the best
    supported wording, the summed weight (``support``) and the traces behind it."""

    module: str
    route: str
    text: str
    support: float
    traces: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "route": self.route, "text": self.text,
                "support": round(self.support, 4), "traces": self.traces}


def aggregate(corrections: Sequence[Correction]) -> dict[str, list[CorrectionGroup]]:
    """Corrections per module, folded per (module, route) by meaning, best supported first."""
    groups: list[CorrectionGroup] = []
    for c in sorted(corrections, key=lambda c: -c.weight):
        for g in groups:
            if (g.module, g.route) == (c.module, c.route) and \
                    similarity(g.text, c.text) >= DUPLICATE_SIMILARITY:
                g.support += c.weight
                if c.trace_id not in g.traces:
                    g.traces.append(c.trace_id)
                break
        else:
            groups.append(CorrectionGroup(c.module, c.route, c.text, c.weight, [c.trace_id]))
    out: dict[str, list[CorrectionGroup]] = {}
    for g in sorted(groups, key=lambda g: (-g.support, -len(g.traces))):
        out.setdefault(g.module, []).append(g)
    return out
