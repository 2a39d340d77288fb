"""Step rubrics: the ``Rubric`` record, reading a generator's rubric, rendering it for the agent
and reading a check of a proposed step against it.

A rubric is 3-5 lines ``N. [weight] concrete verifiable condition``; weights are normalised to
sum to 1. Small models slip (no weights, percentages, bullets, six lines, a line that asks for a
search already tried): each slip is repaired and named with a code, and a reply with no usable
line is a ``ParseError`` carrying the raw reply. A check of a proposed step against the rubric
is JSON ``{scores, weighted_score, pass, feedback}``; the weighted score is recomputed from the
per-condition scores when they are given (small models add badly), and ``pass`` is
``weighted_score >= threshold``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ...backends.base import Backend
from ...errors import ParseError
from ...replies import extract_json_object
from ...types import JsonRecord, Request
from ..analyst import AnalystStats, ask_parsed_sync
from . import PROMPTS

T = TypeVar("T")
Phase = Literal["early", "mid", "late"]

MAX_LINES = 5
MIN_LINES = 3
# Small models run on past the fifth line, repeating it: stop them there.
STOP_AFTER_LINES = ("\n6.", "\n6)")
_WEIGHTED = re.compile(
    r"^\s*(?:\d+\s*[.):]|[-*\u2022])?\s*\**\s*[\[(]\s*(\d*\.?\d+)\s*(%?)\s*[\])]\s*\**\s*"
    r"[:.\-\u2013]?\s*(.*\S)\s*$")
_NUMBERED = re.compile(r"^\s*\d+\s*[.)]\s+(.*\S)\s*$")
_WEIGHT_ONLY = re.compile(r"[\[(]\s*\d*\.?\d+\s*%?\s*[\])]")
_QUOTED = re.compile(r"[\"\u201c`]([^\"\u201c\u201d`]{3,})[\"\u201d`]")
_RUBRIC_HINT = "write 3 to 5 lines like '1. [0.4] <condition>', weights summing to 1"
_CHECK_HINT = ('reply with one JSON object: {"scores": [1, 0, ...], "weighted_score": 0.5, '
               '"pass": false, "feedback": "..."}')


@dataclass(frozen=True)
class Rubric(JsonRecord):
    """A step rubric: weighted conditions for the next decision whose weights sum to 1."""

    lines: tuple[tuple[float, str], ...]
    phase: Phase = "early"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Rubric:
        return cls(
            lines=tuple((float(w), str(c)) for w, c in d["lines"]),
            phase=d.get("phase", "early"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"lines": [[w, c] for w, c in self.lines], "phase": self.phase}


def phase_of(steps_used: int, horizon: int) -> Phase:
    """Early in the first third of the step horizon, mid in the second, late in the last."""
    frac = steps_used / max(1, horizon)
    return "early" if frac < 1 / 3 else "mid" if frac < 2 / 3 else "late"


@dataclass(frozen=True)
class ParsedRubric:
    """A rubric read from a reply, and the repairs it needed (codes)."""

    rubric: Rubric
    repairs: tuple[str, ...] = ()


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _clean(condition: str) -> str:
    return condition.strip().strip("*_").strip()


def _repeats(condition: str, tried: frozenset[str]) -> bool:
    """The line quotes, word for word, a query already tried."""
    return any(_norm(q) in tried for q in _QUOTED.findall(condition))


def parse_rubric(text: str, *, phase: Phase = "early", tried: Iterable[str] = (),
                 max_lines: int = MAX_LINES) -> ParsedRubric:
    """The rubric in a generator's reply; ``ParseError`` (with the raw reply) when no line is
    usable. ``tried``: queries already made; a line quoting one is dropped."""
    items: list[tuple[float | None, str]] = []
    repairs: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        weight: float | None
        if m := _WEIGHTED.match(line):
            weight, condition = float(m.group(1)), _clean(m.group(3))
            if m.group(2):
                weight /= 100.0
        elif m := _NUMBERED.match(line):
            weight, condition = None, _clean(m.group(1))
        else:
            continue
        # An empty line after its weight, or the prompt's own "<condition>" echoed back.
        if len(condition) < 3 or _WEIGHT_ONLY.fullmatch(condition) or (
                condition.startswith("<") and condition.endswith(">")):
            continue
        if _norm(condition) in seen:
            repairs.append("duplicate")
            continue
        seen.add(_norm(condition))
        items.append((weight, condition))
    if not items:
        raise ParseError("the reply holds no rubric line", text, hint=_RUBRIC_HINT)
    tried_set = frozenset(_norm(q) for q in tried if len(q.strip()) >= 3)
    kept = [(w, c) for w, c in items if not _repeats(c, tried_set)]
    if len(kept) < len(items):
        repairs.append("repeat")
    if not kept:
        raise ParseError("every rubric line asks for a query already tried", text,
                         hint="write conditions for a step not taken yet")
    return ParsedRubric(_weighted(kept, phase, repairs, max_lines), tuple(repairs))


def _weighted(items: list[tuple[float | None, str]], phase: Phase, repairs: list[str],
              max_lines: int) -> Rubric:
    given = [w for w, _ in items if w is not None and w > 0]
    if len(given) < len(items):
        repairs.append("weights_filled")
        fill = sum(given) / len(given) if given else 1.0
        items = [(w if w is not None and w > 0 else fill, c) for w, c in items]
    weighted = [(float(w or 0.0), c) for w, c in items]
    if len(weighted) > max_lines:
        repairs.append("truncated")
        heaviest = sorted(range(len(weighted)), key=lambda i: -weighted[i][0])[:max_lines]
        weighted = [weighted[i] for i in sorted(heaviest)]
    if len(weighted) < MIN_LINES:
        repairs.append("short")
    total = sum(w for w, _ in weighted)
    if abs(total - 1.0) > 0.02:
        repairs.append("renormalised")
    return Rubric(lines=tuple((w / total, c) for w, c in weighted), phase=phase)


def render_rubric(rubric: Rubric) -> str:
    """The rubric as the agent reads it before its next decision."""
    lines = "\n".join(
        PROMPTS.render("parts.yaml#rubric_line", number=i, weight=f"{w:.2f}", condition=c)
        for i, (w, c) in enumerate(rubric.lines, 1))
    return PROMPTS.render("parts.yaml#guidance", heading=PROMPTS.load(
        "parts.yaml#guidance_heading"), phase=rubric.phase, lines=lines)


def rubric_in_request(request: Request) -> Rubric | None:
    """The rubric ``render_rubric`` put in the request's last message, read back (the action
    checker sees only the request), or None when there is none."""
    if not request.messages:
        return None
    text = request.messages[-1].text
    at = text.rfind(PROMPTS.load("parts.yaml#guidance_heading"))
    if at < 0:
        return None
    head, _, rest = text[at:].partition("\n")
    phase = next((p for p in ("early", "mid", "late") if f"({p} " in head), "early")
    block = rest.split("\n\n", 1)[0]
    try:
        return parse_rubric(block, phase=phase).rubric  # type: ignore[arg-type]
    except ParseError:
        return None


@dataclass(frozen=True)
class ActionCheck:
    """A proposed step scored against a rubric."""

    score: float
    passed: bool
    feedback: str = ""
    scores: tuple[float, ...] = ()
    repairs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"score": round(self.score, 4), "pass": self.passed, "feedback": self.feedback,
                "scores": list(self.scores), "repairs": list(self.repairs)}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        word = value.strip().lower().rstrip("%")
        if word in ("yes", "true", "met"):
            return 1.0
        if word in ("no", "false", "not met"):
            return 0.0
        try:
            return float(word)
        except ValueError:
            return None
    return None


def _scores(raw: Any, n: int) -> list[float] | None:
    if not isinstance(raw, list) or len(raw) != n:
        return None
    values = [_number(v) for v in raw]
    if any(v is None for v in values):
        return None
    return [min(1.0, max(0.0, v)) for v in values if v is not None]


def parse_check(text: str, rubric: Rubric, threshold: float) -> ActionCheck:
    """A checker's JSON verdict on a proposed step; ``ParseError`` when it has no score."""
    obj = extract_json_object(text, what="a JSON check", hint=_CHECK_HINT)
    if not isinstance(obj, Mapping):
        raise ParseError("the check is not a JSON object", text, hint=_CHECK_HINT)
    repairs: list[str] = []
    weights = [w for w, _ in rubric.lines]
    scores = _scores(obj.get("scores"), len(weights))
    given = _number(obj.get("weighted_score"))
    if given is not None and 1.0 < given <= 100.0:
        given /= 100.0
        repairs.append("percent_score")
    if scores is not None:
        score = sum(w * s for w, s in zip(weights, scores, strict=True))
        if given is not None and abs(given - score) > 0.05:
            repairs.append("score_recomputed")
    elif given is not None:
        if obj.get("scores") is not None:
            repairs.append("scores_ignored")
        score = min(1.0, max(0.0, given))
    elif isinstance(obj.get("pass"), bool):
        score = 1.0 if obj["pass"] else 0.0
        repairs.append("score_from_pass")
    else:
        raise ParseError("the check has no scores, weighted_score or pass", text,
                         hint=_CHECK_HINT)
    passed = score >= threshold - 1e-9
    if isinstance(obj.get("pass"), bool) and obj["pass"] != passed:
        repairs.append("pass_recomputed")
    return ActionCheck(score, passed, str(obj.get("feedback") or "").strip(),
                       tuple(scores or ()), tuple(repairs))


def ask(backend: Backend, prompt: str, parse: Callable[[str], T], *, max_tokens: int,
        temperature: float, seed: int | None, stop: tuple[str, ...] = ()
        ) -> tuple[T | None, AnalystStats, str]:
    """Ask ``backend`` once with ``prompt`` (synchronously: graph nodes are plain functions)
    through the analysts' loop (``analyst.ask_parsed_sync``: one retry showing the error,
    then the drop is counted). Never raises for a bad reply or a failed call: (value or None,
    costs, last raw reply)."""
    reply = ask_parsed_sync(backend, [{"role": "user", "content": prompt}], parse,
                            temperature=temperature, max_tokens=max_tokens, seed=seed,
                            stop=stop)
    return reply.value, reply.stats, reply.raw


def tried_queries(calls: Sequence[tuple[str, Any]]) -> list[str]:
    """The text values of tried calls' arguments (a search's query, a calculator's
    expression): what a rubric line must not ask for again."""
    out: list[str] = []
    for _, args in calls:
        values = args.values() if isinstance(args, Mapping) else [args]
        out += [v for v in values if isinstance(v, str) and v.strip()]
    return out
